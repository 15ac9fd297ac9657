"""How close a backend must come to the float64 reference: ``catalog/data/tolerances.toml``, read strictly.

Nothing is read at import time; call :func:`load_tolerances`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnforge._compat import StrEnum
from attnforge.catalog._check import Collector, Sourced, load_file
from attnforge.catalog.backends import DTYPES
from attnforge.errors import CatalogError

_FIELDS = {"atol", "rtol", "max_rel_l1", "sources"}


class PrecisionKind(StrEnum):
    """Whether a kernel computes attention exactly (up to rounding) or on quantized inputs (SageAttention)."""

    EXACT = "exact"
    QUANTIZED = "quantized"


@dataclass(frozen=True, slots=True, kw_only=True)
class Tolerance(Sourced):
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


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchGate(Sourced):
    """``[gate.quantized]``: the error a quantized kernel may show on a shape class to be dispatched there."""

    max_rel_l1: float
    min_cosine: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Tolerances:
    """Every tolerance row, by ``(kind, dtype)``, and the dispatch gate for quantized kernels."""

    rows: Mapping[tuple[PrecisionKind, str], Tolerance]
    gate: DispatchGate | None = None

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
    return load_file("tolerances.toml", _parse, path=path, top_keys={"gate", *(k.value for k in PrecisionKind)})


def load_quantized_gate() -> DispatchGate | None:
    """The packaged ``[gate.quantized]`` (None when the file has none)."""
    return load_tolerances().gate


def _parse(doc: Mapping[str, Any], errors: Collector) -> Tolerances:
    rows = parse_tolerances(doc, errors)
    gate = None
    raw = doc.get("gate", {}).get("quantized") if isinstance(doc.get("gate"), dict) else None
    if isinstance(raw, dict):
        errors.unknown_keys(raw, {"max_rel_l1", "min_cosine", "sources"}, "gate.quantized")
        gate = DispatchGate(max_rel_l1=_positive(errors, raw, "max_rel_l1", "gate.quantized"),
                            min_cosine=_positive(errors, raw, "min_cosine", "gate.quantized"),
                            sources=errors.sources(raw, "gate.quantized"))
    return Tolerances(rows=rows, gate=gate)


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
                    kind=kind, dtype=dtype, sources=errors.sources(raw, path),
                    **values,
                )
    return out


def _positive(errors: Collector, raw: Mapping[str, Any], name: str, path: str) -> float:
    value = float(errors.get(raw, name, path, float))
    if name in raw and not (math.isfinite(value) and value > 0):
        errors.add(f"{path}.{name}", f"must be a positive finite number, got {raw[name]!r}")
    return value


__all__ = ["CatalogError", "DispatchGate", "PrecisionKind", "Tolerance", "Tolerances", "load_quantized_gate",
           "load_tolerances"]
