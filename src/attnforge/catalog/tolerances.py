"""How close a backend must come to the float64 reference: ``catalog/data/tolerances.toml``, read strictly.

Nothing is read at import time; call :func:`load_tolerances`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from attnforge.catalog._check import Collector, load_file
from attnforge.catalog.backends import DTYPES
from attnforge.errors import CatalogError

_FIELDS = {"atol", "rtol", "max_rel_l1", "sources"}


class PrecisionKind(StrEnum):
    """Whether a kernel computes attention exactly (up to rounding) or on quantized inputs (SageAttention)."""

    EXACT = "exact"
    QUANTIZED = "quantized"


@dataclass(frozen=True, slots=True, kw_only=True)
class Tolerance:
    """The pass rule for one precision kind and dtype (see the data file's header).

    Attributes:
        kind: exact or quantized.
        dtype: ``"float16"``, ``"bfloat16"``, ...
        atol: absolute tolerance per element.
        rtol: relative tolerance per element (``|out - ref| <= atol + rtol * |ref|``).
        max_rel_l1: bound on ``sum|out - ref| / sum|ref|`` over the whole output.
        sources: where the numbers come from.
    """

    kind: PrecisionKind
    dtype: str
    atol: float
    rtol: float
    max_rel_l1: float
    sources: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Tolerances:
    """Every tolerance row, by ``(kind, dtype)``."""

    rows: Mapping[tuple[PrecisionKind, str], Tolerance]

    def get(self, kind: PrecisionKind, dtype: str) -> Tolerance:
        """The row for ``kind`` and ``dtype``.

        Raises:
            CatalogError: the data file has no such row.
        """
        try:
            return self.rows[(kind, dtype)]
        except KeyError:
            have = ", ".join(sorted(f"{k.value}.{d}" for k, d in self.rows))
            raise CatalogError(f"no tolerance for {kind.value} {dtype} in tolerances.toml",
                               hint=f"add [{kind.value}.{dtype}]; present: {have}") from None

    def dtypes(self, kind: PrecisionKind) -> tuple[str, ...]:
        """The dtypes with a row for ``kind``, in file order."""
        return tuple(d for k, d in self.rows if k is kind)


def load_tolerances(path: Path | None = None) -> Tolerances:
    """Load and validate a tolerances file.

    Args:
        path: a TOML file in the format of ``catalog/data/tolerances.toml`` (the packaged one when None).

    Raises:
        CatalogError: the file is missing, not TOML, or has bad fields; ``problems`` names every dotted path.
    """
    return load_file("tolerances.toml", _parse, path=path, top_keys={k.value for k in PrecisionKind})


def _parse(doc: Mapping[str, Any], errors: Collector) -> Tolerances:
    return Tolerances(rows=parse_tolerances(doc, errors))


def parse_tolerances(doc: Mapping[str, Any], errors: Collector) -> dict[tuple[PrecisionKind, str], Tolerance]:
    """Read the ``[exact.*]`` and ``[quantized.*]`` tables, recording every bad field in ``errors``."""
    out: dict[tuple[PrecisionKind, str], Tolerance] = {}
    for kind in PrecisionKind:
        with errors.table(doc, kind.value, "") as tables:
            for dtype, raw in tables.items():
                path = f"{kind.value}.{dtype}"
                if dtype not in DTYPES:
                    errors.add(path, f"unknown dtype {dtype!r} (expected one of {DTYPES})")
                if not isinstance(raw, dict):
                    errors.add(path, "expected a table")
                    continue
                errors.unknown_keys(raw, _FIELDS, path)
                values = {name: _positive(errors, raw, name, path) for name in ("atol", "rtol", "max_rel_l1")}
                out[(kind, dtype)] = Tolerance(
                    kind=kind, dtype=dtype, sources=errors.str_list(raw, "sources", path, allow_empty=False),
                    **values,
                )
    return out


def _positive(errors: Collector, raw: Mapping[str, Any], name: str, path: str) -> float:
    value = float(errors.get(raw, name, path, float))
    if name in raw and not (math.isfinite(value) and value > 0):
        errors.add(f"{path}.{name}", f"must be a positive finite number, got {raw[name]!r}")
    return value


__all__ = ["CatalogError", "PrecisionKind", "Tolerance", "Tolerances", "load_tolerances"]
