"""Bench results as stored records (the question asked of them, "which is fastest?", is :mod:`attnforge.ranking`)."""

from __future__ import annotations

from attnforge.bench.run import BenchReport, CellStatus
from attnforge.records import BenchRecord


def to_records(report: BenchReport) -> list[BenchRecord]:
    """One :class:`~attnforge.records.BenchRecord` per measured cell (skipped/failed cells are not kept)."""
    versions = {b.name: b.version for b in report.backends}
    out: list[BenchRecord] = []
    for row in report.rows:
        for cell in row.cells:
            if cell.status is not CellStatus.OK or cell.ms is None or cell.tflops is None:
                continue
            out.append(BenchRecord.measured(
                row.shape, device_key=report.device.key, backend=cell.backend,
                backend_version=versions.get(cell.backend), ms=cell.ms, tflops=cell.tflops,
                peak_mem_bytes=cell.peak_mem_bytes, run_id=report.run_id, created_at=report.created_at,
                timing=cell.timing, error=cell.error))
    return out
