"""The selection state of one process (:class:`Dispatcher`): records, decisions, routes, broken backends.

:mod:`attnforge.dispatch.runtime` holds the process-wide instance and the public functions; its docstring
describes the state kept here and the hot path (a route per exact call signature) that reads it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import os
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from attnforge.backends.adapter import (
    ROUTING_ONLY,
    AttentionCall,
    BackendAdapter,
    required_features,
    supported_features,
)
from attnforge.backends.exact import EXACT, ExactAdapter
from attnforge.dispatch import autotune, features
from attnforge.dispatch.explanation import Explanation
from attnforge.dispatch.inputs import validate as _validate
from attnforge.dispatch.policy import (
    FALLBACK,
    Decision,
    Rejection,
    class_of_call,
    decide,
    measurements,
)
from attnforge.errors import DispatchError
from attnforge.records import BenchRecord, RecordStore, VerifyRecord, device_key

_FORCED: contextvars.ContextVar[str | None] = contextvars.ContextVar("attnforge_forced_backend", default=None)

#: most routes held per dispatcher; past it the routes are dropped and rebuilt from the (bucketed) plans
ROUTES_MAX = 4096

#: one backend of a route: the adapter, and the call bound to the signature: ``fn(q, k, v)`` on the caller's
#: tensors, in the caller's layout (:func:`_step`)
_Step = tuple[BackendAdapter, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]]
#: the backends to try in order, the fallback after them (SDPA, or the exact math when SDPA lacks a feature the
#: call uses), and the call's shape class (a backend that raises is disabled for that class only)
_Route = tuple[tuple[_Step, ...], _Step, str]


class RecordSource(Protocol):
    """Where verify and bench results come from (:class:`attnforge.records.RecordStore` in production)."""

    def latest_verify(self, device_key: str) -> dict[str, VerifyRecord]: ...

    def bench_records(self, device_key: str) -> list[BenchRecord]: ...


@dataclass(frozen=True, slots=True)
class _Device:
    key: str
    compute_capability: tuple[int, int] | None


class Dispatcher:
    """The selection state of one process: adapters, records, cached decisions, broken backends.

    Args:
        adapters: backends by catalog id (the registry's when None); the SDPA fallback is separate.
        fallback: the adapter of last resort (unforced SDPA when None).
        priorities: catalog priority per id (from the adapters' capabilities when None).
        records: verify/bench source (``RecordStore($ATTNFORGE_HOME)``, opened on first use, when None).
    """

    def __init__(self, adapters: Mapping[str, BackendAdapter] | None = None, *,
                 fallback: BackendAdapter | None = None, priorities: Mapping[str, int] | None = None,
                 records: RecordSource | None = None) -> None:
        from attnforge.backends import registry

        self.adapters: dict[str, BackendAdapter] = dict(registry.adapters() if adapters is None else adapters)
        self.fallback = fallback if fallback is not None else registry.fallback()
        self.priorities = dict(priorities) if priorities is not None else {
            name: getattr(getattr(a, "caps", None), "priority", 1 << 30) for name, a in self.adapters.items()}
        self._records = records
        self._lock = threading.RLock()
        self._devices: dict[Any, _Device] = {}
        self._verified: dict[str, dict[str, VerifyRecord]] = {}
        self._bench: dict[str, list[BenchRecord]] = {}
        self._plans: dict[tuple[Any, ...], tuple[Decision, tuple[BackendAdapter, ...]]] = {}
        self._routes: dict[tuple[Any, ...], _Route] = {}
        self._generation = 0  # bumped whenever plans and routes are dropped
        self.exact: BackendAdapter = ExactAdapter()
        #: backends that raised at run time: name -> {shape class: the error's first line}
        self.broken: dict[str, dict[str, str]] = {}
        #: exact shapes seen per shape class (a class with many is dynamic: no per-shape JIT kernel for it)
        self._shapes_seen: dict[str, set[tuple[int, ...]]] = {}

    # -- state ------------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Forget records and cached decisions; the next call re-reads them. Broken backends stay broken."""
        with self._lock:
            self._generation += 1
            self._verified.clear()
            self._bench.clear()
            self._plans.clear()
            self._routes.clear()

    def _source(self) -> RecordSource:
        if self._records is None:
            from attnforge._system.paths import home_dir

            self._records = RecordStore(home_dir(os.environ))
        return self._records

    def _device(self, device: torch.device) -> _Device:
        found = self._devices.get(device)
        if found is None:
            if device.type == "cuda":
                index = device.index if device.index is not None else torch.cuda.current_device()
                major, minor = torch.cuda.get_device_capability(index)
                name = torch.cuda.get_device_name(index)
                found = _Device(device_key(name, (major, minor), torch.__version__), (major, minor))
            else:
                found = _Device(device_key(device.type, None, torch.__version__), None)
            self._devices[device] = found
        return found

    def _records_for(self, key: str) -> tuple[dict[str, VerifyRecord], list[BenchRecord]]:
        with self._lock:
            if key not in self._verified:
                source = self._source()
                self._verified[key] = source.latest_verify(key)
                self._bench[key] = source.bench_records(key)
            return self._verified[key], self._bench[key]

    # -- deciding ---------------------------------------------------------------------------------------
    def _plan(self, q: torch.Tensor, k: torch.Tensor, *, causal: bool, precision: str, needs_grad: bool,
              forced: str | None, uses: frozenset[str] = frozenset(),
              head_dim_v: int | None = None) -> tuple[Decision, tuple[BackendAdapter, ...]]:
        _, hq, sq, d = q.shape
        _, hkv, sk, _ = k.shape
        # the call class: everything unsupported_reasons looks at; (n - 1).bit_length() is bench's S bucket
        key = (q.device, q.dtype, d, causal, hq // hkv, (sq - 1).bit_length(), (sk - 1).bit_length(),
               (sq > sk) - (sq < sk), needs_grad, precision, forced, uses, head_dim_v)
        plan = self._plans.get(key)
        if plan is None:
            generation = self._generation
            if not q.is_floating_point():
                raise DispatchError(f"attention needs floating-point tensors, got {q.dtype}")
            call = self.describe(q, k, causal=causal, precision=precision, needs_grad=needs_grad, uses=uses,
                                 head_dim_v=head_dim_v)
            dev_key = self._device(q.device).key
            decision = self._forced_decision(call, forced) if forced else self._decide(call, dev_key)
            plan = (decision, tuple(self._adapter(name) for name in decision.order))
            with self._lock:
                if self._generation == generation:  # else a backend broke or records changed meanwhile
                    self._plans[key] = plan
        return plan

    def _route(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key: tuple[Any, ...] | None, *,
               causal: bool, scale: float | None, layout: str, precision: str, forced: str | None) -> _Route:
        """Validate a call seen for the first time, decide it, and remember its route under ``key``.

        Takes the caller's tensors in ``layout``. Raises what :func:`attention` raises for bad input or a
        forced backend that cannot serve the call; nothing is remembered then.
        """
        qh, kh, vh = _validate(q, k, v, layout=layout, precision=precision, scale=scale)
        needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        generation = self._generation
        route = self._plain_route(qh, kh, vh, causal=causal, scale=scale, precision=precision,
                                  needs_grad=needs_grad, forced=forced, bshd=layout == "bshd")
        self._note_shape(qh, kh, needs_grad)
        if key is not None:
            with self._lock:
                if self._generation == generation:
                    if len(self._routes) >= ROUTES_MAX:
                        self._routes.clear()
                    self._routes[key] = route
        return route

    def _plain_route(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                     scale: float | None, precision: str, needs_grad: bool, forced: str | None,
                     bshd: bool) -> _Route:
        """The route of a call without features on bhsd tensors (Dv != D is the only feature it can use),
        bound to its causal flag, scale and shapes; a zero-sized call's route is the exact math: no kernel ever
        sees one (SIGFPE in some)."""
        if features.is_empty(q, k) or v.shape[3] == 0:
            return (), _step(self.exact, None, causal=causal, scale=scale, bshd=bshd), "empty"
        dv = v.shape[3] if v.shape[3] != q.shape[3] else None
        uses = frozenset(("dv",)) if dv else frozenset()
        decision, adapters = self._plan(q, k, causal=causal, precision=precision, needs_grad=needs_grad,
                                        forced=forced, uses=uses, head_dim_v=dv)
        call = self.describe(q, k, causal=causal, precision=precision, needs_grad=needs_grad, uses=uses,
                             head_dim_v=dv)
        if not forced and autotune.active() is not None:  # measure on first use (attnforge.dispatch.autotune)
            dev_key = self._device(q.device).key
            if autotune.wanted(self, decision, call, dev_key):  # the route is not kept: the generation moved
                autotune.tune(self, q, k, v, call=call, decision=decision, device_key=dev_key, causal=causal,
                              scale=None, store=self._source())
                decision, adapters = self._plan(q, k, causal=causal, precision=precision, needs_grad=needs_grad,
                                                forced=None, uses=uses, head_dim_v=dv)
        if forced and not adapters:
            features.raise_forced(forced, decision)
        steps = tuple(_step(a, call, causal=causal, scale=scale, bshd=bshd) for a in adapters if a is not self.exact)
        last = self.exact if adapters and adapters[-1] is self.exact else self.fallback
        return steps, _step(last, call, causal=causal, scale=scale, bshd=bshd), _class_name(call)

    def describe(self, q: torch.Tensor, k: torch.Tensor, *, causal: bool, precision: str,
                 needs_grad: bool, uses: frozenset[str] = frozenset(),
                 head_dim_v: int | None = None) -> AttentionCall:
        """The :class:`AttentionCall` of ``[B, Hq, Sq, D]`` / ``[B, Hkv, Sk, D]`` tensors."""
        dev = self._device(q.device)
        return AttentionCall(device_type=q.device.type, compute_capability=dev.compute_capability,
                             dtype=str(q.dtype).removeprefix("torch."), batch=q.shape[0],
                             heads_q=q.shape[1], heads_kv=k.shape[1], seqlen_q=q.shape[2],
                             seqlen_k=k.shape[2], head_dim=q.shape[3], causal=causal, needs_grad=needs_grad,
                             precision=precision, features=uses - ROUTING_ONLY, head_dim_v=head_dim_v,
                             top_left="causal_top_left" in uses)

    def shape_class(self, q: torch.Tensor, k: torch.Tensor, causal: bool, needs_grad: bool) -> str:
        """The bench shape class of bhsd tensors, as its string (the key of broken backends)."""
        return _class_name(self.describe(q, k, causal=causal, precision="exact", needs_grad=needs_grad))

    def _note_shape(self, q: torch.Tensor, k: torch.Tensor, needs_grad: bool) -> None:
        """Count the exact shapes of a shape class; when it turns dynamic, decide its calls again (so a
        backend compiled per shape drops out of it, see :func:`attnforge.dispatch.features.admit`)."""
        cls = self.shape_class(q, k, False, needs_grad)
        seen = self._shapes_seen.setdefault(cls, set())
        before = len(seen)
        if before > features.DYNAMIC_AFTER:
            return  # already dynamic; the count needs to go no higher
        seen.add((*q.shape, *k.shape))
        if before == features.DYNAMIC_AFTER and len(seen) > before:
            with self._lock:
                self._generation += 1
                self._plans.clear()
                self._routes.clear()

    def _decide(self, call: AttentionCall, dev_key: str) -> Decision:
        verified, bench = self._records_for(dev_key)
        measured = measurements(bench, class_of_call(call))
        tflops = {name: m.tflops for name, m in measured.items()}
        cls = _class_name(call)
        with self._lock:  # another thread may be marking a backend broken
            broken = {name: by_class[cls] for name, by_class in self.broken.items() if cls in by_class}
        seen = len(self._shapes_seen.get(_class_name(dataclasses.replace(call, causal=False)), ()))
        _, refused = features.admit(call, self.adapters, tflops=tflops, shapes_seen=seen, verified=verified)
        decision = decide(call, self.adapters, priorities=self.priorities, verified=verified, measured=measured,
                          broken=broken)
        return features.close_with_fallback(decision, call, self.fallback, refused)

    def _forced_decision(self, call: AttentionCall, name: str) -> Decision:
        adapter = self._adapter(name)
        reasons = [f"not usable: {err}"] if (err := adapter.load_error()) else []
        reasons += adapter.unsupported_reasons(call)
        missing = required_features(call) - supported_features(adapter)
        if missing and not any(r.startswith("does not support") for r in reasons):
            reasons.append(f"does not support {', '.join(sorted(missing))}")
        if reasons:
            return Decision(order=(), basis=(), rejected=(Rejection(backend=name, reasons=tuple(reasons)),))
        return Decision(order=(name,), basis=("forced",), rejected=())

    def _adapter(self, name: str) -> BackendAdapter:
        if name == FALLBACK:
            return self.fallback
        if name == EXACT:
            return self.exact
        adapter = self.adapters.get(name)
        if adapter is None:
            known = ", ".join(sorted([*self.adapters, FALLBACK, EXACT]))
            raise DispatchError(f"unknown attention backend {name!r}", hint=f"known backends: {known}")
        return adapter

    def explain(self, q: torch.Tensor, k: torch.Tensor, *, causal: bool, precision: str, needs_grad: bool,
                backend: str | None, uses: frozenset[str] = frozenset(),
                head_dim_v: int | None = None) -> Explanation:
        """The decision for bhsd tensors, as an :class:`Explanation` (see :func:`explain`)."""
        forced = backend or _FORCED.get()
        call = self.describe(q, k, causal=causal, precision=precision, needs_grad=needs_grad, uses=uses,
                             head_dim_v=head_dim_v)
        dev_key = self._device(q.device).key
        decision = self._forced_decision(call, forced) if forced else self._decide(call, dev_key)
        return Explanation(call=call, device=dev_key, shape_class=str(class_of_call(call)),
                           chosen=decision.order[0] if decision.order else None, forced=forced is not None,
                           order=decision.order, basis=decision.basis, rejected=decision.rejected)

    # -- running ----------------------------------------------------------------------------------------
    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float | None,
            backend: str | None, precision: str, needs_grad: bool) -> torch.Tensor:
        """Serve one call on validated ``[B, H, S, D]`` tensors.

        Raises:
            DispatchError: a forced backend is unknown or cannot serve the call.
        """
        forced = backend or _FORCED.get()
        route = self._plain_route(q, k, v, causal=causal, scale=scale, precision=precision,
                                  needs_grad=needs_grad, forced=forced, bshd=False)
        return self._serve(route, q, k, v, forced)

    def _serve(self, route: _Route, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               forced: str | None) -> torch.Tensor:
        """Run ``route`` on the caller's tensors: the first backend that does not raise serves the call."""
        steps, last, cls = route
        for adapter, fn in steps:
            try:
                return fn(q, k, v)
            except torch.OutOfMemoryError:
                raise  # not the backend's fault; a fallback would need more memory still
            except Exception as exc:
                if forced or adapter is self.fallback:
                    raise  # a forced backend's error is the user's to see; SDPA is the last resort
                self._mark_broken(adapter.name, exc, cls)
        return last[1](q, k, v)

    def _mark_broken(self, name: str, exc: Exception, cls: str) -> None:
        """Disable ``name`` for shape class ``cls`` for the rest of the process, with one warning line."""
        error = features.one_line(exc)
        with self._lock:
            by_class = self.broken.setdefault(name, {})
            if cls in by_class:
                return
            by_class[cls] = error
            self._generation += 1
            self._plans.clear()
            self._routes.clear()
        warnings.warn(f"attnforge: attention backend {name!r} raised {error}; it is skipped for shape class"
                      f" {cls} for the rest of this process and the next backend serves the call",
                      RuntimeWarning, stacklevel=4)


def _class_name(call: AttentionCall) -> str:
    """The shape class a call's run-time failures and exact shapes are kept under (its features aside: a
    backend that raised is disabled for the whole class)."""
    return str(class_of_call(dataclasses.replace(call, features=frozenset(), head_dim_v=None,
                                                      top_left=False, precision="exact")))


def _step(adapter: BackendAdapter, call: AttentionCall | None, *, causal: bool, scale: float | None,
          bshd: bool) -> _Step:
    """How a route runs ``adapter`` on the caller's tensors, bound to the call's signature.

    An adapter with ``bind(call, scale=..., bshd=...)`` may return a callable specialised for the signature (e.g.
    SDPA as a ``functools.partial`` of the kernel function, with nothing of the adapter left on the hot path);
    otherwise bhsd runs the adapter as it is, and bshd its ``call_bshd`` when the kernel takes that layout
    natively, else transposed views (and back). A ``bind`` that raises leaves the generic call, whose error
    at run time marks the backend broken as any other.
    """
    bind = getattr(adapter, "bind", None)
    if bind is not None and call is not None:
        try:
            bound = bind(call, scale=scale, bshd=bshd)
        except Exception:  # the generic call below raises it again, where a raising backend is handled
            bound = None
        if bound is not None:
            return adapter, bound
    if not bshd:
        return adapter, functools.partial(adapter, causal=causal, scale=scale)
    native: Callable[..., torch.Tensor] | None = getattr(adapter, "call_bshd", None)
    if native is not None:
        return adapter, functools.partial(native, causal=causal, scale=scale)

    def transposed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return adapter(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal,
                       scale=scale).transpose(1, 2)

    return adapter, transposed
