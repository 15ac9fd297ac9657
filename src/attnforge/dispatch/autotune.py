"""Measure on first use: the first call of a shape class nobody measured times the candidates on its own tensors.

Opt-in, with :func:`autotune` (a context manager, per thread / asyncio task) or ``ATTNFORGE_AUTOTUNE=1``. When
the dispatcher first decides a call whose shape class has an eligible backend without a measurement (or a
quantized one held back only because it was not measured), :func:`tune` times every eligible candidate on the
call's own q/k/v in interleaved rounds (the bench harness, :func:`attnforge.bench.timing.measure`) within a time
budget, adds the results to the record store under this device's key (``run_id`` ``autotune-...``) and refreshes
the dispatcher; later calls, in this process and the next, reuse them. A class is tuned once per process.

Numerics never change: the candidates are the verified backends the policy would try anyway; the timing runs
leave q/k/v untouched (backward runs on detached copies, with ``autograd.grad``, so nothing accumulates in
``.grad``), and the output returned to the caller is computed afterwards by the route the policy chooses.
"""

from __future__ import annotations

import contextvars
import os
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from attnforge.backends.adapter import AttentionCall, BackendAdapter
from attnforge.dispatch.policy import FALLBACK, Decision, class_of_call, shape_of_call
from attnforge.records import BenchRecord

ENV = "ATTNFORGE_AUTOTUNE"
#: timed repetitions per candidate and round at most: the budget is an estimate, this bounds a bad one
MAX_REPS = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class AutotuneConfig:
    """How much one shape class may cost to measure.

    Attributes:
        budget_s: the repetition time for all candidates of one class together (first calls not included).
        rounds: interleaved rounds per candidate (their spread decides ties, :mod:`attnforge.ranking`).
        clock: seconds, monotonic (a fake clock in tests).
    """

    budget_s: float = 1.0
    rounds: int = 3
    clock: Callable[[], float] = time.perf_counter


_ACTIVE: contextvars.ContextVar[AutotuneConfig | None] = contextvars.ContextVar("attnforge_autotune", default=None)
#: per dispatcher, the (device key, shape class, precision) already tuned in this process
_TUNED: weakref.WeakKeyDictionary[Any, set[tuple[str, str, str]]] = weakref.WeakKeyDictionary()


class Tunable(Protocol):
    """What :func:`tune` needs of the dispatcher (:class:`attnforge.dispatch.runtime.Dispatcher`)."""

    adapters: dict[str, BackendAdapter]
    fallback: BackendAdapter

    def describe(self, q: Any, k: Any, *, causal: bool, precision: str, needs_grad: bool) -> AttentionCall: ...

    def refresh(self) -> None: ...


@contextmanager
def autotune(*, budget_s: float = 1.0, rounds: int = 3,
             clock: Callable[[], float] = time.perf_counter) -> Iterator[AutotuneConfig]:
    """Measure unmeasured shape classes on first use inside this context (see the module docstring).

    Args:
        budget_s: seconds of timed repetitions per shape class, all candidates together.
        rounds: interleaved rounds per candidate.
        clock: the timer on a CPU (tests pass a fake one).
    """
    config = AutotuneConfig(budget_s=budget_s, rounds=max(1, rounds), clock=clock)
    token = _ACTIVE.set(config)
    try:
        from attnforge.dispatch import runtime

        if runtime._DISPATCHER is not None:  # routes decided before the context skip the deciding path
            runtime._DISPATCHER._routes.clear()
        yield config
    finally:
        _ACTIVE.reset(token)


def active() -> AutotuneConfig | None:
    """The context's configuration, or the default one when ``ATTNFORGE_AUTOTUNE=1``; None when off."""
    config = _ACTIVE.get()
    if config is None and os.environ.get(ENV, "").strip() in {"1", "true", "yes", "on"}:
        return AutotuneConfig()
    return config


def candidates(decision: Decision) -> list[str]:
    """The backends worth timing: the eligible ones, plus quantized ones held back only for lack of a measurement."""
    gated = [r.backend for r in decision.rejected if r.reasons and all(x.startswith("quantized:") for x in r.reasons)]
    return [*decision.order, *gated]


def wanted(dispatcher: Tunable, decision: Decision, call: AttentionCall, device_key: str) -> bool:
    """Whether :func:`tune` should run for this decision: autotune is on, the class was not tuned in this process,
    and some candidate of two or more has no measurement."""
    if active() is None:
        return False
    names = candidates(decision)
    measured = decision.ranking.measurements if decision.ranking is not None else {}
    if len(names) < 2 or all(n in measured for n in names):
        return False
    return (device_key, str(class_of_call(call)), call.precision) not in _TUNED.get(dispatcher, set())


def tune(dispatcher: Tunable, q: Any, k: Any, v: Any, *, call: AttentionCall, decision: Decision,
         device_key: str, causal: bool, scale: float | None, store: Any) -> list[BenchRecord]:
    """Time the candidates on ``q [B, Hq, Sq, D]``, ``k``, ``v`` (bhsd views), store and refresh.

    Args:
        dispatcher: whose adapters are timed and whose records are refreshed.
        call: the call's description; decision: the policy's decision for it.
        device_key: the records' device key.
        store: a record store with ``add_bench`` (results are kept in this process only without one).

    Returns:
        The new records (a backend that raises while timed gets none; the policy treats it as before).
    """
    from attnforge.bench.timing import TimerMethod, TimingConfig, combine_rounds, measure

    config = active() or AutotuneConfig()
    _TUNED.setdefault(dispatcher, set()).add((device_key, str(class_of_call(call)), call.precision))
    names = candidates(decision)
    adapters = {n: dispatcher.fallback if n == FALLBACK else dispatcher.adapters[n] for n in names}
    share_ms = config.budget_s * 1e3 / max(1, len(adapters) * config.rounds)
    cuda = q.device.type == "cuda"
    timing = TimingConfig(warmup_ms=share_ms / 4, rep_ms=share_ms, min_reps=3, max_reps=MAX_REPS,
                          method=TimerMethod.CUDA_EVENTS if cuda else TimerMethod.PERF_COUNTER, rounds=config.rounds)
    sync = _sync(cuda)
    steps = {n: _step(a, q, k, v, causal=causal, scale=scale, grad=call.needs_grad) for n, a in adapters.items()}
    rounds: dict[str, list[Any]] = {n: [] for n in adapters}
    deadline = config.clock() + 3 * config.budget_s  # past it, no further round starts
    for r in range(config.rounds):
        if r and config.clock() > deadline:
            break
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            if name not in rounds:
                continue
            try:
                rounds[name].append(measure(steps[name], sets=1, config=timing, sync=sync, clock=config.clock))
            except Exception:  # a candidate that raises is not measured; the policy keeps its own view of it
                del rounds[name]
    records = _records(rounds, adapters, q, k, v, call=call, device_key=device_key, combine=combine_rounds)
    if records and store is not None and hasattr(store, "add_bench"):
        store.add_bench(records)
    dispatcher.refresh()
    return records


def _records(rounds: Mapping[str, list[Any]], adapters: Mapping[str, BackendAdapter], q: Any, k: Any, v: Any, *,
             call: AttentionCall, device_key: str, combine: Callable[[list[Any]], Any]) -> list[BenchRecord]:
    from attnforge.bench.accuracy import output_error
    from attnforge.bench.flops import shape_flops, tflops

    shape = class_of_call(call)
    flops = shape_flops(shape_of_call(call))
    run_id = "autotune-" + uuid.uuid4().hex[:8]
    out = []
    for name, timings in rounds.items():
        if not timings:
            continue
        t = combine(timings)
        rel_l1 = cosine = None
        if bool(getattr(getattr(adapters[name], "caps", None), "quantized", False)):
            try:
                rel_l1, cosine = output_error(adapters[name], (q, k, v), causal=call.causal)
            except Exception:  # noqa: S112 - an error check that raises leaves the backend unmeasured
                continue
        out.append(BenchRecord(
            device_key=device_key, backend=name, backend_version=None, dtype=call.dtype, mode=shape.mode.value,
            causal=call.causal, batch=call.batch, heads=call.heads_q, kv_heads=call.heads_kv,
            head_dim=call.head_dim, seqlen_q=call.seqlen_q, seqlen_k=call.seqlen_k, ms=t.median_ms,
            tflops=tflops(flops, t.median_ms), peak_mem_bytes=None, run_id=run_id,
            head_dim_v=shape.head_dim_v if shape.head_dim_v != shape.head_dim else None,
            features=",".join(sorted(f.value for f in shape.features)), ms_lo=t.lo_ms, ms_hi=t.hi_ms,
            rel_l1=rel_l1, cosine=cosine))
    return out


def _step(adapter: BackendAdapter, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None,
          grad: bool) -> Callable[[int], object]:
    """One timed call on the caller's tensors: forward under ``no_grad``, or forward + ``autograd.grad`` on
    detached copies (the caller's tensors and their ``.grad`` stay untouched)."""
    import torch

    if not grad:
        def fwd(_i: int) -> object:
            with torch.no_grad():
                return adapter(q, k, v, causal=causal, scale=scale)
        return fwd
    qc, kc, vc = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    dout = torch.randn(*q.shape[:3], v.shape[-1], device=q.device, dtype=q.dtype)

    def fwd_bwd(_i: int) -> object:
        with torch.enable_grad():
            out = adapter(qc, kc, vc, causal=causal, scale=scale)
            return torch.autograd.grad(out, (qc, kc, vc), dout)
    return fwd_bwd


def _sync(cuda: bool) -> Callable[[], None]:
    if cuda:
        import torch

        return torch.cuda.synchronize
    return lambda: None
