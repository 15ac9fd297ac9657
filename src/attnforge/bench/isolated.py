"""``attnforge bench`` with each backend in a child process (:mod:`attnforge._system.isolate`).

Each backend runs :func:`attnforge.bench.run.run_bench` one shape at a time in its own child; the parent merges
the rows and the ratios to the baseline. A backend that kills its child (a signal, an abort) or hangs gets error
cells naming the signal and the shape, and a failed verify record, so doctor shows it and the dispatcher never
picks it. A Python exception that ends the child is the bench's own fault (``run_bench`` turns a backend's
exceptions into error cells): error cells, no verify record.
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
from attnforge.bench.stability import DEFAULT_MAX_NOISE, drifted, judged
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
    baseline: str | None = None  # also timed, in the same rounds (the load gauge of :mod:`bench.stability`)
    baseline_adapter: bytes | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PairedCell:
    """What a child yields per shape: the backend's cell and the baseline timed in the same rounds (None in the
    baseline's own child)."""

    cell: BenchCell
    baseline: BenchCell | None = None


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
                      on_backend: Callable[[str, BenchReport], None] | None = None,
                      max_noise: float = DEFAULT_MAX_NOISE) -> IsolatedBench:
    """Bench ``names`` (baseline included) each in its own child; the report has the shape of
    :func:`run_bench`'s.

    The baseline runs first, alone; every other backend's child times the baseline too, in the same interleaved
    rounds: the ratio comes from that pair, and a baseline that moved against its own child's time means the
    load changed, so those shapes are measured once more and, still moved, kept as NOISY cells that are never
    stored (:mod:`attnforge.bench.stability`). ``max_noise`` bounds both the rounds' noise and the baseline's
    drift (0.5: 50 % and a factor of 1.5).

    ``on_backend`` gets, as soon as each backend's child is done, its name and a report of the same run (run id, device,
    timing) holding only that backend's cells: the caller can keep them before the next backend starts, so an
    interrupted bench (Ctrl-C, SIGTERM: the :class:`KeyboardInterrupt` propagates, the running child is killed)
    loses only the backend it was measuring.
    """
    names = list(adapters)
    cells: dict[str, list[BenchCell]] = {}
    crashes: dict[str, str] = {}
    shell = run_bench([], adapters=dict.fromkeys(names), baseline=baseline, device=device,  # type: ignore[arg-type]
                      timing=timing, versions=versions, verified=verified)
    base_blob = portable(adapters[baseline]) if baseline in adapters else None
    reference: list[BenchCell | None] = [None] * len(shapes)
    for name in sorted(names, key=lambda n: n != baseline):  # the baseline first: every other pair is held to it
        if progress is not None and shapes:
            progress(shapes[0], name)
        outside = _outside(shapes, caps(name))
        inside = [i for i in range(len(shapes)) if i not in outside]
        paired_with = baseline if baseline in adapters and name != baseline else None

        def child(indices: list[int], name: str = name, paired_with: str | None = paired_with) -> list[PairedCell]:
            job = _Job(adapters_ref=isolation.adapters_ref, name=name, adapter=portable(adapters[name]),
                       shapes=tuple(shapes[i] for i in indices), device=device, timing=timing,
                       quantized=tuple(quantized), baseline=paired_with,
                       baseline_adapter=base_blob if paired_with else None)
            return _run_child(job, isolation=isolation, runner=runner, environ=environ, caps=caps(name),
                              crashes=crashes)

        got = dict(zip(inside, child(inside), strict=True))
        again = [i for i, p in got.items() if drifted(p.baseline, reference[i], bound=max_noise)]
        if again and name not in crashes:  # the load changed between the children: measure those shapes again
            got.update(zip(again, child(again), strict=True))
        cells[name] = [BenchCell(backend=name, status=CellStatus.SKIPPED, detail=outside[i]) if i in outside
                       else judged(got[i].cell, paired=got[i].baseline, reference=reference[i], baseline=baseline,
                                   max_noise=max_noise, max_drift=max_noise)
                       for i in range(len(shapes))]
        if name == baseline:
            reference = [c if c.status is CellStatus.OK else None for c in cells[name]]
        if on_backend is not None:
            on_backend(name, dataclasses.replace(shell, rows=tuple(
                BenchRow(shape=shape, flops=shape_flops(shape), cells=(cells[name][i],))
                for i, shape in enumerate(shapes))))
    rows = []
    for i, shape in enumerate(shapes):
        row = {n: cells[n][i] for n in names}
        ref = reference[i]
        rows.append(BenchRow(shape=shape, flops=shape_flops(shape), cells=tuple(  # the others' ratios: judged()
            row[n].with_ratio(ref.ms if ref is not None else None) if n == baseline else row[n] for n in names)))
    return IsolatedBench(report=dataclasses.replace(shell, rows=tuple(rows)), crashes=crashes)


def _run_child(job: _Job, *, isolation: Isolation, runner: Runner, environ: Mapping[str, str],
               caps: Capabilities | None, crashes: dict[str, str]) -> list[PairedCell]:
    """One child over ``job.shapes``: a paired cell per shape; a crash or hang fills the rest with error cells
    and is noted in ``crashes``."""
    got = run_in_child("attnforge.bench.isolated:child_rows", job, runner=runner, python=isolation.python,
                       env=environ, timeout_s=isolation.timeout_s)
    done = [p for p in got.items if isinstance(p, PairedCell)]
    if got.raised is not None:  # the bench's own code raised in the child: error cells, never the backend's crash
        text = f"not measured: the bench's child process raised {got.raised}"
        done += [PairedCell(cell=BenchCell(backend=job.name, status=CellStatus.ERROR, detail=text))
                 for _ in range(len(job.shapes) - len(done))]
    elif got.failure is not None:
        shape = got.current if isinstance(got.current, AttentionShape) else None
        text = (crash_text(got.failure, shape.dtype, shape.head_dim, caps) + f" ({shape.label})"
                if shape is not None else f"{got.failure} before the first shape")
        crashes[job.name] = text
        done.append(PairedCell(cell=BenchCell(backend=job.name, status=CellStatus.ERROR, detail=text)))
        done += [PairedCell(cell=BenchCell(backend=job.name, status=CellStatus.ERROR,
                                           detail="not measured: an earlier shape took the process down"))
                 for _ in range(len(job.shapes) - len(done))]
    return done


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
    """In the child: a :class:`PairedCell` per shape, as each finishes; the baseline, when the job names one, is
    timed in the same interleaved rounds as the backend."""
    adapter = child_adapter(job.adapters_ref, job.name, job.adapter)
    benched = {job.name: adapter}
    if job.baseline is not None:
        benched = {job.baseline: child_adapter(job.adapters_ref, job.baseline, job.baseline_adapter), **benched}
    for shape in job.shapes:
        announce(shape)
        row = run_bench([shape], adapters=benched, baseline=job.baseline or job.name, device=job.device,
                        timing=job.timing, quantized=job.quantized).rows[0]
        by_name = {c.backend: c for c in row.cells}  # run_bench gives every adapter a cell
        yield PairedCell(cell=dataclasses.replace(by_name[job.name], ratio_to_baseline=None),  # the parent sets it
                         baseline=by_name.get(job.baseline) if job.baseline is not None else None)
