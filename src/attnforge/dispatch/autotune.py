"""Measure on first use, by default on a GPU: the first call of a shape class nobody measured times the eligible
verified candidates on its own tensors, stores the result, and later calls and processes reuse it.

The ``torch.backends.cudnn.benchmark`` model, with what it lacks: the result persists (the record store, under this
device's key and each backend's installed version, ``run_id`` ``autotune-...``), the decision survives noise
(:mod:`attnforge.ranking`), and the output never changes (only verified backends are candidates).

When: the dispatcher first decides a call whose shape class has an eligible backend without a measurement for the
installed version (or a quantized one held back only for lack of one). By default the measurement runs inside
that first call (``attnforge warmup`` does it ahead of time, as a deploy step). ``ATTNFORGE_AUTOTUNE=background``
(or ``autotune(background=True)``) runs it off the calling thread instead (:mod:`attnforge.dispatch.background`,
issue 30): the class is served meanwhile by its current best (:func:`provisional`: the recorded choice, else plain
SDPA), candidates compile and are timed on the worker, and the class switches to the measured winner when the
records are written (the dispatcher's routes are dropped then), so no call waits for a compile or a timing. It is
not the default because on an H100 (2026-11-26, docs/benchmarks.md) a process measuring in the background aborted
twice (``terminate called without an active exception``, once mid-run while FlashAttention-4 compiled CuTe DSL
kernels on the worker, once at exit), and the measurements competed with the model's own GPU work while they ran.
Leaving an ``autotune()`` context waits for the measurements started in it.
Code about to capture a CUDA graph holds the worker (:func:`quiet`). Shape classes bucket lengths to powers of
two (:class:`attnforge.types.shapes.ShapeClass`), so a decode loop with a growing KV cache, or varlen batches,
measure a handful of classes, not one per length; a class is measured once per process.

Where it is on:

- on CUDA tensors, by default; ``ATTNFORGE_AUTOTUNE=0`` turns it off everywhere (a recorded choice or plain
  SDPA then), ``ATTNFORGE_AUTOTUNE=1`` turns it on for CPU tensors too, ``ATTNFORGE_AUTOTUNE=background`` on CUDA
  off the calling thread;
- inside ``with attnforge.autotune(budget_s=..., rounds=...)`` for any device (unless the variable says 0);
- never while ``torch.compile`` traces or a CUDA graph captures (the recorded choice or plain SDPA serves).

What is not timed on first use: a backend whose kernel compiles on its first call per variant (``jit_per_variant``
in ``runtime.toml``: FlashAttention-4's CuTe DSL kernels). Measured on first use, the 200-call workload on an H200
compiled 24 of them in its first 20 calls, its longest call 8.4 s (docs/benchmarks.md, 2026-11-28, eighth
session): a model's request would wait for each. Such a backend stays unmeasured (it follows SDPA, and
``explain()`` says so) until ``attnforge warmup`` (``AutotuneConfig.compiling``), bench or background measuring
times it; a class measured without it is measured again by a later warm-up in the same process.

What is timed: exactly the route that will serve the call (:func:`attnforge.backends.bound.bound_call`, the same
layout, strides, arguments and wrapper), as the model issues it: in interleaved rounds through the one harness
(:func:`attnforge.bench.timing.measure`), each repetition a batch of calls issued while a sleep kernel holds the
device (:attr:`~attnforge.bench.timing.TimerMethod.HELD`: a call costs the longer of its device time and its host
time, so a kernel shorter than its own launch does not beat SDPA, and a host hiccup does not show as device idle
time in a call whose kernels outlast its issue; back to back on a CPU), within ``budget_s`` of repetitions per
class. The timing
runs leave the caller's tensors untouched (backward runs on detached copies with ``autograd.grad``, so nothing
accumulates in ``.grad``), and the output returned to the caller is computed afterwards by the route the policy
then chooses.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import time
import uuid
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from attnforge.backends._base import graph_capturing, saving_tensors
from attnforge.backends.adapter import AttentionCall, BackendAdapter
from attnforge.backends.exact import EXACT
from attnforge.dispatch import autotune_env, background
from attnforge.dispatch.policy import (
    FALLBACK,
    Decision,
    class_of_call,
    compiles_per_variant,
    quantizes,
    shape_of_call,
)
from attnforge.records import BenchRecord

if TYPE_CHECKING:
    from attnforge.bench.timing import TimingConfig


ENV = autotune_env.ENV
#: the variable's value that measures off the calling thread (opt-in: see the module docstring)
BACKGROUND = autotune_env.BACKGROUND
#: timed repetitions per candidate and round at most: the budget is an estimate, this bounds a bad one
MAX_REPS = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class AutotuneConfig:
    """How much one shape class may cost to measure.

    Attributes:
        budget_s: seconds of timed repetitions for all candidates of one class together (first calls, which
            include a JIT compile for some kernels, are not included; docs/benchmarks.md reports both).
        rounds: interleaved rounds per candidate (the MAD of their medians is the noise that
            :mod:`attnforge.ranking` weighs; five, so two slow rounds cannot move it).
        clock: seconds, monotonic (a fake clock in tests).
        background: measure on the worker thread while the class's current best serves (True), or inside the
            first call (False, the default; see the module docstring).
        compiling: inside the first call, also time candidates that compile their kernel on their first call
            (``jit_per_variant``: FlashAttention-4's CuTe DSL kernels, seconds a variant); ``attnforge warmup``
            sets it (a deploy step may take that time), measure-on-first-use leaves them out so that no call of a
            model waits for a compile to be measured. Off the calling thread (``background``) they are timed
            anyway.
        layouts: also measure a class that was measured only in the other memory layout
            (:func:`attnforge.dispatch.inputs.memory_layout`) in this call's one; ``attnforge warmup`` sets it.
            Otherwise such a class is decided on the other layout's measurements, and no call waits for a
            measurement it already has one of (the in-situ check then times the route on the call's own tensors).
        contested_rounds: further interleaved rounds of every candidate when the first ``rounds`` leave the class
            contested (:func:`attnforge.ranking.contested`: a tie handed to a lower-overhead path more than 2 %
            slower than the top), within another ``2 * budget_s``; :data:`CONTESTED_ROUNDS` where no call waits
            for them (``attnforge warmup``, a deploy step; measuring off the calling thread), 0 (measure-on-first-
            use inside a call, which the call would wait for) measures no further.
    """

    budget_s: float = 1.0
    rounds: int = 5
    clock: Callable[[], float] = time.perf_counter
    background: bool = False
    compiling: bool = False
    layouts: bool = False
    contested_rounds: int = 0


#: further interleaved rounds of a class its first rounds leave contested (:func:`attnforge.ranking.contested`)
#: where no call waits for them: H200, 2026-11-30, docs/benchmarks.md "thirtieth session": with fifteen rounds the
#: warm-up chose FlashAttention-3 for the Flux-length and 16k forwards that five had tied to SDPA at 0.89-0.93x the
#: best; with these ten ("thirty-first session") no class of those two cells went to SDPA in three warm-ups
CONTESTED_ROUNDS = 10


def contested_rounds_for(*, background: bool) -> int:
    """The further rounds a contested class gets unless asked otherwise: :data:`CONTESTED_ROUNDS` off the calling
    thread, where no call waits for them; none inside a call's first use, which that call would wait for."""
    return CONTESTED_ROUNDS if background else 0


DEFAULT = AutotuneConfig(contested_rounds=contested_rounds_for(background=False))
#: the default with ``ATTNFORGE_AUTOTUNE=background``
DEFAULT_BACKGROUND = AutotuneConfig(background=True, contested_rounds=contested_rounds_for(background=True))
_ACTIVE: contextvars.ContextVar[AutotuneConfig | None] = contextvars.ContextVar("attnforge_autotune", default=None)
#: per dispatcher, the (device key, shape class, precision, memory layout) already measured in this process
_TUNED: weakref.WeakKeyDictionary[Any, set[tuple[str, str, str, str]]] = weakref.WeakKeyDictionary()
#: per dispatcher, those of them measured without the candidates that compile on their first call: a later
#: measurement that may compile (``attnforge warmup`` in the same process) measures them again
_PARTIAL: weakref.WeakKeyDictionary[Any, set[tuple[str, str, str, str]]] = weakref.WeakKeyDictionary()
#: per dispatcher, those of them whose first rounds left them contested, with how often they were timed in further
#: rounds (a class measured again, partial before, may be contested again)
_TIMED_AGAIN: weakref.WeakKeyDictionary[Any, dict[tuple[str, str, str, str], int]] = weakref.WeakKeyDictionary()


class Tunable(Protocol):
    """What :func:`tune` needs of the dispatcher (:class:`attnforge.dispatch.dispatcher.Dispatcher`)."""

    adapters: dict[str, BackendAdapter]
    fallback: BackendAdapter
    exact: BackendAdapter

    def take_records(self, device_key: str, records: Sequence[BenchRecord]) -> None: ...

    def forget_decisions(self) -> None: ...


@contextmanager
def configured(config: AutotuneConfig) -> Iterator[AutotuneConfig]:
    """Make ``config`` the active configuration in this context (per thread / asyncio task); leaving it waits for
    the measurements started in it. :func:`attnforge.autotune` (:mod:`attnforge.dispatch.runtime`, which holds
    the process-wide dispatcher whose decisions it forgets) is the public way in."""
    token = _ACTIVE.set(config)
    try:
        yield config
    finally:
        _ACTIVE.reset(token)
        background_wait()


def background_wait(timeout_s: float | None = None) -> bool:
    """Block until the measurements queued so far are done (records written, classes switched); False when
    ``timeout_s`` passed first."""
    return background.WORKER.wait(timeout_s)


def quiet() -> AbstractContextManager[None]:
    """A context in which no measurement step runs on the worker thread (it waits for the running step, which
    may be a candidate's compile): for code about to capture a CUDA graph, which another thread's synchronize
    would invalidate."""
    return background.WORKER.hold()


def active(device_type: str = "cuda") -> AutotuneConfig | None:
    """The configuration measuring a call on ``device_type`` now, or None when it is off (the module
    docstring's rules: the variable's 0 first, then a context, then the variable's 1, then on for CUDA)."""
    env = autotune_env.lenient()  # an unknown value: one warning, then the default (never an error here)
    if env == "off":
        return None
    config = _ACTIVE.get()
    if config is not None:
        return config
    if env == "background" and device_type == "cuda":
        return DEFAULT_BACKGROUND
    if env == "on" or device_type == "cuda":
        return DEFAULT
    return None


def capturing() -> bool:
    """True while ``torch.compile`` traces or a CUDA graph captures on the current stream: nothing may be
    timed or synchronised then; or while saved-tensor hooks record this thread's forward (the non-reentrant
    ``torch.utils.checkpoint``, ``save_on_cpu``): nothing may be measured, checked or decided anew then, since a
    checkpointed forward is recomputed in the backward and must save the same tensors again (the in-situ check's
    forward and backward inside it raised ``CheckpointError``: "A different number of tensors was saved during the
    original forward and recomputation", 2026-12-02); the class is measured on a call outside such a region, and
    one met only inside them keeps the decision its records give (``attnforge warmup`` measures it ahead). The
    recomputation itself is served as its forward was (:meth:`attnforge.dispatch.dispatcher.Dispatcher.pinned`)."""
    import torch

    return torch.compiler.is_compiling() or graph_capturing() or saving_tensors()


def candidates(decision: Decision, skip: Collection[str] = ()) -> list[str]:
    """The backends worth timing: the eligible ones, plus quantized ones held back only for lack of a
    measurement, less ``skip`` (:func:`compiled_on_call`). The exact math only where SDPA lacks a feature of the
    call (it is then the baseline a kernel must beat, as plain SDPA is for plain calls), and never alone."""
    gated = [r.backend for r in decision.rejected if r.reasons and all(x.startswith("quantized:") for x in r.reasons)]
    names = [n for n in (*decision.order, *gated) if n not in skip]
    if FALLBACK in names or names == [EXACT]:
        names = [n for n in names if n != EXACT]
    return names


def compiled_on_call(dispatcher: Tunable, config: AutotuneConfig) -> frozenset[str]:
    """The backends ``config`` does not time: those that compile their kernel on their first call
    (``jit_per_variant``), unless it measures off the calling thread or for a deploy step (``compiling``)."""
    if config.background or config.compiling:
        return frozenset()
    return frozenset(n for n, a in dispatcher.adapters.items() if compiles_per_variant(a))


def wanted(dispatcher: Tunable, decision: Decision, call: AttentionCall, device_key: str,
           skip: Collection[str] = (), *, layouts: bool = False) -> bool:
    """Whether :func:`tune` should run for this decision: the class was not measured in this process in the call's
    memory layout (or only without the candidates ``skip`` leaves out, and now none is left out), and some
    candidate of two or more (less ``skip``) has no measurement, or (``layouts``) the decision read measurements
    taken in the other layout only."""
    names = candidates(decision, skip)
    measured = dict(decision.ranking.measurements) if decision.ranking is not None else {}
    if decision.exact is not None:
        measured[EXACT] = decision.exact
    elsewhere = layouts and decision.layout is not None and decision.layout != call.layout
    if len(names) < 2 or (all(n in measured for n in names) and not elsewhere):
        return False
    key = _tuned_key(call, device_key)
    if key not in _TUNED.get(dispatcher, set()):
        return True
    return not skip and key in _PARTIAL.get(dispatcher, set())


def first_use(dispatcher: Tunable, tensors: tuple[Any, Any, Any], *, call: AttentionCall, decision: Decision,
              device_key: str, bind: Callable[[BackendAdapter], Callable[..., Any]], bhsd: tuple[Any, Any, Any],
              store: Callable[[], Any], versions: Callable[[], Mapping[str, str | None]]) -> bool:
    """Measure a just-decided class when measuring is on here (:func:`active`), nothing captures
    (:func:`capturing`) and :func:`wanted` says so: inside the call, or queued on the worker thread (the
    dispatcher's decisions are dropped then, and the class decides to :func:`provisional` until the worker
    hands it the records). True when it did either: decide the class again. ``store`` and ``versions`` are called only
    then, on the calling thread. Arguments otherwise as :func:`tune`."""
    config = active(tensors[0].device.type)
    if config is None or capturing():
        return False
    skip = compiled_on_call(dispatcher, config)
    if not wanted(dispatcher, decision, call, device_key, skip, layouts=config.layouts):
        return False
    if not config.background:
        tune(dispatcher, tensors, call=call, decision=decision, device_key=device_key, bind=bind, bhsd=bhsd,
             store=store(), config=config, versions=versions(), skip=skip)
        return True
    key = _mark_tuned(dispatcher, call, device_key)
    quantized = any(quantizes(a) for n in candidates(decision) if (a := dispatcher.adapters.get(n)) is not None)
    # one snapshot, one event: the bhsd views a quantized candidate's error is read on are copied before the
    # event the worker waits on, as the caller's tensors are
    both, ready = background.snapshot((*tensors, *bhsd) if quantized else tuple(tensors))
    copies = both[:len(tensors)]
    views = both[len(tensors):] if quantized else copies
    records, known = store(), versions()

    def job(checkpoint: Callable[[], None]) -> None:
        scope, sync = background.stream_scope(copies[0].device)
        with scope:
            if ready is not None:
                import torch

                torch.cuda.current_stream().wait_event(ready)
            tune(dispatcher, copies, call=call, decision=decision, device_key=device_key, bind=bind, bhsd=views,
                 store=records, config=config, versions=known, sync=sync, between=checkpoint)

    background.WORKER.submit((id(dispatcher), *key), job)
    dispatcher.forget_decisions()  # the class is decided again, to provisional() while pending
    return True


def provisional(decision: Decision) -> Decision:
    """What serves a class while it is measured off the calling thread: its leader when that one was measured
    for the class (the recorded choice), else plain SDPA when it may serve the call, else the decision as it is
    (only the exact math or a kernel for a feature SDPA lacks can serve it). Never a candidate that may still
    have to compile."""
    measured = decision.ranking.measurements if decision.ranking is not None else {}
    if not decision.order or decision.order[0] in measured or FALLBACK not in decision.order:
        return decision
    why = dict(zip(decision.order, decision.basis, strict=False))
    why[FALLBACK] = f"serves while the class is measured off the calling thread; before: {why.get(FALLBACK, '')}"
    order = (FALLBACK, *(n for n in decision.order if n != FALLBACK))
    return dataclasses.replace(decision, order=order, basis=tuple(why.get(n, "") for n in order))


def timed_again(dispatcher: Tunable) -> dict[tuple[str, str, str, str], int]:
    """The classes (device key, shape class, precision, memory layout) this dispatcher's measurements in this process
    left contested and timed in further rounds (:attr:`AutotuneConfig.contested_rounds`), each with how often: what
    the warm-up reports per class, so a run can tell a settled tie from a class that never was one. A copy."""
    return dict(_TIMED_AGAIN.get(dispatcher, {}))


def pending(dispatcher: Tunable, call: AttentionCall, device_key: str) -> bool:
    """Whether the class of ``call`` is being measured off the calling thread now."""
    return background.WORKER.pending((id(dispatcher), *_tuned_key(call, device_key)))


def _tuned_key(call: AttentionCall, device_key: str) -> tuple[str, str, str, str]:
    """What a class is measured once per process for: its device, class, precision and memory layout."""
    return device_key, str(class_of_call(call)), call.precision, call.layout


def _mark_tuned(dispatcher: Tunable, call: AttentionCall, device_key: str,
                partial: bool = False) -> tuple[str, str, str, str]:
    key = _tuned_key(call, device_key)
    _TUNED.setdefault(dispatcher, set()).add(key)
    if partial:
        _PARTIAL.setdefault(dispatcher, set()).add(key)
    else:
        _PARTIAL.get(dispatcher, set()).discard(key)
    return key


def round_timing(config: AutotuneConfig, candidates: int) -> TimingConfig:
    """How :func:`tune` times one candidate in one round: held batches (:attr:`~attnforge.bench.timing.TimerMethod.
    HELD`: each call the longer of its device and its host time; back to back where there is no queue to hold, a
    CPU), ``config.budget_s`` shared out over ``candidates`` x ``config.rounds`` rounds, a quarter of each share as
    warm-up."""
    from attnforge.bench.timing import TimerMethod, TimingConfig

    share_ms = config.budget_s * 1e3 / max(1, candidates * config.rounds)
    return TimingConfig(warmup_ms=share_ms / 4, rep_ms=share_ms, min_reps=3, max_reps=MAX_REPS,
                        method=TimerMethod.HELD, rounds=config.rounds)


def tune(dispatcher: Tunable, tensors: tuple[Any, Any, Any], *, call: AttentionCall, decision: Decision,
         device_key: str, bind: Callable[[BackendAdapter], Callable[..., Any]], bhsd: tuple[Any, Any, Any],
         store: Any, config: AutotuneConfig = DEFAULT, versions: Mapping[str, str | None] | None = None,
         sync: Callable[[], None] | None = None, between: Callable[[], None] = lambda: None,
         skip: Collection[str] = ()) -> list[BenchRecord]:
    """Time the candidates on the caller's tensors, store the results and hand them to the dispatcher.

    Args:
        dispatcher: whose adapters are timed, and which takes the new records (:meth:`take_records`).
        tensors: the caller's ``(q, k, v)`` as the route receives them (any layout).
        call: the call's description; decision: the policy's decision for it.
        device_key: the records' device key.
        bind: the route's bound call of an adapter (:func:`attnforge.backends.bound.bound_call`).
        bhsd: ``q [B, Hq, Sq, D]``, ``k``, ``v`` views, for the error of a quantized candidate.
        store: a record store with ``add_bench`` (results are kept in this process only without one, or when it
            cannot write them).
        config: budgets; versions: installed version per backend id (kept with each record).
        sync: waits for the work timed (the device's synchronize when None; the worker's stream on the worker).
        between: called between two candidates' rounds (the worker's checkpoint).
        skip: backends not timed (:func:`compiled_on_call`).

    Returns:
        The new records (a candidate that raises while timed gets none; the policy treats it as before).
    """
    from attnforge.bench.timing import combine_rounds, hold_for, marks_for, measure, round_order, without_common_drift

    names = candidates(decision, skip)
    # partial only where a candidate of this decision was left out (a CUDA-only backend is none on a CPU call)
    _mark_tuned(dispatcher, call, device_key, partial=len(names) < len(candidates(decision)))
    special = {FALLBACK: dispatcher.fallback, EXACT: dispatcher.exact}
    adapters = {n: special[n] if n in special else dispatcher.adapters[n] for n in names}
    timing = round_timing(config, len(adapters))
    sync = sync if sync is not None else device_sync(tensors[0].device)
    marks = marks_for(tensors[0].device, config.clock)  # CUDA events on that device's current (the worker's) stream
    hold = hold_for(tensors[0].device)  # a sleep kernel on the same stream, ahead of each batch
    steps = {n: step_of(bind(a), tensors, grad=call.needs_grad) for n, a in adapters.items()}
    rounds: dict[str, list[Any]] = {n: [] for n in adapters}

    def timed(first: int, last: int, deadline: float) -> None:
        """Rounds ``first`` to ``last - 1``, every candidate once in each (in a rotating order); no round starts
        past ``deadline``."""
        for r in range(first, last):
            if r > first and config.clock() > deadline:
                break
            for name in round_order(names, r, config.rounds):
                if name not in rounds:
                    continue
                between()
                try:
                    rounds[name].append(measure(steps[name], sets=1, config=timing, sync=sync, clock=config.clock,
                                                marks=marks, hold=hold))
                except Exception:  # a candidate that raises is not measured; the policy keeps its own view of it
                    del rounds[name]

    timed(0, 1, float("inf"))  # the first round's first calls may compile (FlexAttention, FA4's JIT): no deadline
    timed(1, config.rounds, config.clock() + 2 * config.budget_s)
    timings = without_common_drift({n: combine_rounds(t) for n, t in rounds.items() if t})
    if config.contested_rounds > 0 and _contested(timings, call):
        timed(config.rounds, config.rounds + config.contested_rounds, config.clock() + 2 * config.budget_s)
        timings = without_common_drift({n: combine_rounds(t) for n, t in rounds.items() if t})
        again = _TIMED_AGAIN.setdefault(dispatcher, {})
        key = _tuned_key(call, device_key)
        again[key] = again.get(key, 0) + 1
    records = _records(timings, adapters, bhsd, call=call, device_key=device_key, versions=versions or {})
    if records and store is not None and hasattr(store, "add_bench"):
        store.add_bench(records)
    dispatcher.take_records(device_key, records)  # kept in this process whether or not the store could write them
    return records


def _contested(timings: Mapping[str, Any], call: AttentionCall) -> bool:
    """Whether these timings leave ``call``'s class contested (:func:`attnforge.ranking.contested`)."""
    from attnforge.bench.flops import shape_flops
    from attnforge.ranking import contested, rank

    flops = shape_flops(shape_of_call(call))
    return contested(rank(t.measurement(name, flops) for name, t in timings.items()))


def _records(timings: Mapping[str, Any], adapters: Mapping[str, BackendAdapter], bhsd: tuple[Any, Any, Any],
             *, call: AttentionCall, device_key: str, versions: Mapping[str, str | None]) -> list[BenchRecord]:
    from attnforge.bench.accuracy import output_error
    from attnforge.bench.flops import shape_flops, tflops

    shape = shape_of_call(call)
    flops = shape_flops(shape)
    run_id = "autotune-" + uuid.uuid4().hex[:8]
    out = []
    for name, t in timings.items():
        error = None
        if quantizes(adapters[name]):
            try:
                error = output_error(adapters[name], bhsd, causal=call.causal)
            except Exception:  # noqa: S112 - an error check that raises leaves the backend unmeasured
                continue
        out.append(BenchRecord.measured(
            shape, device_key=device_key, backend=name, backend_version=versions.get(name), ms=t.median_ms,
            tflops=tflops(flops, t.median_ms), run_id=run_id, timing=t, error=error))
    return out


def step_of(fn: Callable[..., Any], tensors: tuple[Any, Any, Any], *, grad: bool) -> Callable[[int], object]:
    """One timed call of the bound route on the caller's tensors: forward under ``no_grad``, or forward +
    ``autograd.grad`` on detached copies with the same strides (the caller's tensors and ``.grad`` stay
    untouched)."""
    import torch

    q, k, v = tensors
    if not grad:
        def fwd(_i: int) -> object:
            with torch.no_grad():
                return fn(q, k, v)
        return fwd
    qc, kc, vc = (t.detach().clone(memory_format=torch.preserve_format).requires_grad_(True) for t in tensors)
    douts: list[Any] = []

    def fwd_bwd(_i: int) -> object:
        with torch.enable_grad():
            out = fn(qc, kc, vc)
            if not douts:
                douts.append(torch.randn_like(out))
            return torch.autograd.grad(out, (qc, kc, vc), douts[0])
    return fwd_bwd


def device_sync(device: Any) -> Callable[[], None]:
    """What waits for the timed work on ``device`` (a ``torch.device``): that GPU's synchronize (not the current
    device's: a call on ``cuda:1`` timed from a thread whose current device is ``cuda:0``), nothing on a CPU."""
    if getattr(device, "type", None) == "cuda":
        import torch

        return functools.partial(torch.cuda.synchronize, device)
    return lambda: None
