"""The in-situ check (issue 30): after a non-SDPA route has served :data:`SAMPLE_AFTER` calls of a shape class,
it is timed against plain SDPA on a live call, and the class reverts to SDPA unless the route is faster beyond
the noise (:func:`attnforge.ranking.beats`): a tie goes to SDPA, as it does at first use
(:mod:`attnforge.dispatch.policy`), so a route that only matches SDPA in the model never serves it with its higher
host cost and its noisier timings. Why the tie rule: on an H200 (2026-11-30, docs/benchmarks.md "twenty-fourth
session") a D64 causal fwd+bwd class on bshd tensors kept FlashAttention-3 after its check and ran 0.945x of SDPA
in the grid (its timings spread 33 % round to round), under the old rule (revert only where SDPA wins beyond the
noise). A tie is only final when more rounds could not settle it: where the route leads by more than
:data:`attnforge.ranking.MIN_MARGIN` but within the noise of the rounds so far, the class is checked again after
another :data:`SAMPLE_AFTER` calls (a long call's on its next live calls), the rounds pooled, until one side wins
beyond the noise or :data:`MAX_ROUNDS` rounds leave it tied (then SDPA). With three rounds a lead of 12 % was a
tie: on an H200 (2026-12-02, docs/benchmarks.md "thirty-ninth session") the 16k forward's class on ``[B, H, S,
D]`` tensors reverted FlashAttention-3 (4.49 against 5.04 ms, noise 3.6 % each: a 15 % margin) after first use had
timed it 9 % faster over 14 rounds, and ``attention()`` ran 0.94x the best from then on.

Why: a measurement taken once (bench, or first use) can mislead in the model: the host's pace at that moment,
another layout, a kernel whose Python entry costs more than its run (docs/benchmarks.md: FA3's and FA4's entries
90-300 us of host time per call, SDPA's 24-79 us; issue 30's D256 forward, 0.68x of SDPA through
``attention()``). The check times the two routes as the model issues them: :func:`attnforge.bench.timing.paired`,
a few interleaved batches on the caller's own tensors (forward + backward on detached copies for a call that needs
grad), on the calling thread, bounded (about ``2 * PAIRS`` batches of :data:`CHECK_BATCH_MS` ms each back to back, or
of two calls where a call is longer than half that; on a GPU held batches of :data:`HELD_BATCH_MS` ms, each behind
its hold: under 100 ms). On a GPU a call counts the longer of its device time and its host time, or its device time
alone where the caller kept the device busy through the class's counted calls (:class:`CallerPace`: a model's
layers hide a route's host time). A call that takes
more than :data:`MAX_CALL_MS` and needs no gradient (a diffusion model's) is checked on its class's next live calls
instead, :data:`SLICES` served by SDPA and as many by the route, each timed between two syncs: no extra call at all
(:class:`_Sampler`); a call that needs a gradient is not checked where its forward and backward would take that
long (its live forward's time times :data:`GRAD_COST_FACTOR`): the check itself would run them. It never runs
while ``torch.compile`` traces or a CUDA graph captures (:func:`attnforge.dispatch.autotune.capturing`), nor when
measuring is off (``ATTNFORGE_AUTOTUNE=0``).

A revert is written as two records of the class (``run_id`` ``insitu-...``, the route's and SDPA's live timings),
which supersede every older record of the class of the backends on the route's side (exact or quantized), at any
length (:func:`attnforge.ranking.class_measurements`: a third backend of that side measured before is unmeasured
again, so it follows SDPA), so the decision persists across processes; ``explain()`` says
so on SDPA's line. A class is checked once per process and memory layout, unless its check is undecided (above).

Where every sampled call had one shape (a fixed-size cache, a benchmark loop, a fixed resolution), SDPA is timed as
a long run of that shape gets it (:meth:`~attnforge.backends._base.AdapterBase.settle_repeated`): its decode path
serves a shape's first meetings without cuDNN (a graph per new length), and at a repeated length cuDNN's cached
graph is the faster kernel (the grid's decode GQA cell on an H200, 2026-11-28: FlashAttention-4 chosen at first
use, 87.5 µs a call, plain SDPA 62.9). Classes whose calls vary (a decode loop's growing cache) time SDPA as that
loop gets it.
"""

from __future__ import annotations

import functools
import uuid
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from attnforge.backends.adapter import AttentionCall, BackendAdapter
from attnforge.backends.exact import EXACT
from attnforge.bench.flops import BACKWARD_FACTOR
from attnforge.bench.timing import BATCH_MS
from attnforge.dispatch import autotune
from attnforge.dispatch.policy import FALLBACK, Decision, class_of_call, shape_of_call

#: calls of a class a non-SDPA route serves before it is checked
SAMPLE_AFTER = 64
#: interleaved rounds of the check (each: one back-to-back batch of the route, one of SDPA)
PAIRS = 3
#: a call longer than this (ms) is checked in slices (:data:`SLICES`) instead of back-to-back batches, whose extra
#: calls would be a stall: a call this long makes 14 extra calls (one estimate a side, then ``2 * PAIRS`` batches of
#: two), 98 ms, under issue 30's 100 ms for any call after warm-up (at 8 ms, the limit until 2026-11-30: 112 ms)
MAX_CALL_MS = 7.0
#: live calls of the route and of SDPA each that a long call's check times: the check makes no call of its own
SLICES = 3
#: rounds a check may pool (checks of :data:`PAIRS` rounds, or :data:`SLICES` live calls a side) while the route's
#: lead is within their noise: first use's five rounds and the ten further ones it gives a contested class
#: (:data:`attnforge.dispatch.autotune.CONTESTED_ROUNDS`), after which a tie goes to SDPA. Fifteen rounds weigh
#: each noise at 0.48 of three rounds' (:func:`attnforge.ranking.rounds_factor`)
MAX_ROUNDS = 15
#: a call that needs a gradient: its forward and backward over its forward alone, the FLOP ratio of
#: :data:`attnforge.bench.flops.BACKWARD_FACTOR` (FlashAttention-2 paper); the check's calls run both, the live call
#: times the forward
GRAD_COST_FACTOR = 1.0 + BACKWARD_FACTOR
#: the wall time (ms) each of the check's back-to-back batches aims at: four times bench's
#: (:data:`attnforge.bench.timing.BATCH_MS`), so a round of a 0.5 ms call averages ~16 calls, not 3. With 2 ms
#: batches the check on an H200 (2026-11-30, docs/benchmarks.md "twenty-fifth session") timed an MHA 1k fwd+bwd
#: class's FlashAttention-4 route 0.5425 against SDPA 0.5472 ms with its rounds 5-7 % apart, a tie, and reverted
#: it, while the grid's longer rounds timed the same route 8 % faster. The check's cost stays under a long call's:
#: ``2 * PAIRS`` batches of at most this plus one call (~50-80 ms for a 1-4 ms call), against 98 ms for a
#: :data:`MAX_CALL_MS` call (two calls a batch, :data:`attnforge.bench.timing.MIN_BATCH`)
CHECK_BATCH_MS = 8.0
#: the calls each held batch aims at (ms) on a GPU (:attr:`attnforge.bench.timing.TimerMethod.HELD`): bench's, since
#: a held batch costs its hold too (about its own host time) and its device time needs no long batch to average
#: the host's hiccups out
HELD_BATCH_MS = BATCH_MS
#: the share of a class's counted calls that must have found the device still busy when they had issued their
#: work for the check to time device time alone. On an H200 (2026-11-30, docs/benchmarks.md "twenty-sixth
#: session") Llama-3-8B's and Qwen2.5-7B's forward and train classes read 59-61 of 63, Flux-dev's and Wan-2.1's 62
#: of 63 and 32 of 33, the grid's MHA 1k fwd+bwd loop 58 of 63; its causal one 5 of 63 and Qwen's GQA-7 train
#: class 33 of 63 (host time counts there)
DEVICE_BOUND = 0.9
#: counted calls the pace needs before it can say device-bound
PACE_CALLS = 16


@dataclass(slots=True, kw_only=True)
class _State:
    counts: dict[str, int] = field(default_factory=dict)
    checked: set[str] = field(default_factory=set)
    #: class -> the first call description its counted calls had; classes whose calls had another are in mixed
    first: dict[str, AttentionCall] = field(default_factory=dict)
    mixed: set[str] = field(default_factory=set)
    #: class -> the explain line of a revert
    reverted: dict[str, str] = field(default_factory=dict)
    #: class -> its caller's pace over the counted calls (:class:`CallerPace`)
    pace: dict[str, CallerPace] = field(default_factory=dict)
    #: class -> per backend, the per-call ms of each round its undecided checks timed (pooled by the next)
    pooled: dict[str, dict[str, list[float]]] = field(default_factory=dict)


class Undecided:
    """A check whose rounds leave the route ahead of SDPA by more than :data:`attnforge.ranking.MIN_MARGIN` but
    within their noise, with fewer than :data:`MAX_ROUNDS` rounds: the class is checked again, the rounds pooled."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNDECIDED"


#: the outcome of an undecided check (:class:`Undecided`)
UNDECIDED = Undecided()


@dataclass(slots=True)
class CallerPace:
    """Whether a class's counted calls issued their kernels while the device was still busy with the caller's
    earlier work: at each call on a CUDA device an event is recorded on the current stream before the route runs,
    and asked (``torch.cuda.Event.query``) once the route has issued its kernels. ``busy`` of ``seen`` calls found
    it not reached yet: the route's host time overlapped queued device work (hidden, device-bound), where a call
    that finds the device caught up added its host time to the caller's step (host-bound). The check times a
    device-bound caller's routes by their device time alone (:attr:`device_bound`, :func:`check`): on an H200
    (2026-11-30, docs/benchmarks.md "twenty-sixth session") its back-to-back fwd+bwd calls at 1k keys had spent
    300-520 µs of host time a call against 300-470 µs of FlashAttention-3's kernels, so it timed the host and
    reverted a route 8-16 % faster on the device, while the models' own calls kept the device busy through 59-62 of
    63 calls' issue. The cost: an event recorded and asked on each counted call (64 a class, then none)."""

    seen: int = 0
    busy: int = 0
    #: recorded at each call's entry (one event, made at the first CUDA call)
    event: Any = None

    def enter(self, device: Any) -> None:
        """Mark where the caller stands in ``device``'s queue before the route issues its work."""
        import torch

        if self.event is None:
            self.event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        self.event.record(torch.cuda.current_stream(device))

    def leave(self) -> None:
        """The route has issued its work: count whether the device was still before the mark."""
        self.seen += 1
        self.busy += not self.event.query()

    @property
    def device_bound(self) -> bool:
        """Whether this caller hides a call's host time: the device still busy with its earlier work when at least
        :data:`DEVICE_BOUND` of at least :data:`PACE_CALLS` counted calls had issued theirs."""
        return self.seen >= PACE_CALLS and self.busy >= DEVICE_BOUND * self.seen

    def describe(self) -> str:
        """For people: ``device busy through 61 of 63 calls' issue (device-bound caller)``."""
        if not self.seen:
            return "caller's pace not observed"
        kind = ("too few calls to tell" if self.seen < PACE_CALLS else "device-bound" if self.device_bound else
                "host-bound" if self.busy <= (1 - DEVICE_BOUND) * self.seen else "mixed")
        return f"device busy through {self.busy} of {self.seen} calls' issue ({kind} caller)"


def caller_pace(dispatcher: Any) -> dict[str, CallerPace]:
    """Per checked or counted class of ``dispatcher``: its caller's pace (:class:`CallerPace`)."""
    state = _STATE.get(dispatcher)
    return dict(state.pace) if state is not None else {}


_STATE: weakref.WeakKeyDictionary[Any, _State] = weakref.WeakKeyDictionary()


@functools.lru_cache(maxsize=4096)
def _key(call: AttentionCall) -> str:
    """The class a revert applies to, in the call's memory layout (a class is measured and decided per layout:
    :func:`attnforge.dispatch.policy.measurements`, and a revert's records carry the layout checked; one check for
    both layouts left the other layout's route unchecked for the process); kept per call description (formatting the
    class costs ~6 µs, and a call with features asks on every call: its route is bound per call)."""
    return f"{class_of_call(call)}|{call.precision}|{call.device_type}|{call.layout}"


def sampled(dispatcher: Checked, steps: tuple[tuple[BackendAdapter, Callable[..., Any]], ...], call: AttentionCall,
            decision: Decision, *, bshd: bool = False) -> tuple[tuple[BackendAdapter, Callable[..., Any]], ...]:
    """The route's steps, the first one counting its calls when it is a non-SDPA backend that a class-level
    measurement put there and SDPA may serve the call (then the check runs at call :data:`SAMPLE_AFTER`);
    ``bshd``: the route takes ``[B, S, H, D]`` tensors."""
    if not steps or len(steps) < 2 or FALLBACK not in decision.order:
        return steps
    first, fn = steps[0]
    if first.name in (FALLBACK, EXACT) or decision.ranking is None or first.name not in decision.ranking.measurements:
        return steps
    state = _STATE.setdefault(dispatcher, _State())
    key = _key(call)
    if key in state.checked:
        return steps
    adapter, sdpa = next((a, f) for a, f in steps if a.name == FALLBACK)
    counting = _Sampler(dispatcher, state=state, key=key, call=call, name=first.name, fn=fn, sdpa=sdpa,
                        settle=_settler(adapter, bshd=bshd, causal=call.causal))
    return ((first, counting), *steps[1:])


def wraps(step: Callable[..., Any]) -> bool:
    """Whether a route's step is :func:`sampled`'s counting wrapper (so its backend may not be called around it)."""
    return isinstance(step, _Sampler)


def annotate(dispatcher: Any, decision: Decision, call: AttentionCall) -> Decision:
    """The decision with the in-situ revert of its class, if any, said on SDPA's line."""
    state = _STATE.get(dispatcher)
    line = state.reverted.get(_key(call)) if state is not None else None
    if line is None or FALLBACK not in decision.order:
        return decision
    i = decision.order.index(FALLBACK)
    basis = list(decision.basis)
    basis[i] = f"{basis[i]}; {line}"
    return replace(decision, basis=tuple(basis))


class Checked(Protocol):
    """What the check needs of the dispatcher (:class:`attnforge.dispatch.dispatcher.Dispatcher`)."""

    def _device(self, device: Any) -> Any: ...  # its ``.key``: the records' device key

    def _source(self) -> Any: ...  # the record store

    def versions(self) -> dict[str, str | None]: ...

    def take_records(self, device_key: str, records: Sequence[Any]) -> None: ...

    def forget_feature_plans(self, which: Callable[[AttentionCall], bool]) -> None: ...


def _settler(adapter: BackendAdapter, *, bshd: bool, causal: bool) -> Callable[[Any, Any, Any], bool]:
    """SDPA's :meth:`~attnforge.backends._base.AdapterBase.settle_repeated` for the route's tensors (``[B, S, H,
    D]`` ones seen as the adapter receives them)."""
    settle = getattr(adapter, "settle_repeated", None)
    if settle is None:
        return lambda q, k, v: False
    if bshd:
        return lambda q, k, v: bool(settle(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal))
    return lambda q, k, v: bool(settle(q, k, v, causal=causal))


class _Sampler:
    """A route's first step that counts the calls of its class and runs the check once.

    The call is timed first, as it is served (the live call, on the route). One that needs a gradient is not
    checked where its forward and backward would take longer than :data:`MAX_CALL_MS` (the live forward's time times
    :data:`GRAD_COST_FACTOR`): every call of its check would run both. One that needs none and takes longer than
    :data:`MAX_CALL_MS` (a diffusion model's attention: Wan-2.1's self-attention is 8-17 ms on an H200),
    back-to-back batches of extra calls would stall the caller, so the check times the class's next live calls
    instead, :data:`SLICES` on SDPA and as many on the route, alternating: each served call is the caller's, none
    is extra, and the cost is two device syncs a call. On an H200 (2026-11-29, docs/benchmarks.md "fifteenth
    session") a route that ran FlashAttention-4's kernel twice a call made Wan's step 0.74x diffusers' default while
    its warm-up had measured FA4 fastest; no check ran, its calls being over the limit."""

    __slots__ = ("call", "dispatcher", "done", "fn", "key", "name", "sdpa", "settle", "slices", "state")

    def __init__(self, dispatcher: Checked, *, state: _State, key: str, call: AttentionCall, name: str,
                 fn: Callable[..., Any], sdpa: Callable[..., Any],
                 settle: Callable[[Any, Any, Any], bool] = lambda q, k, v: False) -> None:
        self.dispatcher, self.state, self.key, self.call = dispatcher, state, key, call
        self.name, self.fn, self.sdpa, self.settle = name, fn, sdpa, settle
        #: a long call's check under way: the ms of each timed live call per backend (None: none under way)
        self.slices: dict[str, list[float]] | None = None
        #: the check kept the route: every later call goes straight to it
        self.done = False

    def __call__(self, q: Any, k: Any, v: Any) -> Any:
        if self.done:
            return self.fn(q, k, v)
        if self.slices is not None:
            return self._slice(q, k, v)
        state, key = self.state, self.key
        n = state.counts.get(key, 0) + 1
        state.counts[key] = n
        first = state.first.setdefault(key, self.call)
        if first is not self.call and first != self.call:
            state.mixed.add(key)
        if n >= SAMPLE_AFTER and key not in state.checked:
            return self._check(q, k, v)
        if not q.is_cuda or autotune.capturing():
            return self.fn(q, k, v)
        pace = state.pace.get(key) or state.pace.setdefault(key, CallerPace())
        pace.enter(q.device)
        out = self.fn(q, k, v)
        pace.leave()
        return out

    def _check(self, q: Any, k: Any, v: Any) -> Any:
        """Serve this call and run the check (or start a long call's, :meth:`_slice`)."""
        if autotune.active(q.device.type) is None or autotune.capturing():
            return self.fn(q, k, v)  # off, or capturing: not now (the next call of the class asks again)
        self.state.checked.add(self.key)
        ms, out = _timed(self.fn, q, k, v)  # the live call, timed as served
        if self.call.needs_grad and ms * GRAD_COST_FACTOR > MAX_CALL_MS:
            # the check's calls would run forward and backward: with its estimate alone, one call of each route, a
            # training step would wait beyond MAX_CALL_MS (Wan-2.1-720p on an H200, 2026-12-01: ~115 and ~137 ms a
            # fwd+bwd call), so such a class is not checked, as a long call that needs a gradient never was. One
            # timed forward decides: a slow sample leaves the class unchecked for the process, which costs nothing
            self._conclude(None)
            return out
        if ms > MAX_CALL_MS:
            self.slices = {self.name: [ms], FALLBACK: []}
            return out
        try:
            # every sampled call of one shape (a fixed-size cache, a benchmark loop, a fixed resolution): SDPA is
            # timed as a long run of that shape gets it (a decode step's cuDNN graph, built once here, untimed)
            if not self.call.features and self.key not in self.state.mixed and self.settle(q, k, v):
                self.sdpa(q, k, v)
            pooled = self.state.pooled.setdefault(self.key, {})
            reverted = check(self.dispatcher, (q, k, v), call=self.call, route=self.name, fn=self.fn, sdpa=self.sdpa,
                             pace=self.state.pace.get(self.key), pooled=pooled)
        except Exception:  # a failed check changes nothing: the route keeps serving
            reverted = None
        if reverted is UNDECIDED:  # checked again after another SAMPLE_AFTER calls, its rounds pooled
            self.state.checked.discard(self.key)
            self.state.counts[self.key] = 0
            return out
        self.state.pooled.pop(self.key, None)
        self._conclude(reverted)
        return out

    def _slice(self, q: Any, k: Any, v: Any) -> Any:
        """A long call's check, one live call at a time: the next call on whichever backend has fewer timings
        (the route first at a tie); after :data:`SLICES` of each, the verdict as :func:`check` gives it."""
        slices = self.slices
        if slices is None or autotune.active(q.device.type) is None or autotune.capturing():
            return self.fn(q, k, v)  # off, or capturing: this call is not timed
        name = FALLBACK if len(slices[FALLBACK]) < len(slices[self.name]) else self.name
        try:
            ms, out = _timed(self.sdpa if name == FALLBACK else self.fn, q, k, v)
        except Exception:
            if name != FALLBACK:
                raise  # the route's own failure: the dispatcher's to handle, as on any call
            self.slices = None  # SDPA raised on this call: no verdict, the route keeps serving
            self._conclude(None)
            return self.fn(q, k, v)
        slices[name].append(ms)
        timed = min(len(t) for t in slices.values())
        if timed >= SLICES and timed % SLICES == 0 and len(slices[FALLBACK]) == len(slices[self.name]):
            from attnforge.bench.timing import paired_rounds

            # live call i of SDPA and of the route ran next to each other: a round, as paired() times them
            timings = paired_rounds(slices, first_call_s={n: t[0] / 1e3 for n, t in slices.items()})
            try:
                reverted = verdict(self.dispatcher, q, call=self.call, route=self.name, timings=timings)
            except Exception:  # a failed check changes nothing: the route keeps serving
                reverted = None
            if reverted is UNDECIDED:  # SLICES more live calls a side, pooled with these
                return out
            self.slices = None
            self._conclude(reverted)
        return out

    def _conclude(self, reverted: str | Undecided | None) -> None:
        if isinstance(reverted, str):
            pace = self.state.pace.get(self.key)
            # verdict() handed its records over: the class decides again
            self.state.reverted[self.key] = f"{reverted}; {pace.describe()}" if pace is not None else reverted
            return
        # kept: this route passes its calls straight on from now (:attr:`done`), and nothing else is rebuilt. When every
        # route and decision was dropped here instead, Wan-2.1's next step on an H200 took 8 ms more (28.0 against
        # 19.8 ms, 2026-11-29, docs/benchmarks.md "sixteenth session"; likely the rebuilt route: its decision, then
        # FlashAttention-4's replay bound again), and every class of the process paid a rebuild at each check. Only
        # the class's remembered feature plans go: they were kept without their direct call while the sampler wrapped
        # their first step.
        self.done = True
        key = self.key
        self.dispatcher.forget_feature_plans(lambda call: _key(call) == key)


def _timed(fn: Callable[..., Any], q: Any, k: Any, v: Any) -> tuple[float, Any]:
    """``fn(q, k, v)`` and its wall ms (:func:`attnforge.bench.timing.timed_call`, the active autotune
    configuration's clock)."""
    from attnforge.bench.timing import timed_call

    config = autotune.active(q.device.type) or autotune.DEFAULT
    return timed_call(lambda: fn(q, k, v), sync=autotune.device_sync(q.device), clock=config.clock)


def check(dispatcher: Checked, tensors: tuple[Any, Any, Any], *, call: AttentionCall, route: str,
          fn: Callable[..., Any], sdpa: Callable[..., Any], clock: Callable[[], float] | None = None,
          pace: CallerPace | None = None, marks: Any = None, hold: Any = None,
          pooled: dict[str, list[float]] | None = None) -> str | Undecided | None:
    """Time ``route`` against SDPA on the caller's tensors (:data:`PAIRS` rounds, with ``pooled``'s earlier ones):
    :func:`verdict` on them.

    On a GPU the batches are held (:attr:`~attnforge.bench.timing.TimerMethod.HELD`, :data:`HELD_BATCH_MS` each).
    Where the caller kept the device busy through the issue of at least :data:`DEVICE_BOUND` of its class's counted
    calls (``pace``), the routes are timed by their device time alone: that caller hides their host time.
    Elsewhere a call costs the longer of its device and host time, as a caller issuing it back to back sees.

    Args:
        dispatcher: whose record source and device keys are used.
        tensors: the caller's ``(q, k, v)`` as the route receives them.
        call: the call's description; route: the backend serving it.
        fn, sdpa: the bound calls of the route's backend and of SDPA.
        clock: seconds, monotonic (the active autotune configuration's when None; a fake clock in tests).
        pace: the caller's pace over the class's counted calls (None: not observed).
        marks, hold: the batches' marks and hold (:func:`attnforge.bench.timing.marks_for` and
            :func:`~attnforge.bench.timing.hold_for` of the call's device when None; fakes in tests).
        pooled: per backend, the per-call ms of the rounds of this class's earlier undecided checks; this check's
            rounds are added to it (in place) and the verdict is taken on them all.

    Returns:
        The explain line of a revert (both timings stored), :data:`UNDECIDED`, or None (kept; nothing stored).
    """
    from attnforge.bench.timing import hold_for, marks_for, paired

    q = tensors[0]
    clock = clock or (autotune.active(q.device.type) or autotune.DEFAULT).clock
    steps = {route: autotune.step_of(fn, tensors, grad=call.needs_grad),
             FALLBACK: autotune.step_of(sdpa, tensors, grad=call.needs_grad)}
    sync = autotune.device_sync(q.device)
    hold = hold if hold is not None else hold_for(q.device)
    hidden = hold is not None and pace is not None and pace.device_bound
    timings = paired(steps, pairs=PAIRS, sync=sync, clock=clock, max_call_ms=MAX_CALL_MS,
                     marks=marks if marks is not None else marks_for(q.device, clock), hold=hold,
                     host_counts=not hidden, batch_ms=HELD_BATCH_MS if hold is not None else CHECK_BATCH_MS)
    if timings is None:
        return None
    if pooled is not None:
        from attnforge.bench.timing import paired_rounds

        for name, timing in timings.items():
            pooled.setdefault(name, []).extend(timing.rounds_ms)
        if len({len(r) for r in pooled.values()}) == 1:  # paired rounds, as each check timed them
            timings = paired_rounds(pooled, first_call_s={n: t.first_call_s for n, t in timings.items()},
                                    method=next(iter(timings.values())).method)
    return verdict(dispatcher, q, call=call, route=route, timings=timings,
                   basis="device time alone" if hidden else "")


def verdict(dispatcher: Checked, q: Any, *, call: AttentionCall, route: str, timings: dict[str, Any],
            basis: str = "") -> str | Undecided | None:
    """The check's outcome from the timings of ``route`` and SDPA (a :class:`~attnforge.bench.timing.Timing`
    each): None (nothing stored) where the route is faster than SDPA beyond the noise; :data:`UNDECIDED` where it
    leads by more than :data:`~attnforge.ranking.MIN_MARGIN` but within the noise and fewer than :data:`MAX_ROUNDS`
    rounds were timed (more rounds narrow the margin: :func:`attnforge.ranking.rounds_factor`); otherwise both are
    stored as records of the class (on which the policy then keeps SDPA: a candidate must beat it beyond the noise)
    and the explain line of the revert is returned. ``q``: the call's query (its device); ``basis``: what the
    timings count, said on the line when given ("device time alone")."""
    from attnforge.bench.flops import shape_flops, tflops
    from attnforge.ranking import LIVE_RUN_PREFIX, MIN_MARGIN, beats
    from attnforge.records import BenchRecord

    shape = shape_of_call(call)
    flops = shape_flops(shape)

    ours, sdpa = timings[route].measurement(route, flops), timings[FALLBACK].measurement(FALLBACK, flops)
    if beats(ours, sdpa):
        return None
    settled = beats(sdpa, ours) or ours.tflops <= sdpa.tflops * (1.0 + MIN_MARGIN)  # no more rounds would win it
    if not settled and (ours.rounds or 0) < MAX_ROUNDS:
        return UNDECIDED
    device_key = dispatcher._device(q.device).key
    versions = dispatcher.versions()
    run_id = LIVE_RUN_PREFIX + uuid.uuid4().hex[:8]
    records = [BenchRecord.measured(shape, device_key=device_key, backend=name, backend_version=versions.get(name),
                                    ms=timings[name].median_ms, tflops=tflops(flops, timings[name].median_ms),
                                    run_id=run_id, timing=timings[name]) for name in (route, FALLBACK)]
    store = dispatcher._source()
    if hasattr(store, "add_bench"):
        store.add_bench(records)
    dispatcher.take_records(device_key, records)  # every decision is dropped: the class decides again, on them
    why = "" if beats(sdpa, ours) else f": not faster than {FALLBACK} beyond the noise"
    counted = f", {basis}" if basis else ""
    return (f"reverted from {route} by an in-situ check on live calls{why} ({route} {timings[route].median_ms:.3f} "
            f"ms, {FALLBACK} {timings[FALLBACK].median_ms:.3f} ms per call{counted}, {run_id})")
