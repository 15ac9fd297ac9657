"""The JSON form of a bench report (``attnforge bench --json``), validated by ``schema/bench.schema.json``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from importlib import metadata, resources
from typing import Any

from attnforge import _serde
from attnforge.bench.run import BenchCell, BenchReport, BenchRow
from attnforge.catalog import Catalog
from attnforge.probe.backends import installed_distribution
from attnforge.types.shapes import AttentionShape, Feature, Mode, current_head_keys
from attnforge.verify.device import DeviceInfo

SCHEMA_RESOURCE = "schema/bench.schema.json"
#: the bench document's own version (overrides the envelope's): 2 added rounds, spread, margin, ties, classes;
#: 3 renamed the shape's ``heads``/``kv_heads`` to ``heads_q``/``heads_kv`` (:func:`shape_from_json` reads both)
SCHEMA_VERSION = 3


def report_json(report: BenchReport) -> dict[str, Any]:
    """The ``--json`` payload (``emit_json`` adds ``kind``; ``schema_version`` is :data:`SCHEMA_VERSION`)."""
    dev = report.device
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": report.run_id,
        "created_at": report.created_at,
        "device": device_json(dev),
        "baseline": report.baseline,
        "flops_formula": report.flops_formula,
        "timing": {"method": report.timing.method.value, "warmup_ms": report.timing.warmup_ms,
                   "rep_ms": report.timing.rep_ms, "min_reps": report.timing.min_reps,
                   "max_reps": report.timing.max_reps, "rounds": report.timing.rounds},
        "backends": [{"name": b.name, "version": b.version, "verified": b.verified} for b in report.backends],
        "rows": [_row_json(r) for r in report.rows],
    }


def _row_json(row: BenchRow) -> dict[str, Any]:
    s, ranking = row.shape, row.ranking
    return {
        "shape": {"batch": s.batch, "heads_q": s.heads_q, "heads_kv": s.heads_kv, "head_dim": s.head_dim,
                  "head_dim_v": s.dv, "seqlen_q": s.seqlen_q, "seqlen_k": s.seqlen_k, "causal": s.causal,
                  "mode": s.mode.value, "dtype": s.dtype, "features": sorted(f.value for f in s.features)},
        "shape_class": str(s.shape_class),
        "flops": row.flops,
        "best": ranking.winner,
        "margin": _num(ranking.margin),
        "tied": list(ranking.tied) if len(ranking.tied) > 1 else [],
        "cells": [_cell_json(c) for c in row.cells],
    }


def shape_from_json(doc: Mapping[str, Any]) -> AttentionShape:
    """The shape of one recorded ``bench --json`` row (its ``"shape"`` object), of any schema version.

    Schema 1-2 documents (``docs/data/``) name the head counts ``heads``/``kv_heads``; 3 names them
    ``heads_q``/``heads_kv``; both read through :func:`attnforge.types.shapes.current_head_keys`.

    Raises:
        ValueError: a size, the mode or a feature is missing or not of the schema's kind.
    """
    d = current_head_keys(doc)
    try:
        head_dim = int(d["head_dim"])
        dv = int(d.get("head_dim_v") or head_dim)
        return AttentionShape(batch=int(d["batch"]), heads_q=int(d["heads_q"]), heads_kv=int(d["heads_kv"]),
                              head_dim=head_dim, head_dim_v=None if dv == head_dim else dv,
                              seqlen_q=int(d["seqlen_q"]), seqlen_k=int(d["seqlen_k"]), causal=bool(d["causal"]),
                              mode=Mode(d["mode"]), dtype=str(d["dtype"]),
                              features=frozenset(Feature(f) for f in d.get("features", ())))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a bench shape: {dict(doc)!r} (missing or bad {exc})") from None


def device_json(dev: DeviceInfo) -> dict[str, Any]:
    """The device as JSON (shared by ``bench --json`` and ``verify --json``)."""
    cc = list(dev.compute_capability) if dev.compute_capability else None
    return {"type": dev.type.value, "name": dev.name, "torch_version": dev.torch_version, "key": dev.key,
            "compute_capability": cc}


def _cell_json(cell: BenchCell) -> dict[str, Any]:
    t = cell.timing
    return {
        "backend": cell.backend, "status": cell.status.value, "detail": cell.detail, "ms": _num(cell.ms),
        "tflops": _num(cell.tflops), "ratio_to_baseline": _num(cell.ratio_to_baseline),
        "peak_mem_bytes": cell.peak_mem_bytes,
        "first_call_s": _num(t.first_call_s) if t else None,
        "p20_ms": _num(t.p20_ms) if t else None, "p80_ms": _num(t.p80_ms) if t else None,
        "reps": t.reps if t else None, "input_sets": t.input_sets if t else None,
        "rounds_ms": list(t.rounds_ms) if t else [], "lo_ms": _num(t.lo_ms) if t else None,
        "hi_ms": _num(t.hi_ms) if t else None, "rel_l1": _num(e.rel_l1) if (e := cell.error) else None,
        "cosine": _num(e.cosine) if e else None,
    }


def _num(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def load_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the ``--json`` document, shipped with the package."""
    text = resources.files("attnforge.bench").joinpath(SCHEMA_RESOURCE).read_text(encoding="utf-8")
    schema: dict[str, Any] = _serde.loads(text)
    return schema


def backend_versions(names: list[str], catalog: Catalog) -> dict[str, str | None]:
    """name -> installed version: torch's for built-ins (SDPA, FlexAttention), else the distribution's."""
    try:
        torch_version: str | None = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    out: dict[str, str | None] = {}
    for name in names:
        entry = catalog.backends.get(name)
        if entry is None or entry.builtin:
            out[name] = torch_version  # the SDPA fallback and built-ins ship with torch
            continue
        found = installed_distribution(entry)
        out[name] = found[1] if found else None
    return out
