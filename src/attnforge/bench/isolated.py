"""``attnforge bench`` with each backend in a child process (:mod:`attnforge._system.isolate`).

Each backend runs :func:`attnforge.bench.run.run_bench` one shape at a time in its own child; the parent merges
the rows and the ratios to the baseline. A backend that kills its child (a signal, an abort) or hangs gets error
cells naming the signal and the shape, and a failed verify record, so doctor shows it and the dispatcher never
picks it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from attnforge._system.isolate import portable, run_in_child
from attnforge._system.runner import Runner
from attnforge.bench.flops import shape_flops
from attnforge.bench.run import BenchCell, BenchReport, BenchRow, CellStatus, run_bench
from attnforge.bench.timing import TimingConfig
from attnforge.catalog.slim import Capabilities
from attnforge.records import VerifyRecord
from attnforge.types.shapes import AttentionShape
from attnforge.verify.device import DeviceInfo
from attnforge.verify.isolated import Isolation, child_adapter, crash_text


@dataclass(frozen=True, slots=True, kw_only=True)
class _Job:
    adapters_ref: str
    name: str
    adapter: bytes | None
    shapes: tuple[AttentionShape, ...]
    device: DeviceInfo
    timing: TimingConfig
    quantized: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class IsolatedBench:
    """The merged report and, per backend that took its child down, what happened."""

    report: BenchReport
    crashes: Mapping[str, str]


def bench_in_children(shapes: Sequence[AttentionShape], *, adapters: Mapping[str, Any], baseline: str,
                      device: DeviceInfo, timing: TimingConfig, isolation: Isolation, runner: Runner,
                      environ: Mapping[str, str],
                      versions: Mapping[str, str | None] | None = None, verified: Sequence[str] = (),
                      quantized: Sequence[str] = (), caps: Callable[[str], Capabilities | None] = lambda _: None,
                      progress: Callable[[AttentionShape, str], None] | None = None,
                      on_backend: Callable[[str, BenchReport], None] | None = None) -> IsolatedBench:
    """Bench ``names`` (baseline included) each in its own child; the report has the shape of
    :func:`run_bench`'s.

    ``on_backend`` gets, as soon as each backend's child is done, its name and a report of the same run (run id, device,
    timing) holding only that backend's cells, without ratios: the caller can keep them before the next backend
    starts, so an interrupted bench (Ctrl-C, SIGTERM: the :class:`KeyboardInterrupt` propagates, the running
    child is killed) loses only the backend it was measuring.
    """
    names = list(adapters)
    cells: dict[str, list[BenchCell]] = {}
    crashes: dict[str, str] = {}
    shell = run_bench([], adapters=dict.fromkeys(names), baseline=baseline, device=device,  # type: ignore[arg-type]
                      timing=timing, versions=versions, verified=verified)
    for name in names:
        if progress is not None and shapes:
            progress(shapes[0], name)
        outside = _outside(shapes, caps(name))
        inside = tuple(s for i, s in enumerate(shapes) if i not in outside)
        job = _Job(adapters_ref=isolation.adapters_ref, name=name, adapter=portable(adapters[name]),
                   shapes=inside, device=device, timing=timing, quantized=tuple(quantized))
        got = run_in_child("attnforge.bench.isolated:child_rows", job, runner=runner, python=isolation.python,
                           env=environ, timeout_s=isolation.timeout_s)
        done: list[BenchCell] = [c for c in got.items if isinstance(c, BenchCell)]
        if got.failure is not None:
            shape = got.current if isinstance(got.current, AttentionShape) else None
            text = (crash_text(got.failure, shape.dtype, shape.head_dim, caps(name)) + f" ({shape.label})"
                    if shape is not None else f"{got.failure} before the first shape")
            crashes[name] = text
            done.append(BenchCell(backend=name, status=CellStatus.ERROR, detail=text))
            done += [BenchCell(backend=name, status=CellStatus.ERROR,
                               detail="not measured: an earlier shape took the process down")
                     for _ in range(len(inside) - len(done))]
        measured = iter(done)
        cells[name] = [BenchCell(backend=name, status=CellStatus.SKIPPED, detail=outside[i]) if i in outside
                       else next(measured) for i in range(len(shapes))]
        if on_backend is not None:
            on_backend(name, dataclasses.replace(shell, rows=tuple(
                BenchRow(shape=shape, flops=shape_flops(shape), cells=(cells[name][i],))
                for i, shape in enumerate(shapes))))
    rows = []
    for i, shape in enumerate(shapes):
        row = {n: cells[n][i] for n in names}
        base = row.get(baseline)
        base_ms = base.ms if base is not None and base.status is CellStatus.OK else None
        rows.append(BenchRow(shape=shape, flops=shape_flops(shape),
                             cells=tuple(row[n].with_ratio(base_ms) for n in names)))
    return IsolatedBench(report=dataclasses.replace(shell, rows=tuple(rows)), crashes=crashes)


def crash_records(result: IsolatedBench, device: DeviceInfo,
                  versions: Mapping[str, str | None] | None = None) -> list[VerifyRecord]:
    """A failed verify record per crashed backend: doctor shows it, the dispatcher skips the backend."""
    return [VerifyRecord(device_key=device.key, backend=name, backend_version=(versions or {}).get(name),
                         ok=False, summary=f"crashed during bench: {text}", details={"crash": text})
            for name, text in result.crashes.items()]


def _outside(shapes: Sequence[AttentionShape], caps: Capabilities | None) -> dict[int, str]:
    """Index -> why, for the shapes outside a build's recorded capabilities (they are not measured)."""
    if caps is None:
        return {}
    out = {}
    for i, s in enumerate(shapes):
        why = caps.outside(dtype=s.dtype, head_dim=s.head_dim, backward=s.mode.value != "fwd")
        if why is not None:
            out[i] = f"outside this build's capabilities: {why}"
    return out


def child_rows(job: _Job, announce: Callable[[object], None]) -> Iterator[Any]:
    """In the child: one cell per shape, as each finishes."""
    adapter = child_adapter(job.adapters_ref, job.name, job.adapter)
    for shape in job.shapes:
        announce(shape)
        report = run_bench([shape], adapters={job.name: adapter}, baseline=job.name, device=job.device,
                           timing=job.timing, quantized=job.quantized)
        yield dataclasses.replace(report.rows[0].cells[0], ratio_to_baseline=None)  # the parent sets it
