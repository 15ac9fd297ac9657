"""The knowledge of attnforge as data: ``catalog/data/*.toml`` and a strict loader.

Nothing is read at import time; call :func:`load_catalog`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from attnforge.catalog._check import Collector, read_toml
from attnforge.catalog.backends import Backend, parse_backends
from attnforge.errors import CatalogError, UsageError

DATA_DIR = Path(__file__).parent / "data"
SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Catalog:
    """Everything attnforge knows, loaded from one data directory."""

    backends: Mapping[str, Backend]

    def backend(self, backend_id: str) -> Backend:
        """Look a backend up by id.

        Raises:
            UsageError: unknown id; the hint lists the known ones.
        """
        try:
            return self.backends[backend_id]
        except KeyError:
            raise UsageError(
                f"unknown backend {backend_id!r}", hint=f"known backends: {', '.join(sorted(self.backends))}"
            ) from None


def load_catalog(data_dir: Path | None = None) -> Catalog:
    """Load and validate every data file.

    Args:
        data_dir: a directory holding the ``*.toml`` files (the packaged data when None).

    Raises:
        CatalogError: a file is missing or invalid; ``problems`` lists every bad dotted path.
    """
    if data_dir is None:
        return _packaged()
    return _load(data_dir)


@functools.cache
def _packaged() -> Catalog:
    return _load(DATA_DIR)


def _load(data_dir: Path) -> Catalog:
    doc = read_toml(data_dir / "backends.toml")
    errors = Collector("backends.toml")
    if doc.get("schema_version") != SCHEMA_VERSION:
        errors.add("schema_version", f"expected {SCHEMA_VERSION}, got {doc.get('schema_version')!r}")
    backends = parse_backends(doc, errors)
    errors.finish()
    return Catalog(backends=backends)


__all__ = ["Backend", "Catalog", "CatalogError", "load_catalog"]
