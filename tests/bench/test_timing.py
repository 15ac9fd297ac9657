"""The timing harness with a fake clock: first call apart, budgets, rotation, median."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from attnforge.bench.timing import TimerMethod, Timing, TimingConfig, measure, rotation_sets, summarize

CONFIG = TimingConfig(warmup_ms=10.0, rep_ms=50.0, min_reps=3, max_reps=100, method=TimerMethod.PERF_COUNTER)


class FakeKernel:
    """A step whose every call advances a fake clock by a chosen duration (seconds)."""

    def __init__(self, durations_s: list[float], default_s: float) -> None:
        self.now = 0.0
        self.durations_s = list(durations_s)
        self.default_s = default_s
        self.sets_used: list[int] = []

    def clock(self) -> float:
        return self.now

    def step(self, i: int) -> None:
        self.sets_used.append(i)
        self.now += self.durations_s.pop(0) if self.durations_s else self.default_s


def test_first_call_is_reported_apart_and_not_in_the_median() -> None:
    kernel = FakeKernel([30.0], default_s=0.002)  # a 30 s compile, then 2 ms calls
    t = measure(kernel.step, sets=3, config=CONFIG, clock=kernel.clock)
    assert t.first_call_s == pytest.approx(30.0)
    assert t.median_ms == pytest.approx(2.0)
    assert t.min_ms == pytest.approx(2.0)


def test_budgets_set_warmup_and_repetitions_from_the_estimate() -> None:
    kernel = FakeKernel([], default_s=0.002)
    t = measure(kernel.step, sets=2, config=CONFIG, clock=kernel.clock)
    assert t.warmup_calls == 5  # 10 ms / 2 ms
    assert t.reps == 25  # 50 ms / 2 ms
    assert len(kernel.sets_used) == 1 + 3 + 5 + 25  # first, estimate, warm-up, timed


@pytest.mark.parametrize(("call_s", "want_reps"), [
    pytest.param(1.0, 3, id="slow-call-min-reps"),
    pytest.param(1e-6, 100, id="fast-call-max-reps"),
])
def test_repetitions_are_bounded(call_s: float, want_reps: int) -> None:
    kernel = FakeKernel([], default_s=call_s)
    assert measure(kernel.step, sets=1, config=CONFIG, clock=kernel.clock).reps == want_reps


def test_calls_rotate_through_every_input_set_in_turn() -> None:
    kernel = FakeKernel([], default_s=0.002)
    t = measure(kernel.step, sets=4, config=CONFIG, clock=kernel.clock)
    assert t.input_sets == 4
    assert kernel.sets_used[:8] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert all(b == (a + 1) % 4 for a, b in zip(kernel.sets_used, kernel.sets_used[1:], strict=False))


def test_a_slow_neighbour_during_the_estimate_does_not_shrink_the_budget() -> None:
    kernel = FakeKernel([0.5, 0.5, 0.002], default_s=0.002)  # first call, then one slow estimate call
    t = measure(kernel.step, sets=2, config=CONFIG, clock=kernel.clock)
    assert t.reps == 25


def test_median_and_spread_of_outliers() -> None:
    t = summarize([1.0, 1.0, 1.0, 1.0, 100.0], warmup_calls=0, first_call_s=0.0, input_sets=1,
                  method=TimerMethod.PERF_COUNTER)
    assert t.median_ms == 1.0
    assert t.p20_ms == 1.0
    assert t.p80_ms > 1.0


def test_errors_of_the_step_propagate() -> None:
    def boom(i: int) -> None:
        raise RuntimeError("CUDA out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        measure(boom, sets=1, config=CONFIG)


@pytest.mark.parametrize(("set_bytes", "l2", "budget", "want"), [
    pytest.param(64 << 20, 50 << 20, None, 2, id="h200-paper-shape-one-set-exceeds-l2"),
    pytest.param(1 << 20, 50 << 20, None, 64, id="tiny-shape-capped"),
    pytest.param(10 << 20, 50 << 20, None, 10, id="ten-sets-twice-l2"),
    pytest.param(10 << 20, 50 << 20, 35 << 20, 3, id="memory-budget"),
    pytest.param(10 << 20, 50 << 20, 1 << 20, 1, id="budget-below-one-set"),
    pytest.param(1 << 10, None, None, 2, id="cpu-two-sets"),
])
def test_rotation_sets(set_bytes: int, l2: int | None, budget: int | None, want: int) -> None:
    assert rotation_sets(set_bytes=set_bytes, l2_bytes=l2, budget_bytes=budget) == want


class QueuedKernel:
    """A GPU at the seam: each call costs ``host_ms`` of host time and queues ``kernel_ms`` of device work that
    starts when the device is free; ``sync`` waits for the queue (the fake clock jumps to its end)."""

    def __init__(self, host_ms: float, kernel_ms: float) -> None:
        self.now = self.device_free = 0.0
        self.host_s, self.kernel_s = host_ms / 1e3, kernel_ms / 1e3

    def clock(self) -> float:
        return self.now

    def step(self, _i: int) -> None:
        self.now += self.host_s
        self.device_free = max(self.device_free, self.now) + self.kernel_s

    def sync(self) -> None:
        self.now = max(self.now, self.device_free)

    # the marks of a CUDA event recorded on the stream: reached when the work queued before it is done
    def mark(self) -> float:
        return max(self.now, self.device_free)

    def ms_between(self, start: float, end: float) -> float:
        return (end - start) * 1e3


def test_back_to_back_counts_the_host_cost_of_a_kernel_shorter_than_its_launch() -> None:
    """Issue 30: FA3's/FA4's Python entries cost 90-300 us per call against 24-79 us for SDPA; a kernel that
    is shorter on the device but slower to issue must measure slower, as the model sees it."""
    config = TimingConfig(warmup_ms=1.0, rep_ms=20.0, min_reps=3, max_reps=100, method=TimerMethod.BACK_TO_BACK)
    short_kernel, sdpa = QueuedKernel(host_ms=0.09, kernel_ms=0.05), QueuedKernel(host_ms=0.03, kernel_ms=0.07)
    t_short = measure(short_kernel.step, sets=1, config=config, sync=short_kernel.sync, clock=short_kernel.clock,
                      marks=short_kernel)
    t_sdpa = measure(sdpa.step, sets=1, config=config, sync=sdpa.sync, clock=sdpa.clock, marks=sdpa)
    assert t_short.median_ms == pytest.approx(0.09, rel=0.05)  # the host's pace, not the kernel's 0.05 ms
    assert t_sdpa.median_ms == pytest.approx(0.07, rel=0.1)  # the device's pace: launches overlap the kernels
    assert t_short.median_ms > t_sdpa.median_ms
    assert t_short.reps >= 3 and t_short.method is TimerMethod.BACK_TO_BACK


@pytest.mark.parametrize(("host_ms", "kernel_ms"), [(0.3, 1.7), (0.09, 1.6), (0.6, 0.43), (0.02, 0.05)])
def test_back_to_back_times_a_call_issued_while_its_predecessor_runs(host_ms: float, kernel_ms: float) -> None:
    """A call costs the longer of its host time and its kernel's, as in a model whose earlier layers keep the device
    busy: the batch's first call, issued to an idle device, is not timed. Timed from the batch's start, a two-call
    batch of a 1.7 ms kernel with 0.3 ms of host time read 1.85 ms a call (on an H200, Flux-dev's fwd+bwd read
    2.4-9.3 % over its CUDA-event times that way, docs/benchmarks.md "twenty-first session")."""
    config = TimingConfig(warmup_ms=1.0, rep_ms=20.0, min_reps=3, max_reps=100, method=TimerMethod.BACK_TO_BACK)
    kernel = QueuedKernel(host_ms=host_ms, kernel_ms=kernel_ms)
    t = measure(kernel.step, sets=1, config=config, sync=kernel.sync, clock=kernel.clock, marks=kernel)
    assert t.median_ms == pytest.approx(max(host_ms, kernel_ms), rel=1e-6)


def test_back_to_back_batches_time_at_least_one_call_after_the_first() -> None:
    from attnforge.bench.timing import MIN_BATCH, batch_size

    assert MIN_BATCH == 2  # the in-situ check's three batches of two routes stay under 100 ms for a 7 ms call
    assert batch_size(5.0) == MIN_BATCH  # a long call: the untimed first and one timed
    assert batch_size(0.001) == 64  # a call the clock barely sees fills the batch's cap, not thousands
    assert batch_size(0.5) == 4 and batch_size(0.5, target_ms=8.0) == 16  # the in-situ check's longer batches
    assert batch_size(5.0, target_ms=8.0) == MIN_BATCH


def test_host_marks_time_calls_that_run_synchronously() -> None:
    """On a CPU a call has done its work when it returns: the host clock is the mark."""
    from attnforge.bench.timing import HostMarks, marks_for

    kernel = FakeKernel([], default_s=0.004)
    config = TimingConfig(warmup_ms=1.0, rep_ms=40.0, min_reps=3, max_reps=100, method=TimerMethod.BACK_TO_BACK)
    t = measure(kernel.step, sets=1, config=config, clock=kernel.clock)  # marks default to HostMarks(clock)
    assert t.median_ms == pytest.approx(4.0)
    import torch

    assert isinstance(marks_for(torch.device("cpu"), kernel.clock), HostMarks)  # cuda marks: test_autotune's


class HiccupKernel(QueuedKernel):
    """:class:`QueuedKernel` whose host time per call cycles through ``host_ms`` (a host that stalls now and then),
    and a :class:`~attnforge.bench.timing.Hold` of its own queue (a sleep kernel: device work, no host time)."""

    def __init__(self, host_ms: list[float], kernel_ms: float) -> None:
        super().__init__(host_ms[0], kernel_ms)
        self.hosts = [h / 1e3 for h in host_ms]
        self.calls = 0

    def step(self, _i: int) -> None:
        self.host_s = self.hosts[self.calls % len(self.hosts)]
        self.calls += 1
        super().step(_i)

    def hold(self, ms: float) -> None:
        self.device_free = max(self.device_free, self.now) + ms / 1e3


#: the H200's FlashAttention-3 fwd+bwd route at 1k keys (docs/benchmarks.md "twenty-sixth session"): 0.466 ms of
#: device time a call, its host time mostly under that, with a stall now and then
HICCUPS = [0.25, 0.25, 0.25, 0.25, 1.05]


def test_a_held_batch_times_the_device_where_host_stalls_left_a_back_to_back_batch_idle() -> None:
    held_config = TimingConfig(warmup_ms=1.0, rep_ms=20.0, min_reps=3, max_reps=100, method=TimerMethod.HELD)
    b2b_config = TimingConfig(warmup_ms=1.0, rep_ms=20.0, min_reps=3, max_reps=100, method=TimerMethod.BACK_TO_BACK)
    k1, k2 = HiccupKernel(HICCUPS, 0.466), HiccupKernel(HICCUPS, 0.466)
    held = measure(k1.step, sets=1, config=held_config, sync=k1.sync, clock=k1.clock, marks=k1, hold=k1)
    b2b = measure(k2.step, sets=1, config=b2b_config, sync=k2.sync, clock=k2.clock, marks=k2)
    # the host's mean (0.41 ms) stays under the device's: every repetition reads the device's time
    assert held.median_ms == pytest.approx(0.466, rel=1e-6) and held.p80_ms == pytest.approx(0.466, rel=1e-6)
    assert held.method is TimerMethod.HELD
    assert b2b.p80_ms > 1.2 * 0.466  # back to back, a stall left the device idle inside some batches


@pytest.mark.parametrize(("host_ms", "kernel_ms"), [(0.3, 1.7), (0.09, 0.05), (0.6, 0.43), (0.02, 0.05)])
def test_a_held_call_costs_the_longer_of_its_device_and_host_time(host_ms: float, kernel_ms: float) -> None:
    """As back to back (a kernel shorter than its launch measures its launch), without the interplay."""
    config = TimingConfig(warmup_ms=1.0, rep_ms=20.0, min_reps=3, max_reps=100, method=TimerMethod.HELD)
    kernel = HiccupKernel([host_ms], kernel_ms)
    t = measure(kernel.step, sets=1, config=config, sync=kernel.sync, clock=kernel.clock, marks=kernel, hold=kernel)
    assert t.median_ms == pytest.approx(max(host_ms, kernel_ms), rel=1e-6)


def test_held_without_a_hold_times_back_to_back() -> None:
    """A CPU has no queue to hold: the held method falls back to back-to-back batches, and says so."""
    config = TimingConfig(warmup_ms=1.0, rep_ms=20.0, min_reps=3, max_reps=100, method=TimerMethod.HELD)
    kernel = QueuedKernel(host_ms=0.09, kernel_ms=0.05)
    t = measure(kernel.step, sets=1, config=config, sync=kernel.sync, clock=kernel.clock, marks=kernel)
    assert t.median_ms == pytest.approx(0.09, rel=0.05) and t.method is TimerMethod.BACK_TO_BACK


def test_paired_held_batches_count_the_device_alone_for_a_caller_that_hides_the_host() -> None:
    """A route with a costly entry (0.2 ms of host time, a 0.05 ms kernel) against SDPA (0.03 / 0.07): where the
    caller's host time counts it is slower, where the caller hides it (``host_counts=False``) it is faster."""
    from attnforge.bench.timing import paired

    gpu = HiccupKernel([0.2], 0.05)

    def route(_i: int) -> None:
        gpu.hosts, gpu.kernel_s = [0.2e-3], 0.05e-3
        gpu.step(0)

    def sdpa(_i: int) -> None:
        gpu.hosts, gpu.kernel_s = [0.03e-3], 0.07e-3
        gpu.step(0)

    steps = {"fa": route, "sdpa": sdpa}
    counted = paired(steps, pairs=3, max_call_ms=7.0, sync=gpu.sync, clock=gpu.clock, marks=gpu, hold=gpu)
    hidden = paired(steps, pairs=3, max_call_ms=7.0, sync=gpu.sync, clock=gpu.clock, marks=gpu, hold=gpu,
                    host_counts=False)
    assert counted is not None and hidden is not None
    assert counted["fa"].median_ms == pytest.approx(0.2) and counted["sdpa"].median_ms == pytest.approx(0.07)
    assert hidden["fa"].median_ms == pytest.approx(0.05) and hidden["sdpa"].median_ms == pytest.approx(0.07)
    assert counted["fa"].method is TimerMethod.HELD


def test_paired_takes_a_drift_both_routes_shared_out_of_their_noise() -> None:
    """The in-situ check's rounds (:func:`paired`): the device running 10-15 % slow or fast from one round to the
    next (its clock) moves both routes' batches in that round alike. The medians and spreads stay as timed; the noise
    the tie margin weighs is the routes' own, none here, so a route 5 % faster beats SDPA instead of tying with it."""
    from attnforge.bench.timing import paired
    from attnforge.ranking import Measurement, beats

    gpu = HiccupKernel([0.01], 0.1)
    drift = (1.0, 1.15, 0.9, 1.1, 0.95)
    held: list[float] = []
    hold = gpu.hold

    def counting_hold(ms: float) -> None:  # one hold a batch: a round is two batches (the estimates hold none)
        held.append(ms)
        hold(ms)

    gpu.hold = counting_hold  # type: ignore[method-assign]

    def at(kernel_ms: float) -> Callable[[int], object]:
        def step(_i: int) -> None:
            gpu.kernel_s = kernel_ms * drift[min(max(len(held) - 1, 0) // 2, len(drift) - 1)] / 1e3
            gpu.step(0)
        return step

    timings = paired({"fa": at(0.095), "sdpa": at(0.1)}, pairs=len(drift), max_call_ms=7.0, sync=gpu.sync,
                     clock=gpu.clock, marks=gpu, hold=gpu, host_counts=False)
    assert timings is not None and len(held) == 2 * len(drift)
    fa, sdpa = timings["fa"], timings["sdpa"]
    assert fa.hi_ms / fa.lo_ms == pytest.approx(1.15 / 0.9, rel=1e-6)  # the rounds as timed
    assert fa.mad_ms == pytest.approx(0.0, abs=1e-9) and sdpa.mad_ms == pytest.approx(0.0, abs=1e-9)

    def measured(name: str, t: Timing) -> Measurement:
        return Measurement(backend=name, tflops=1 / t.median_ms, tflops_lo=1 / t.hi_ms, tflops_hi=1 / t.lo_ms,
                           noise=t.mad_ms / t.median_ms)

    assert beats(measured("fa", fa), measured("sdpa", sdpa))


def test_paired_stops_at_the_first_call_over_the_limit() -> None:
    """The in-situ check's estimate (:func:`paired`): a route whose one call passes ``max_call_ms`` ends the check
    before any other route is called, since each further call only adds to the caller's wait (a Wan-720p fwd+bwd
    class on an H200: ~115 ms the route, ~137 ms SDPA)."""
    from attnforge.bench.timing import paired

    now = [0.0]
    calls: list[str] = []

    def step(name: str, ms: float) -> Callable[[int], object]:
        def run(_i: int) -> None:
            calls.append(name)
            now[0] += ms / 1e3
        return run

    steps = {"fa": step("fa", 115.0), "sdpa": step("sdpa", 137.0)}
    assert paired(steps, pairs=3, max_call_ms=7.0, clock=lambda: now[0]) is None
    assert calls == ["fa"]
    calls.clear()
    short = paired({"fa": step("fa", 1.0), "sdpa": step("sdpa", 1.2)}, pairs=2, max_call_ms=7.0, clock=lambda: now[0])
    assert short is not None and set(calls) == {"fa", "sdpa"} and calls[:2] == ["fa", "sdpa"]  # both estimated
