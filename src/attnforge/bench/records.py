"""Bench results as stored records (the question asked of them, "which is fastest?", is :mod:`attnforge.ranking`)."""

from __future__ import annotations

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
            t = cell.timing
            out.append(BenchRecord(
                device_key=report.device.key, backend=cell.backend,
                backend_version=versions.get(cell.backend), dtype=s.dtype, mode=s.mode.value, causal=s.causal,
                batch=s.batch, heads_q=s.heads_q, heads_kv=s.heads_kv, head_dim=s.head_dim, seqlen_q=s.seqlen_q,
                seqlen_k=s.seqlen_k, ms=cell.ms, tflops=cell.tflops, peak_mem_bytes=cell.peak_mem_bytes,
                run_id=report.run_id, created_at=report.created_at,
                head_dim_v=s.head_dim_v if s.dv != s.head_dim else None,
                features=",".join(sorted(f.value for f in s.features)),
                ms_lo=t.lo_ms if t else None, ms_hi=t.hi_ms if t else None,
                rel_l1=e.rel_l1 if (e := cell.error) else None, cosine=e.cosine if e else None,
                ms_mad=t.mad_ms if t else None,
            ))
    return out
