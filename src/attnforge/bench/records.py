"""Bench results as stored records, and the question the dispatcher asks of them: which backend is fastest?"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from attnforge.bench.flops import Mode
from attnforge.bench.run import BenchReport, CellStatus
from attnforge.records import BenchRecord


def to_records(report: BenchReport) -> list[BenchRecord]:
    """One :class:`~attnforge.records.BenchRecord` per measured cell (skipped/failed cells are not kept)."""
    versions = {b.name: b.version for b in report.backends}
    out: list[BenchRecord] = []
    for row in report.rows:
        s = row.shape
        for cell in row.cells:
            if cell.status is not CellStatus.OK or cell.ms is None or cell.tflops is None:
                continue
            out.append(BenchRecord(
                device_key=report.device.key, backend=cell.backend,
                backend_version=versions.get(cell.backend), dtype=s.dtype, mode=s.mode.value, causal=s.causal,
                batch=s.batch, heads=s.heads, kv_heads=s.kv_heads, head_dim=s.head_dim, seqlen_q=s.seqlen_q,
                seqlen_k=s.seqlen_k, ms=cell.ms, tflops=cell.tflops, peak_mem_bytes=cell.peak_mem_bytes,
                run_id=report.run_id,
                created_at=report.created_at,
            ))
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ShapeClass:
    """What a call is matched on against bench records.

    Attributes:
        dtype: ``"bfloat16"``.
        mode: fwd, or fwd+bwd for calls that need gradients.
        causal: causal masking.
        head_dim: ``D``.
        seqlen: ``max(Sq, Sk)`` of the call; matched to the nearest measured sequence length (log scale).
    """

    dtype: str
    mode: Mode
    causal: bool
    head_dim: int
    seqlen: int


def latest(records: Iterable[BenchRecord]) -> list[BenchRecord]:
    """Keep the newest record per (backend, shape): records come oldest first, later runs override."""
    newest: dict[tuple[object, ...], BenchRecord] = {}
    for r in records:
        key = (r.backend, r.dtype, r.mode, r.causal, r.batch, r.heads, r.kv_heads, r.head_dim, r.seqlen_q,
               r.seqlen_k)
        newest.pop(key, None)
        newest[key] = r
    return list(newest.values())


def fastest_backend(records: Iterable[BenchRecord], shape: ShapeClass,
                    among: Collection[str] | None = None) -> str | None:
    """The backend with the highest TFLOP/s measured for the shape class, or None without a measurement.

    Records of the same dtype, mode and causal flag are considered; the nearest head dim is used when the
    exact one was not measured, then the nearest measured ``max(Sq, Sk)`` on a log scale, and among the
    backends measured there the fastest wins (ties: the name first in alphabetical order).

    Args:
        records: as read from :meth:`attnforge.records.RecordStore.bench_records` (oldest first).
        shape: the call's class.
        among: only these backends (e.g. the verified ones); None for all.
    """
    pool = [r for r in latest(records) if r.dtype == shape.dtype and r.mode == shape.mode.value
            and r.causal == shape.causal and (among is None or r.backend in among) and r.tflops > 0]
    if not pool:
        return None
    head_dim = min({r.head_dim for r in pool}, key=lambda d: (abs(d - shape.head_dim), d))
    pool = [r for r in pool if r.head_dim == head_dim]
    target = math.log2(max(1, shape.seqlen))
    seqlen = min({max(r.seqlen_q, r.seqlen_k) for r in pool}, key=lambda s: (abs(math.log2(s) - target), s))
    at = [r for r in pool if max(r.seqlen_q, r.seqlen_k) == seqlen]
    return max(at, key=lambda r: (r.tflops, [-ord(c) for c in r.backend])).backend
