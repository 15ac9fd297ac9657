"""The knowledge of attnforge as data: ``catalog/data/*.toml`` and a strict loader.

Nothing is read at import time; call :func:`load_catalog`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from attnforge.catalog._check import DATA_DIR, SCHEMA_VERSION, read_checked
from attnforge.catalog.backends import Backend, parse_backends
from attnforge.catalog.recipes import GENERIC_RECIPE, Recipe, WheelGrammar, parse_recipes, parse_wheel_grammars
from attnforge.catalog.toolchain import Toolchain, parse_toolchain
from attnforge.errors import CatalogError, UsageError


@dataclass(frozen=True, slots=True, kw_only=True)
class Catalog:
    """Everything attnforge knows, loaded from one data directory."""

    backends: Mapping[str, Backend]
    toolchain: Toolchain | None = None
    recipes: Mapping[str, Recipe] = field(default_factory=dict)
    wheel_grammars: Mapping[str, WheelGrammar] = field(default_factory=dict)

    def backend(self, backend_id: str) -> Backend:
        """Look a backend up by id.

        Raises:
            UsageError: unknown id; the hint lists the known ones.
        """
        try:
            return self.backends[backend_id]
        except KeyError:
            import difflib

            close = difflib.get_close_matches(backend_id, list(self.backends), n=1)
            guess = f"did you mean {close[0]!r}? " if close else ""
            raise UsageError(
                f"unknown backend {backend_id!r}", hint=f"{guess}known backends: {', '.join(sorted(self.backends))}"
            ) from None

    def recipe(self, backend_id: str) -> Recipe | None:
        """The build recipe of a backend.

        The generic torch-extension recipe for a name the catalog does not know; None for backends built into
        torch.
        """
        if backend_id in self.recipes:
            return self.recipes[backend_id]
        if backend_id in self.backends:
            return None
        return self.recipes.get(GENERIC_RECIPE)

    def grammars_for(self, distribution: str) -> tuple[WheelGrammar, ...]:
        """The wheel label grammars of one distribution (names compared after PEP 503 normalisation)."""
        from packaging.utils import canonicalize_name

        want = canonicalize_name(distribution)
        return tuple(g for g in self.wheel_grammars.values() if canonicalize_name(g.distribution) == want)

    @property
    def tools(self) -> Toolchain:
        """The toolchain tables (always present in a catalog made by :func:`load_catalog`).

        Raises:
            CatalogError: this catalog was built without them.
        """
        if self.toolchain is None:
            raise CatalogError("this catalog has no toolchain tables", hint="load it with load_catalog()")
        return self.toolchain


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
    """Read every file, then raise once with the problems of all files (each prefixed by its file name)."""
    backends_doc, b_errors = read_checked(data_dir / "backends.toml")
    toolchain_doc, t_errors = read_checked(data_dir / "toolchain.toml")
    backends = parse_backends(backends_doc, b_errors)
    recipes = parse_recipes(backends_doc, b_errors)
    grammars = parse_wheel_grammars(backends_doc, b_errors)
    toolchain = parse_toolchain(toolchain_doc, t_errors)
    problems = tuple(f"{c.source}: {p}" for c in (b_errors, t_errors) for p in c.problems)
    if problems:
        files = sorted({c.source for c in (b_errors, t_errors) if c.problems})
        raise CatalogError(
            f"{', '.join(files)} {'has' if len(files) == 1 else 'have'} {len(problems)} bad field(s)",
            problems=problems,
            hint="fix the listed fields; each names its file and dotted path",
        )
    return Catalog(backends=backends, toolchain=toolchain, recipes=recipes, wheel_grammars=grammars)


__all__ = [
    "DATA_DIR", "SCHEMA_VERSION", "Backend", "Catalog", "CatalogError", "Recipe", "Toolchain", "WheelGrammar",
    "load_catalog",
]
