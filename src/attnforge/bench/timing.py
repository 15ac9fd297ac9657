"""One timing harness for every backend: first call apart, warm-up, then the median of many repetitions.

The method follows ``triton.testing.do_bench`` (the one behind tests/fixtures/h200_bench_2026-11-21.json:
median, warm-up 50 ms, repetitions 200 ms): the number of warm-up calls and repetitions is derived from a
time budget and an estimate of one call, each repetition is timed on its own, and the median is reported.
On a GPU each repetition is bracketed by CUDA events (or handed to ``do_bench`` itself); on a CPU by
``time.perf_counter``. Every call uses the next of several input sets, so a GPU cannot serve a call from
inputs the previous call left in L2 (see :func:`rotation_sets`).

A bench cell is measured in ``rounds`` interleaved rounds (every backend once per round, then the next round,
:mod:`attnforge.bench.run`), each with ``rep_ms / rounds`` of repetitions; :func:`combine_rounds` reports the
median of the rounds' medians and keeps each round's median, so the spread between rounds (what a neighbour,
clock boost or thermal state changes) is measured, not hidden in one long run.

*As the model sees it* (:attr:`TimerMethod.BACK_TO_BACK`, what measure-on-first-use uses, issue 30): a
repetition is a batch of calls issued back to back on the caller's own tensors, timed from the end of its first
call to the end of its last (:class:`Marks`: CUDA events recorded between the calls on a GPU, the host clock where
calls run synchronously) and divided by the calls after the first. Each timed call is issued while its predecessor
runs, as a model issues attention between other layers, so a call costs the longer of its kernel and its host
time (Python entry, argument checks, launch): a kernel shorter than its own launch is not chosen over SDPA because
its CUDA-event time alone was shorter (docs/benchmarks.md: FA3's and FA4's Python entries cost 90-300 us of host
time per call against 24-79 us for SDPA). The first call is left out because nothing ran before it: its whole host
time would show as device idle time that a model, whose earlier layers keep the device busy, does not see. Timed
from the batch's start instead (wall time between two synchronizes, until 2026-11-30), a two-call batch of a 1.6
ms fwd+bwd carried half a call's host time: on an H200 (docs/benchmarks.md "twenty-first session", Flux-dev's
fwd+bwd) SDPA, FA3 and FA4 read 2.4, 6.4 and 9.3 % over their CUDA-event times, in the order of their host costs,
and the rounds' noise put a 12 % faster kernel inside the tie margin. No L2 flush: consecutive calls of a layer do
not start from a cold L2 either.

*Held* (:attr:`TimerMethod.HELD`, measure-on-first-use's and the in-situ check's method on a GPU since 2026-11-30):
the same batch, issued while a sleep kernel holds the device (:class:`Hold`), so the CUDA events around it time the
device's own work without a gap, and the host clock times the issue alone. A call costs the longer of the two, the
pace a caller issuing it back to back gets, without the interplay of the two: where a back-to-back batch's host
time came near its device time, each host hiccup left the device idle and showed in the round. On an H200
(docs/benchmarks.md "twenty-sixth session") FlashAttention-3's fwd+bwd route at 1k keys took 0.466 ms of device
time a call (SDPA 0.509) and 276-445 µs of host time; back to back its rounds read 0.49-0.53 ms (noise 4 %,
against SDPA's 1 %), so an 8 % faster kernel tied. A caller that keeps the device busy through a call's issue (a
model's layers: :class:`attnforge.dispatch.insitu.CallerPace`) hides the host time entirely: the in-situ check
times such a caller's routes by their device time alone (``host_counts=False``).
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from attnforge._compat import StrEnum

if TYPE_CHECKING:
    from attnforge.ranking import Measurement

#: ``step(i)`` runs one call on input set ``i % sets``; it returns once the work is queued (GPU) or done.
Step = Callable[[int], object]


class TimerMethod(StrEnum):
    """How a repetition is timed."""

    CUDA_EVENTS = "cuda-events"
    DO_BENCH = "triton-do_bench"
    PERF_COUNTER = "perf_counter"
    BACK_TO_BACK = "back-to-back"  # a batch of queued calls from the end of its first to the end of its last, per call
    HELD = "held"  # a batch issued while a sleep kernel holds the device: per call the longer of device and host time


#: the wall time one back-to-back batch aims at (ms): long enough that the two synchronizes around it weigh
#: little (about 10 us each on an H100), short enough that a round holds several batches
BATCH_MS = 2.0
#: calls per back-to-back batch at least: the first, untimed, and one timed call issued while the first runs (so
#: the host's pace between two calls is in the figure). Not more: the in-situ check times three such batches of
#: each of two routes on the calling thread for calls up to 7 ms (:mod:`attnforge.dispatch.insitu`), 98 ms at two
MIN_BATCH = 2
#: calls per back-to-back batch at most (a call the clock barely sees must not turn into thousands)
MAX_BATCH = 64


class Marks(Protocol):
    """Points in the queued work, and the time between two of them: what a back-to-back batch is timed with.

    ``mark()`` is taken where the host stands in its issuing; it is reached when the work queued before it is done
    (a CUDA event on the stream's queue). ``ms_between(start, end)`` is read after the work is synchronized."""

    def mark(self) -> Any: ...

    def ms_between(self, start: Any, end: Any) -> float: ...


@dataclass(frozen=True, slots=True)
class HostMarks:
    """Marks of the host clock (seconds, monotonic): right where calls run synchronously (a CPU), since a call
    has done its work when it returns."""

    clock: Callable[[], float] = time.perf_counter

    def mark(self) -> float:
        return self.clock()

    def ms_between(self, start: float, end: float) -> float:
        return (end - start) * 1e3


class CudaMarks:
    """Marks as CUDA events (``torch.cuda.Event(enable_timing=True)``) recorded on ``device``'s current stream (the
    worker's inside its stream scope; the tensors' device, not merely the current one): a mark is reached on the
    device when the work queued before it is done, so the time between two includes every moment the device waited
    for the host to queue the next call."""

    __slots__ = ("device",)

    def __init__(self, device: Any = None) -> None:
        self.device = device

    def mark(self) -> Any:
        import torch

        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(self.device))
        return event

    def ms_between(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end))


def marks_for(device: Any, clock: Callable[[], float] = time.perf_counter) -> Marks:
    """:class:`CudaMarks` on ``device`` (a ``torch.device``) when it is a CUDA device, else :class:`HostMarks` of
    ``clock``."""
    return CudaMarks(device) if getattr(device, "type", None) == "cuda" else HostMarks(clock)


class Hold(Protocol):
    """Device work queued ahead of a batch, so the batch is issued while the device is busy (:attr:`TimerMethod.HELD`).
    ``hold(ms)`` queues about ``ms`` of it and returns at once."""

    def hold(self, ms: float) -> None: ...


#: the longest hold (ms): a batch whose issue outlasts it starts while the device waits (its figure then includes
#: the host's pace, as a back-to-back batch's does)
MAX_HOLD_MS = 40.0
_CYCLES_PER_MS: dict[int, float] = {}


class CudaSleep:
    """:class:`Hold` on a CUDA device's current stream: ``torch.cuda._sleep`` (a kernel spinning a number of clock
    cycles), its cycles per ms measured once per device and process with CUDA events (~1 ms)."""

    __slots__ = ("cycles_per_ms", "device")

    def __init__(self, device: Any) -> None:
        import torch

        self.device = device
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in _CYCLES_PER_MS:
            with torch.cuda.device(index):  # the sleep kernel runs on the current device's current stream
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                torch.cuda._sleep(1000)  # type: ignore[no-untyped-call]  # the kernel's own first launch, untimed
                begin.record()
                torch.cuda._sleep(1_000_000)  # type: ignore[no-untyped-call]
                end.record()
                end.synchronize()
                _CYCLES_PER_MS[index] = 1_000_000 / max(float(begin.elapsed_time(end)), 1e-3)
        self.cycles_per_ms = _CYCLES_PER_MS[index]

    def hold(self, ms: float) -> None:
        import torch

        with torch.cuda.device(self.device):
            torch.cuda._sleep(int(min(ms, MAX_HOLD_MS) * self.cycles_per_ms))  # type: ignore[no-untyped-call]


def hold_for(device: Any) -> Hold | None:
    """:class:`CudaSleep` on ``device`` (a ``torch.device``) when it is a CUDA device and torch has the sleep
    kernel, else None (a CPU: calls run synchronously, there is no queue to hold)."""
    if getattr(device, "type", None) != "cuda":
        return None
    import torch

    if not hasattr(torch.cuda, "_sleep"):
        return None
    try:
        return CudaSleep(device)
    except Exception:  # no hold: the batch is timed back to back, as before
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class TimingConfig:
    """Budgets of one measurement.

    Attributes:
        warmup_ms: time spent in warm-up calls after the first call (do_bench's ``warmup``).
        rep_ms: time spent in timed repetitions (do_bench's ``rep``).
        min_reps / max_reps: bounds on the number of timed repetitions (per round).
        method: the timer.
        rounds: interleaved rounds per cell; ``rep_ms`` is shared among them.
    """

    warmup_ms: float
    rep_ms: float
    min_reps: int
    max_reps: int
    method: TimerMethod
    rounds: int = 3


#: The method of the H200 fixture: triton's do_bench, median, warm-up 50 ms, repetitions 200 ms.
GPU_DO_BENCH = TimingConfig(warmup_ms=50.0, rep_ms=200.0, min_reps=10, max_reps=10_000,
                            method=TimerMethod.DO_BENCH)
#: The same budgets with CUDA events, for machines without triton.
GPU_EVENTS = TimingConfig(warmup_ms=50.0, rep_ms=200.0, min_reps=10, max_reps=10_000,
                          method=TimerMethod.CUDA_EVENTS)
#: Small budgets for CPU runs (CI): a handful of repetitions of tiny shapes.
CPU_PERF_COUNTER = TimingConfig(warmup_ms=5.0, rep_ms=30.0, min_reps=3, max_reps=25,
                                method=TimerMethod.PERF_COUNTER)


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """One measured call.

    Attributes:
        median_ms: the median repetition (what TFLOP/s are computed from).
        min_ms, p20_ms, p80_ms: spread of the repetitions.
        reps: timed repetitions.
        warmup_calls: untimed calls after the first.
        first_call_s: the first call alone, wall time: compile/JIT/autotuning plus one run; not in the median.
        input_sets: how many input sets the calls rotated through.
        method: the timer.
        rounds_ms: the median of each interleaved round (one entry for a single measurement).
        drift: per round, the factor common to every candidate timed in that round (:func:`without_common_drift`;
            empty where it was not taken out); drift_of: how many candidates it was taken over.
    """

    median_ms: float
    min_ms: float
    p20_ms: float
    p80_ms: float
    reps: int
    warmup_calls: int
    first_call_s: float
    input_sets: int
    method: TimerMethod
    rounds_ms: tuple[float, ...] = ()
    drift: tuple[float, ...] = ()
    drift_of: int = 0

    @property
    def lo_ms(self) -> float:
        """The fastest round's median (the spread's low end)."""
        return min(self.rounds_ms, default=self.median_ms)

    @property
    def hi_ms(self) -> float:
        """The slowest round's median (the spread's high end)."""
        return max(self.rounds_ms, default=self.median_ms)

    @property
    def round_count(self) -> int | None:
        """How many rounds the median and :attr:`mad_ms` were taken over, None without rounds (what the "fastest"
        rule narrows its margin by: :func:`attnforge.ranking.rounds_factor`)."""
        return len(self.rounds_ms) or None

    @property
    def mad_ms(self) -> float:
        """The median absolute deviation of the rounds' medians from their median, ms: the noise figure the
        "fastest" rule weighs (:func:`attnforge.ranking.beats`). One slow round of three does not move it
        (rounds 1.00, 1.01, 1.30 ms give 0.01 ms); 0.0 with fewer than two rounds. With :attr:`drift`, of the
        rounds divided by it, times ``sqrt(n / (n - 1))`` for its ``n`` candidates (:func:`without_common_drift`)."""
        if len(self.rounds_ms) < 2:
            return 0.0
        rounds, scale = self.rounds_ms, 1.0
        if self.drift and self.drift_of > 1:
            rounds = tuple(r / f for r, f in zip(self.rounds_ms, self.drift, strict=True))
            scale = math.sqrt(self.drift_of / (self.drift_of - 1))
        center = statistics.median(rounds)
        return scale * statistics.median(abs(r - center) for r in rounds)

    def measurement(self, backend: str, flops: float) -> Measurement:
        """This timing of ``backend`` on a call of ``flops`` floating-point operations as the "fastest" rule reads
        it (:class:`attnforge.ranking.Measurement`): TFLOP/s of the median, the slowest and the fastest round, and
        the noise (:attr:`mad_ms` relative to the median)."""
        from attnforge.bench.flops import tflops
        from attnforge.ranking import Measurement

        median = self.median_ms
        return Measurement(backend=backend, tflops=tflops(flops, median), tflops_lo=tflops(flops, self.hi_ms),
                           tflops_hi=tflops(flops, self.lo_ms), noise=self.mad_ms / median if median else 0.0,
                           rounds=self.round_count)


def without_common_drift(timings: Mapping[str, Timing]) -> dict[str, Timing]:
    """The candidates' timings with the drift common to all of them in each round taken out of their noise.

    Interleaved rounds time every candidate once per round, close together; what moves a whole round (the GPU's
    clock, a neighbour, the host's pace) moves every candidate in it alike and says nothing about which one is
    faster. Each candidate's round median over its own median is its relative round time; a round's *drift* is the
    median of those over the candidates. :attr:`Timing.mad_ms` then weighs each round divided by its drift, times
    ``sqrt(n / (n - 1))`` for ``n`` candidates: where the candidates' noise is their own, independent from round to
    round, dividing by a factor taken partly from the candidate itself narrows its spread by about that much, so the
    noise reads as before; where a round moves them all, the drift takes it out. Medians, slowest and fastest
    rounds stay as measured.

    Taken out only where at least two candidates have the same number (at least three) of positive, finite round
    medians; otherwise the timings come back unchanged (one candidate's NaN round must not reach the others' noise).

    Args:
        timings: per candidate, its :func:`combine_rounds` result, rounds in the order they were timed.

    Returns:
        The same mapping with :attr:`Timing.drift` and :attr:`Timing.drift_of` set.
    """
    counts = {len(t.rounds_ms) for t in timings.values()}
    if len(timings) < 2 or len(counts) != 1 or min(counts) < 3 or not all(
            0 < r < math.inf for t in timings.values() for r in t.rounds_ms):  # NaN fails too
        return dict(timings)
    relative = [tuple(r / statistics.median(t.rounds_ms) for r in t.rounds_ms) for t in timings.values()]
    drift = tuple(statistics.median(column) for column in zip(*relative, strict=True))
    return {name: replace(t, drift=drift, drift_of=len(timings)) for name, t in timings.items()}


def combine_rounds(rounds: list[Timing]) -> Timing:
    """One :class:`Timing` of interleaved rounds: the median of their medians, the first round's first call."""
    medians = tuple(r.median_ms for r in rounds)
    return Timing(median_ms=statistics.median(medians), min_ms=min(r.min_ms for r in rounds),
                  p20_ms=statistics.median(r.p20_ms for r in rounds),
                  p80_ms=statistics.median(r.p80_ms for r in rounds),
                  reps=sum(r.reps for r in rounds), warmup_calls=sum(r.warmup_calls for r in rounds),
                  first_call_s=rounds[0].first_call_s, input_sets=rounds[0].input_sets, method=rounds[0].method,
                  rounds_ms=medians)


def rotation_sets(*, set_bytes: int, l2_bytes: int | None, budget_bytes: int | None,
                  max_sets: int = 64) -> int:
    """How many input sets to rotate through: enough that they exceed twice the L2 cache together.

    Args:
        set_bytes: bytes of one input set (q, k, v and, for backward, the output gradient).
        l2_bytes: the device's L2 size (None on CPU: two sets, so consecutive calls still differ).
        budget_bytes: memory the sets may take; the count is reduced to fit (never below 1).
        max_sets: an upper bound for tiny shapes.
    """
    want = 2 if not l2_bytes else max(2, math.ceil(2 * l2_bytes / max(1, set_bytes)))
    if budget_bytes is not None:
        want = min(want, max(1, budget_bytes // max(1, set_bytes)))
    return max(1, min(want, max_sets))


def flush_bytes(set_bytes: int, l2_bytes: int | None = None) -> int:
    """Bytes of the buffer to overwrite before each timed repetition so it starts with a cold L2, or 0 where
    it does not matter: when one input set (``set_bytes``) is already larger than twice the L2, a repetition
    evicts its predecessor's data by itself. For kernel timings on one input set (the GPU scripts,
    ``scripts/gpu/_timing.py``); ``attnforge bench`` rotates input sets instead (:func:`rotation_sets`), and
    measure-on-first-use times calls back to back without a flush (:attr:`TimerMethod.BACK_TO_BACK`).

    Args:
        set_bytes: bytes of the call's inputs.
        l2_bytes: the device's L2 size (the current CUDA device's when None).
    """
    if l2_bytes is None:
        import torch

        l2_bytes = int(torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size)
    return 0 if not l2_bytes or set_bytes > 2 * l2_bytes else 2 * l2_bytes


def measure(step: Step, *, sets: int, config: TimingConfig, sync: Callable[[], None] = lambda: None,
            clock: Callable[[], float] = time.perf_counter, flush_bytes: int = 0,
            marks: Marks | None = None, hold: Hold | None = None) -> Timing:
    """Time ``step`` the same way for every backend.

    1. The first call is timed alone (compile, JIT, autotuning, cuDNN plan building) and reported apart.
    2. The fastest of three calls estimates one; the budgets then give the warm-up and repetition counts.
    3. Warm-up calls run untimed; each repetition is timed on its own; the median is reported.

    Args:
        step: runs one call on input set ``i % sets``.
        sets: the number of input sets ``step`` rotates through.
        config: budgets and timer.
        sync: waits for the device (``torch.cuda.synchronize`` on a GPU).
        clock: seconds, monotonic (``time.perf_counter``; injected by tests).
        flush_bytes: with CUDA events, a buffer of this many bytes is zeroed before each repetition, outside
            the timed interval (an L2 flush, as ``triton.testing.do_bench`` does; :func:`flush_bytes`).
        marks: what times a back-to-back batch (:func:`marks_for`); the host clock ``clock`` when None.
        hold: for :attr:`TimerMethod.HELD` (:func:`hold_for`); without one a held method times back to back.

    Raises:
        Exception: whatever ``step`` raises (out of memory, unsupported input); the caller records it.
    """
    counter = _Rotation(sets)
    start = clock()
    step(counter.next())
    sync()
    first_call_s = clock() - start

    # The fastest of three calls estimates one call: a call slowed by a neighbour must not shrink the budget.
    estimate_ms = max(min(_wall(step, counter, 3, sync, clock)), 1e-6)
    # as many warm-up calls as the budget holds, but never more than repetitions may be (a call the clock
    # barely sees, e.g. a fake clock or a no-op, must not turn the budget into millions of calls)
    warmup = min(config.max_reps, max(1, math.ceil(config.warmup_ms / estimate_ms)))
    reps = min(config.max_reps, max(config.min_reps, math.ceil(config.rep_ms / estimate_ms)))

    # a held method with no queue to hold (a CPU) times back to back, and says so
    method = TimerMethod.BACK_TO_BACK if config.method is TimerMethod.HELD and hold is None else config.method
    if method is TimerMethod.DO_BENCH:
        times_ms = _do_bench(lambda: step(counter.next()), config)
        warmup = 0  # do_bench ran its own warm-up inside its budget
    else:
        for _ in range(warmup):
            step(counter.next())
        sync()
        if method is TimerMethod.CUDA_EVENTS:
            times_ms = _cuda_events(step, counter, reps, flush_bytes)
        elif method is TimerMethod.HELD and hold is not None:
            batch = batch_size(estimate_ms, least=1)
            # each repetition costs its hold as well: about twice its calls
            reps = min(config.max_reps, max(config.min_reps, math.ceil(config.rep_ms / (2 * estimate_ms * batch))))
            times_ms = held_times(_held(step, counter, reps, batch, hold_ms=next_hold_ms(estimate_ms, batch),
                                        sync=sync, marks=marks or HostMarks(clock), hold=hold, clock=clock),
                                  host_counts=True)
        elif method is TimerMethod.BACK_TO_BACK:
            batch = batch_size(estimate_ms)
            reps = min(config.max_reps, max(config.min_reps, math.ceil(config.rep_ms / (estimate_ms * batch))))
            times_ms = _back_to_back(step, counter, reps, batch, sync=sync, marks=marks or HostMarks(clock))
        else:
            times_ms = _wall(step, counter, reps, sync, clock)
    return summarize(times_ms, warmup_calls=warmup, first_call_s=first_call_s, input_sets=sets, method=method)


def round_order(names: Sequence[str], r: int, rounds: int) -> list[str]:
    """The order in which round ``r`` (0-based) of ``rounds`` interleaved rounds times its candidates: ``names``
    rotated by ``max(1, len(names) // rounds)`` places a round. With no more candidates than about twice the rounds
    that is one place a round (bench's and first use's two to five candidates alternate as before); with many, each
    candidate runs early, midway and late across the rounds. One place a round put a candidate listed late (the GPU
    check's ``attention()``, tenth of fourteen) at places 10, 9 and 8 in its three rounds, always after the same
    neighbours: a bias by position (a device whose clocks sink under sustained load: the same FA3 kernels read 4-8 %
    slower for the candidates profiled last, H200, docs/benchmarks.md "2026-11-30") that the rounds could not
    average out. Every harness that interleaves rounds orders them here."""
    n = len(names)
    if n == 0:
        return []
    shift = (r * max(1, n // max(1, rounds))) % n
    return [*names[shift:], *names[:shift]]


def paired(steps: dict[str, Step], *, pairs: int, max_call_ms: float, sync: Callable[[], None] = lambda: None,
           clock: Callable[[], float] = time.perf_counter, marks: Marks | None = None,
           batch_ms: float = BATCH_MS, hold: Hold | None = None, host_counts: bool = True) -> dict[str, Timing] | None:
    """Time two or more routes against each other on live calls, as the model issues them, at a bounded cost:
    ``pairs`` interleaved rounds, each one back-to-back batch (:func:`batch_size` for ``batch_ms``) of every step in
    turn; each round's per-call time is one entry of the result's ``rounds_ms`` (the noise
    :func:`attnforge.ranking.beats` weighs, the drift common to the routes taken out: :func:`without_common_drift`).
    One untimed call of each step first estimates the batch. The in-situ check of the dispatcher
    (:mod:`attnforge.dispatch.insitu`) runs this on the calling thread, so its cost is about
    ``pairs * len(steps) * (batch_ms + one call)`` plus one call of each. ``marks`` time the batches
    (:func:`marks_for`; the host clock ``clock`` when None). With ``hold`` (:func:`hold_for`) each batch is held
    (:attr:`TimerMethod.HELD`, its first call timed too): a call counts the longer of its device and host time, or
    its device time alone with ``host_counts=False`` (a caller whose device stays busy through its calls' issue
    hides their host time); each batch then also costs its hold, about its own host time.

    Returns:
        A :class:`Timing` per step, or None when one call takes longer than ``max_call_ms`` (the check would cost
        too much, and a host cost is noise at that length anyway): the estimates stop at the first such call.

    Raises:
        Exception: whatever a step raises.
    """
    estimates: dict[str, float] = {}
    for name, step in steps.items():
        estimates[name] = timed_call(functools.partial(step, 0), sync=sync, clock=clock)[0]
        if estimates[name] > max_call_ms:  # no further call: each would only add to the caller's wait
            return None
    batch = batch_size(min(estimates.values()), target_ms=batch_ms, least=1 if hold is not None else MIN_BATCH)
    per: dict[str, list[float]] = {name: [] for name in steps}
    held: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    counter = _Rotation(1)
    names = list(steps)
    marks = marks or HostMarks(clock)
    for r in range(max(1, pairs)):
        for name in round_order(names, r, max(1, pairs)):
            if hold is not None:  # a route's first batch is held for its estimate, later ones for its last issue
                last = held[name][-1][1] if held[name] else estimates[name]
                held[name].extend(_held(steps[name], counter, 1, batch, hold_ms=next_hold_ms(last, batch),
                                        sync=sync, marks=marks, hold=hold, clock=clock))
            else:
                per[name].extend(_back_to_back(steps[name], counter, 1, batch, sync=sync, marks=marks))
    if hold is not None:
        per = {name: held_times(timed, host_counts=host_counts) for name, timed in held.items()}
    return paired_rounds(per, first_call_s={name: ms / 1e3 for name, ms in estimates.items()},
                         method=TimerMethod.HELD if hold is not None else TimerMethod.BACK_TO_BACK)


def paired_rounds(rounds: Mapping[str, list[float]], *, first_call_s: Mapping[str, float],
                  method: TimerMethod = TimerMethod.BACK_TO_BACK) -> dict[str, Timing]:
    """Per candidate, the :class:`Timing` of its per-call times, each a round of its own (:func:`per_call_rounds`),
    round ``i`` of every candidate timed next to the others' (so the drift common to them is taken out:
    :func:`without_common_drift`): :func:`paired`'s result, a long call's in-situ check's live slices, and the
    pooled rounds of undecided in-situ checks (:mod:`attnforge.dispatch.insitu`)."""
    return without_common_drift({name: per_call_rounds(times, first_call_s=first_call_s[name], method=method)
                                 for name, times in rounds.items()})


def timed_call(fn: Callable[[], Any], *, sync: Callable[[], None] = lambda: None,
               clock: Callable[[], float] = time.perf_counter) -> tuple[float, Any]:
    """``fn()`` and its wall time in ms between two device syncs, host time included (one call as the caller
    issues it): :func:`paired`'s estimate, and each live call a long call's in-situ check times
    (:mod:`attnforge.dispatch.insitu`)."""
    sync()
    start = clock()
    out = fn()
    sync()
    return (clock() - start) * 1e3, out


def per_call_rounds(times_ms: list[float], *, first_call_s: float,
                    method: TimerMethod = TimerMethod.BACK_TO_BACK) -> Timing:
    """One :class:`Timing` of per-call times, each time a round of its own (so their spread is the noise
    :func:`attnforge.ranking.beats` weighs): :func:`paired`'s result, and a long call's in-situ check's."""
    return combine_rounds([summarize([x], warmup_calls=0, first_call_s=first_call_s, input_sets=1,
                                     method=method) for x in times_ms])


def batch_size(estimate_ms: float, *, target_ms: float = BATCH_MS, least: int = MIN_BATCH) -> int:
    """Calls per back-to-back batch for a call estimated at ``estimate_ms`` (wall time, host cost included):
    enough to fill ``target_ms`` (:data:`BATCH_MS` by default), at least ``least`` (:data:`MIN_BATCH`; 1 for a
    held batch, whose first call is timed too), at most :data:`MAX_BATCH`."""
    return max(least, min(MAX_BATCH, math.ceil(target_ms / max(estimate_ms, 1e-6))))


def summarize(times_ms: list[float], *, warmup_calls: int, first_call_s: float, input_sets: int,
              method: TimerMethod) -> Timing:
    """Median and spread of the repetition times (``statistics.quantiles``, inclusive method)."""
    ordered = sorted(times_ms)
    if len(ordered) >= 2:
        deciles = statistics.quantiles(ordered, n=10, method="inclusive")
        p20, p80 = deciles[1], deciles[7]
    else:
        p20 = p80 = ordered[0]
    median = statistics.median(ordered)
    return Timing(median_ms=median, min_ms=ordered[0], p20_ms=p20, p80_ms=p80, reps=len(ordered),
                  warmup_calls=warmup_calls, first_call_s=first_call_s, input_sets=input_sets, method=method,
                  rounds_ms=(median,))


class _Rotation:
    def __init__(self, sets: int) -> None:
        self.sets = max(1, sets)
        self.i = -1

    def next(self) -> int:
        self.i = (self.i + 1) % self.sets
        return self.i


def _wall(step: Step, counter: _Rotation, reps: int, sync: Callable[[], None],
          clock: Callable[[], float]) -> list[float]:
    times = []
    for _ in range(reps):
        i = counter.next()
        start = clock()
        step(i)
        sync()
        times.append((clock() - start) * 1e3)
    return times


def _back_to_back(step: Step, counter: _Rotation, reps: int, batch: int, *, sync: Callable[[], None],
                  marks: Marks) -> list[float]:
    """Per repetition, ``batch`` calls queued back to back after a synchronize, timed from the end of the first
    to the end of the last (``marks``), per timed call (``batch - 1`` of them; ``batch >= 2``)."""
    times = []
    sync()
    for _ in range(reps):
        step(counter.next())  # untimed: nothing ran before it, so its host time would be device idle time
        start = marks.mark()
        for _ in range(batch - 1):
            step(counter.next())
        end = marks.mark()
        sync()
        times.append(marks.ms_between(start, end) / (batch - 1))
    return times


#: a held batch's hold, as a multiple of the batch's estimated wall time (its first), then of the host time its last
#: batch took to issue (each later one): long enough that the issue ends before the hold does
HOLD_MARGIN = 1.5


def _held(step: Step, counter: _Rotation, reps: int, batch: int, *, hold_ms: float, sync: Callable[[], None],
          marks: Marks, hold: Hold, clock: Callable[[], float]) -> list[tuple[float, float]]:
    """Per repetition, ``batch`` calls issued while ``hold`` keeps the device busy: the device's time per call
    between two marks around them, and the host's time per call to issue them (:attr:`TimerMethod.HELD`,
    :func:`held_times`). The hold covers the issue: ``hold_ms`` for the first repetition (:func:`next_hold_ms`),
    then :data:`HOLD_MARGIN` times the host time the last one took (a call whose kernels outlast its issue holds
    little)."""
    out = []
    for _ in range(reps):
        sync()
        hold.hold(hold_ms + 0.05)
        start = marks.mark()
        t0 = clock()
        for _ in range(batch):
            step(counter.next())
        host_ms = (clock() - t0) * 1e3
        end = marks.mark()
        sync()
        out.append((marks.ms_between(start, end) / batch, host_ms / batch))
        hold_ms = next_hold_ms(host_ms / batch, batch)
    return out


def next_hold_ms(per_call_ms: float, batch: int) -> float:
    """The hold for a batch of ``batch`` calls whose issue took ``per_call_ms`` a call last time (or whose wall time
    estimates it, the first time): :data:`HOLD_MARGIN` times the batch's, at most :data:`MAX_HOLD_MS`."""
    return min(HOLD_MARGIN * per_call_ms * batch, MAX_HOLD_MS)


def held_times(timed: list[tuple[float, float]], *, host_counts: bool) -> list[float]:
    """Per call times of held batches (``(device ms, host ms)`` per call, each batch's): the device's, raised to
    the host's pace over all of them where ``host_counts`` and that is longer. A caller issuing the call back to
    back goes at the slower of the two paces; the host's is taken over every batch, not each, since a stall in one
    batch of four calls would read as that batch's pace while the caller's queue absorbs it."""
    host = statistics.fmean(h for _, h in timed) if timed and host_counts else 0.0
    return [max(device, host) for device, _ in timed]


def _cuda_events(step: Step, counter: _Rotation, reps: int, flush: int = 0) -> list[float]:
    import torch

    event = torch.cuda.Event
    pairs = [(event(enable_timing=True), event(enable_timing=True)) for _ in range(reps)]  # type: ignore[no-untyped-call]
    cache = torch.empty(flush, dtype=torch.int8, device="cuda") if flush else None
    for begin, end in pairs:
        i = counter.next()
        if cache is not None:
            cache.zero_()
        begin.record()
        step(i)
        end.record()
    torch.cuda.synchronize()
    return [float(begin.elapsed_time(end)) for begin, end in pairs]


def _do_bench(fn: Callable[[], object], config: TimingConfig) -> list[float]:
    from triton.testing import do_bench

    times = do_bench(fn, warmup=config.warmup_ms, rep=config.rep_ms, return_mode="all")
    return [float(t) for t in times]
