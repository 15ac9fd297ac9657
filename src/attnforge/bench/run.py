"""``attnforge bench`` as a library call: time every backend on every shape with one harness.

Per shape the input sets are drawn once (standard normal, never zeros) and shared by every backend; the
backends are then timed in interleaved rounds (``timing.rounds``: every backend once through
:func:`attnforge.bench.timing.measure`, in an order rotated each round, then the next round), so drift hits all
of them alike and each cell carries the spread of its rounds. The row's "best" is the one "fastest" rule
(:func:`attnforge.ranking.rank`): a backend the top does not beat beyond the rounds' noise is tied with it,
and ties go to the lower-overhead path. Quantized backends also get their output error against the float32
reference on the shape (:mod:`attnforge.bench.accuracy`).
A backend that cannot serve a shape is skipped with its reasons; one that raises (out of memory, a kernel error)
gets an error cell, and the run goes on.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from attnforge._compat import StrEnum
from attnforge.backends.adapter import AttentionCall, BackendAdapter
from attnforge.backends.bound import bound_call
from attnforge.bench.flops import FORMULA, shape_flops, tflops
from attnforge.bench.grid import to_call
from attnforge.bench.timing import Timing, TimingConfig, combine_rounds, measure, rotation_sets, round_order
from attnforge.ranking import Measurement, OutputError, Ranking, rank
from attnforge.types.device import DeviceType
from attnforge.types.shapes import AttentionShape, Mode
from attnforge.verify.causes import headline
from attnforge.verify.device import DeviceInfo

#: The share of free device memory (the host's available memory on a CPU) the rotating input sets of one shape may
#: take.
INPUT_MEMORY_SHARE = 0.25


class CellStatus(StrEnum):
    """The outcome of one backend on one shape."""

    OK = "ok"
    SKIPPED = "skipped"  # the backend does not support the shape (its unsupported_reasons)
    ERROR = "error"  # it raised: out of memory, a kernel error
    NOISY = "noisy"  # measured, but beyond bench's noise bounds (attnforge.bench.isolated): shown, never stored


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchCell:
    """One backend on one shape.

    Attributes:
        backend: the adapter's name.
        status: ok, skipped or error.
        detail: skip reasons, the error's first meaningful line, or why a noisy cell is not stored ("" when ok).
        ms: median milliseconds per call.
        tflops: TFLOP/s from :mod:`attnforge.bench.flops` and ``ms``.
        ratio_to_baseline: the baseline's ``ms`` divided by this ``ms`` (> 1: faster than SDPA's default).
        peak_mem_bytes: device memory the call allocated at its peak, beyond its inputs (None on CPU).
        timing: the measurement behind ``ms`` (``timing.rounds_ms``: the spread).
        error: the output's error against the float32 reference (quantized backends only).
    """

    backend: str
    status: CellStatus
    detail: str = ""
    ms: float | None = None
    tflops: float | None = None
    ratio_to_baseline: float | None = None
    peak_mem_bytes: int | None = None
    timing: Timing | None = None
    error: OutputError | None = None

    def with_ratio(self, base_ms: float | None) -> BenchCell:
        """The cell with ``ratio_to_baseline`` = ``base_ms`` / its ``ms`` (itself unless it ran and the baseline
        has a time)."""
        if self.status is not CellStatus.OK or not base_ms or not self.ms:
            return self
        return dataclasses.replace(self, ratio_to_baseline=base_ms / self.ms)

    @property
    def noise(self) -> float:
        """The rounds' relative spread: MAD of their medians over the median (0.0 without rounds: no spread)."""
        t = self.timing
        return t.mad_ms / t.median_ms if t is not None and t.median_ms > 0 else 0.0

    def measurement(self, flops: float) -> Measurement | None:
        """The cell for :func:`attnforge.ranking.rank` (None unless it ran)."""
        if self.status is not CellStatus.OK or self.ms is None:
            return None
        t = self.timing
        lo_ms, hi_ms = (t.lo_ms, t.hi_ms) if t is not None else (self.ms, self.ms)
        return Measurement(backend=self.backend, tflops=tflops(flops, self.ms), tflops_lo=tflops(flops, hi_ms),
                           tflops_hi=tflops(flops, lo_ms), noise=self.noise, error=self.error,
                           rounds=t.round_count if t is not None else None)


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchRow:
    """One shape: its FLOP count, a cell per backend and the fastest backend."""

    shape: AttentionShape
    flops: float
    cells: tuple[BenchCell, ...]

    @property
    def ranking(self) -> Ranking:
        """The one "fastest" rule (:func:`attnforge.ranking.rank`) over the cells that ran."""
        return rank(m for c in self.cells if (m := c.measurement(self.flops)) is not None)

    @property
    def best(self) -> str | None:
        """The winner of :attr:`ranking` (None when no cell ran)."""
        return self.ranking.winner

    def cell(self, backend: str) -> BenchCell | None:
        return next((c for c in self.cells if c.backend == backend), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendInfo:
    """A benched backend: its installed version and whether ``attnforge verify`` passed it on this device."""

    name: str
    version: str | None
    verified: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchReport:
    """The result of one ``attnforge bench``.

    Attributes:
        run_id: unique per run; every stored record carries it.
        created_at: UTC, ISO 8601.
        device: where it ran.
        baseline: the backend every ratio is relative to (SDPA with no kernel forced).
        backends: the benched backends, baseline included.
        timing: the budgets and timer used for every cell.
        flops_formula: the FLOP convention behind every TFLOP/s.
        rows: one per shape.
    """

    run_id: str
    created_at: str
    device: DeviceInfo
    baseline: str
    backends: tuple[BackendInfo, ...]
    timing: TimingConfig
    flops_formula: str = FORMULA
    rows: tuple[BenchRow, ...] = field(default_factory=tuple)


#: Builds the input sets of one shape on a device: ``(shape, sets, device) -> [(q, k, v, dout|None), ...]``.
InputFactory = Callable[[AttentionShape, int, str], list[tuple[Any, ...]]]


def random_inputs(shape: AttentionShape, sets: int, device: str) -> list[tuple[Any, ...]]:
    """``sets`` independent standard-normal ``(q, k, v, dout)`` in ``shape.dtype`` on ``device``.

    ``q [B, Hq, Sq, D]``, ``k [B, Hkv, Sk, D]``, ``v [B, Hkv, Sk, Dv]``; ``dout [B, Hq, Sq, Dv]`` (the output's
    shape; Dv != D in MLA models) for fwd+bwd (else None), and
    q/k/v require grad then. Never zeros: kernels that skip work on zero blocks would look fast.
    """
    import torch

    dtype = getattr(torch, shape.dtype)
    grad = shape.mode is Mode.FWD_BWD
    out = []
    for _ in range(sets):
        q = torch.randn(shape.batch, shape.heads_q, shape.seqlen_q, shape.head_dim, device=device, dtype=dtype)
        kv_shape = (shape.batch, shape.heads_kv, shape.seqlen_k, shape.head_dim)
        k = torch.randn(kv_shape, device=device, dtype=dtype)
        v = torch.randn(*kv_shape[:3], shape.dv, device=device, dtype=dtype)
        dout = torch.randn(*q.shape[:3], shape.dv, device=device, dtype=dtype) if grad else None  # the output's
        out.append((q.requires_grad_(grad), k.requires_grad_(grad), v.requires_grad_(grad), dout))
    return out


def set_bytes(shape: AttentionShape) -> int:
    """Bytes of one input set: q, k, v, plus dout for fwd+bwd."""
    itemsize = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}.get(shape.dtype, 2)
    q = shape.batch * shape.heads_q * shape.seqlen_q * shape.head_dim
    kv = shape.batch * shape.heads_kv * shape.seqlen_k * (shape.head_dim + shape.dv)
    dout = shape.batch * shape.heads_q * shape.seqlen_q * shape.dv if shape.mode is Mode.FWD_BWD else 0
    return itemsize * (q + kv + dout)


def make_step(adapter: BackendAdapter, inputs: Sequence[tuple[Any, ...]], shape: AttentionShape,
              call: AttentionCall | None = None) -> Callable[[int], object]:
    """The call ``measure`` times: the route the dispatcher runs for ``call`` (the adapter bound to the call's
    signature, :func:`attnforge.backends.bound.bound_call`, so bench times what serves the call), forward under
    ``no_grad``, or forward then ``autograd.grad`` of dout."""
    import torch

    fn = bound_call(adapter, call, causal=shape.causal, scale=None)
    if shape.mode is Mode.FWD:
        def fwd(i: int) -> object:
            q, k, v, _ = inputs[i]
            with torch.no_grad():
                return fn(q, k, v)
        return fwd

    def fwd_bwd(i: int) -> object:
        q, k, v, dout = inputs[i]
        out = fn(q, k, v)
        return torch.autograd.grad(out, (q, k, v), dout)  # no .grad accumulation between calls
    return fwd_bwd


def run_bench(
    shapes: Sequence[AttentionShape], *, adapters: Mapping[str, BackendAdapter], baseline: str,
    device: DeviceInfo, timing: TimingConfig, versions: Mapping[str, str | None] | None = None,
    verified: Sequence[str] = (), quantized: Sequence[str] = (), make_inputs: InputFactory = random_inputs,
    progress: Callable[[AttentionShape, str], None] | None = None, clock: Callable[[], float] = time.perf_counter,
) -> BenchReport:
    """Time every adapter on every shape.

    Args:
        shapes: the grid (:mod:`attnforge.bench.grid`).
        adapters: name -> adapter, the baseline included.
        baseline: the name every ratio is relative to.
        device: where to run.
        timing: budgets and timer, the same for every cell.
        versions: name -> installed version, for the report and the records.
        verified: the names ``attnforge verify`` passed on this device.
        quantized: the names that quantize Q/K/V (asked with ``precision="allow_quantized"``).
        make_inputs: builds the input sets (injected by tests).
        progress: called before each cell with the shape and backend (the CLI shows a status line).
        clock: seconds, monotonic, for CPU timing (a fake clock in tests).

    Returns:
        The report; cells that raised are errors, not exceptions.
    """
    versions = versions or {}
    rows = [_run_shape(shape, adapters=adapters, baseline=baseline, device=device, timing=timing,
                       quantized=quantized, make_inputs=make_inputs, progress=progress, clock=clock)
            for shape in shapes]
    return BenchReport(
        run_id=uuid.uuid4().hex[:12],
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        device=device, baseline=baseline, timing=timing, rows=tuple(rows),
        backends=tuple(BackendInfo(name=n, version=versions.get(n), verified=n in verified)
                       for n in adapters),
    )


def _run_shape(shape: AttentionShape, *, adapters: Mapping[str, BackendAdapter], baseline: str,
               device: DeviceInfo, timing: TimingConfig, quantized: Sequence[str], make_inputs: InputFactory,
               progress: Callable[[AttentionShape, str], None] | None, clock: Callable[[], float]) -> BenchRow:
    cells: dict[str, BenchCell] = {}
    runnable: list[str] = []
    calls: dict[str, AttentionCall] = {}
    for name, adapter in adapters.items():
        call = calls[name] = to_call(shape, device_type=device.type.value,
                                     compute_capability=device.compute_capability,
                                     precision="allow_quantized" if name in quantized else "exact")
        reasons = adapter.unsupported_reasons(call)
        if reasons:
            cells[name] = BenchCell(backend=name, status=CellStatus.SKIPPED, detail="; ".join(reasons))
        else:
            runnable.append(name)
    if runnable:
        inputs, failure = _shape_inputs(shape, device, make_inputs)
        if failure is not None:  # the shape's own inputs: every runnable cell says so, no backend is blamed
            cells.update({n: BenchCell(backend=n, status=CellStatus.ERROR, detail=failure) for n in runnable})
        else:
            cells.update(_time_rounds({n: adapters[n] for n in runnable}, inputs, shape=shape, device=device,
                                      timing=timing, progress=progress, clock=clock, calls=calls))
            for name in runnable:
                if name in quantized and cells[name].status is CellStatus.OK:
                    cells[name] = _with_error(cells[name], adapters[name], inputs[0], shape)
        inputs = []
        _release(device)
    base = cells.get(baseline)
    base_ms = base.ms if base is not None and base.status is CellStatus.OK else None
    ordered = tuple(cells[n].with_ratio(base_ms) for n in adapters)
    return BenchRow(shape=shape, flops=shape_flops(shape), cells=ordered)


def _shape_inputs(shape: AttentionShape, device: DeviceInfo,
                  make_inputs: InputFactory) -> tuple[list[tuple[Any, ...]], str | None]:
    """The rotating input sets of ``shape``, or none and why they cannot be made: a shape whose one input set
    exceeds the device's free memory is refused before anything is allocated (on a CPU an allocation past the free
    memory can succeed and the kernel's OOM killer then takes the process down, which reads as a crash of the
    backend); one whose allocation fails says "does not fit" too."""
    need = set_bytes(shape)
    try:
        free = _free_bytes(device)
    except Exception as exc:  # the device's memory cannot be read (a CUDA error): the shape cannot run
        return [], f"its inputs could not be made: {headline(exc)}"
    if free is not None and need > free:
        return [], (f"does not fit: one input set of this shape takes {_gib(need)}, the {device.type.value} has "
                    f"{_gib(free)} free; try a smaller --seqlen or --batch")
    budget = None if free is None else int(free * INPUT_MEMORY_SHARE)
    sets = rotation_sets(set_bytes=need, l2_bytes=device.l2_cache_bytes, budget_bytes=budget)
    try:
        return make_inputs(shape, sets, device.torch_device), None
    except Exception as exc:
        return [], _failure(exc) if _out_of_memory(exc) else f"its inputs could not be made: {headline(exc)}"


def _failure(exc: BaseException) -> str:
    """A cell's error text: the exception's first meaningful line; an allocation that failed says the shape does not
    fit and what to try."""
    if _out_of_memory(exc):
        return f"does not fit: {headline(exc)}; try a smaller --seqlen or --batch"
    return headline(exc)


def _out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation that failed: torch's CUDA ``OutOfMemoryError``, Python's ``MemoryError``, or
    torch's CPU allocator ("DefaultCPUAllocator: can't allocate memory")."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return "can't allocate memory" in text or "out of memory" in text


def _gib(size_bytes: int) -> str:
    return f"{size_bytes / 2**30:.3g} GiB"


def _time_rounds(adapters: Mapping[str, BackendAdapter], inputs: Sequence[tuple[Any, ...]], *,
                 shape: AttentionShape, device: DeviceInfo, timing: TimingConfig,
                 progress: Callable[[AttentionShape, str], None] | None,
                 clock: Callable[[], float], calls: Mapping[str, AttentionCall] | None = None,
                 ) -> dict[str, BenchCell]:
    """Every backend once per round, the order rotated each round; a backend that raises leaves the rounds."""
    rounds = max(1, timing.rounds)
    per_round = dataclasses.replace(timing, rep_ms=timing.rep_ms / rounds)
    sync = _sync(device)
    steps = {name: make_step(adapter, inputs, shape, (calls or {}).get(name)) for name, adapter in adapters.items()}
    done: dict[str, list[Timing]] = {name: [] for name in adapters}
    failed: dict[str, BenchCell] = {}
    names = list(adapters)
    for r in range(rounds):
        for name in round_order(names, r, rounds):
            if name in failed:
                continue
            if progress is not None:
                progress(shape, name)
            try:
                done[name].append(measure(steps[name], sets=len(inputs), config=per_round, sync=sync, clock=clock))
            except Exception as exc:  # a backend may raise anything; the cell records it
                _release(device)
                failed[name] = BenchCell(backend=name, status=CellStatus.ERROR, detail=_failure(exc))
    out: dict[str, BenchCell] = dict(failed)
    flops = shape_flops(shape)
    for name in names:
        if name in failed:
            continue
        result = combine_rounds(done[name])
        try:
            peak = _peak_memory(steps[name], device, sync)
        except Exception as exc:
            out[name] = BenchCell(backend=name, status=CellStatus.ERROR, detail=_failure(exc))
            continue
        out[name] = BenchCell(backend=name, status=CellStatus.OK, ms=result.median_ms,
                              tflops=tflops(flops, result.median_ms), peak_mem_bytes=peak, timing=result)
    return out


def _with_error(cell: BenchCell, adapter: BackendAdapter, inputs: tuple[Any, ...],
                shape: AttentionShape) -> BenchCell:
    """The cell with the quantized backend's output error on this shape (an error cell if it raises)."""
    from attnforge.bench.accuracy import output_error

    try:
        error = output_error(adapter, inputs, causal=shape.causal)
    except Exception as exc:  # a backend may raise anything; the cell records it
        return BenchCell(backend=cell.backend, status=CellStatus.ERROR, detail=f"error check: {_failure(exc)}")
    return dataclasses.replace(cell, error=error)


def _sync(device: DeviceInfo) -> Callable[[], None]:
    if device.type is DeviceType.CUDA:
        import torch

        return torch.cuda.synchronize
    return lambda: None


def _peak_memory(step: Callable[[int], object], device: DeviceInfo, sync: Callable[[], None]) -> int | None:
    """Bytes one call allocates at its peak beyond what was allocated before it (CUDA only)."""
    if device.type is not DeviceType.CUDA:
        return None
    import torch

    sync()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result = step(0)
    sync()
    peak = int(torch.cuda.max_memory_allocated() - before)
    del result
    return peak


def _free_bytes(device: DeviceInfo) -> int | None:
    """Bytes free on ``device`` for the inputs: the GPU's free memory, or the host's available memory on a CPU
    (None where it cannot be read)."""
    if device.type is DeviceType.CUDA:
        import torch

        free, _total = torch.cuda.mem_get_info()
        return int(free)
    import psutil

    try:
        return int(psutil.virtual_memory().available)
    except (OSError, RuntimeError):  # no /proc/meminfo (a sandbox): no bound, as before
        return None


def _release(device: DeviceInfo) -> None:
    if device.type is DeviceType.CUDA:
        import torch

        torch.cuda.empty_cache()
