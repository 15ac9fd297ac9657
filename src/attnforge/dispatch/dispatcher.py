"""The selection state of one process (:class:`Dispatcher`): records, decisions, routes, broken backends.

:mod:`attnforge.dispatch.runtime` holds the process-wide instance and the public functions; its docstring
describes the state kept here and the hot path (a route per exact call signature) that reads it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from attnforge._system.compile_cache import recreate_folder
from attnforge.backends._base import callers_own, records_grad
from attnforge.backends.adapter import (
    ROUTING_ONLY,
    AttentionCall,
    BackendAdapter,
)
from attnforge.backends.bound import Bound, bound_call
from attnforge.backends.exact import EXACT, ExactAdapter
from attnforge.backends.registry import installed_versions
from attnforge.dispatch import autotune, features, insitu
from attnforge.dispatch.explanation import Explanation
from attnforge.dispatch.failures import (
    FailureMemory,
    class_key,
    failure_signature,
    unrecorded_context,
    without_skipped,
)
from attnforge.dispatch.inputs import check_flag, memory_layout, refuse_non_strided
from attnforge.dispatch.inputs import validate as _validate
from attnforge.dispatch.policy import (
    FALLBACK,
    Decision,
    class_of_call,
    decide,
    failure_class,
    forced_decision,
    measurements,
    quantizes,
)
from attnforge.dispatch.state import runtime_records
from attnforge.errors import DispatchError
from attnforge.ranking import by_family, family_of
from attnforge.records import BenchRecord, VerifyRecord, device_key
from attnforge.types.shapes import ShapeClass

_FORCED: contextvars.ContextVar[str | None] = contextvars.ContextVar("attnforge_forced_backend", default=None)

#: most routes held per dispatcher; past it the routes are dropped and rebuilt from the (bucketed) plans
ROUTES_MAX = 4096

#: one backend of a route: the adapter, and the call bound to the signature: ``fn(q, k, v)`` on the caller's
#: tensors, in the caller's layout (:func:`attnforge.backends.bound.bound_call`)
Step = tuple[BackendAdapter, Bound]
#: the backends to try in order, the exact math last (:meth:`Dispatcher.serve`); the call, and its scale and
#: feature keywords: what a backend that raises is skipped for (turned into a signature only then:
#: :func:`~attnforge.dispatch.failures.failure_signature`)
Route = tuple[tuple[Step, ...], AttentionCall | None, tuple[float | None, Mapping[str, Any] | None]]


class RecordSource(Protocol):
    """Where verify and bench results come from (:class:`attnforge.records.RecordStore` in production)."""

    def latest_verify(self, device_key: str) -> dict[str, VerifyRecord]: ...

    def bench_records(self, device_key: str) -> list[BenchRecord]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class FeaturePlan:
    """What a call with features was decided to run on: the decision, its adapters in order, the call's
    description, the forced backend, and the checked call it was decided for (kept as its
    :meth:`~attnforge.dispatch.features.Prepared.template`, no tensors: its scalar keywords are reused)."""

    decision: Decision
    adapters: tuple[BackendAdapter, ...]
    call: AttentionCall
    forced: str | None
    prepared: features.Prepared
    #: the backend that serves the signature when nothing wraps its step (SDPA or the exact math first, unforced):
    #: :func:`features.attention` calls it directly, and takes the whole route only when it raises
    direct: BackendAdapter | None = None


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
        records: verify/bench source (``state.runtime_records()``, never raising, opened on first use, when None).
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
        #: per device key, :attr:`_bench` grouped by shape-class family (:meth:`_family_records`)
        self._families: dict[str, dict[tuple[ShapeClass, int], list[BenchRecord]]] = {}
        self._plans: dict[tuple[Any, ...], tuple[Decision, tuple[BackendAdapter, ...]]] = {}
        #: the route per exact call signature: read by the hot path of :func:`attnforge.attention`, written here
        self.routes: dict[tuple[Any, ...], Route] = {}
        #: the decided backends per exact signature of a call with features (:func:`features.attention` reads it;
        #: the route itself is bound per call: its keywords hold the caller's mask)
        self.feature_plans: dict[tuple[Any, ...], FeaturePlan] = {}
        #: what served each signature's last call inside an activation-checkpointed forward (:meth:`pinned`): its
        #: recomputation in the backward gets the same, whatever was decided in between
        self.pins: dict[tuple[Any, ...], Any] = {}
        self._versions: dict[str, str | None] | None = None
        self._generation = 0  # bumped whenever plans and routes are dropped
        self.exact: BackendAdapter = ExactAdapter()
        #: backends that raised at run time: skipped per call signature (``demoted``), per shape class past a
        #: few signatures of it (``broken``: name -> {shape class: the error's first line})
        self.failures = FailureMemory()
        self.broken, self.demoted = self.failures.broken, self.failures.demoted
        #: exact shapes seen per shape class (a class with many is dynamic: no per-shape JIT kernel for it)
        self._shapes_seen: dict[str, set[tuple[int, ...]]] = {}

    # -- state ------------------------------------------------------------------------------------------
    @property
    def generation(self) -> int:
        """A count bumped whenever remembered plans and routes are dropped (records re-read, decisions forgotten, a
        backend demoted, a class turned dynamic): what was derived from a plan holds while it is unchanged."""
        return self._generation

    def refresh(self) -> None:
        """Forget records and cached decisions; the next call re-reads them. Broken backends stay broken."""
        with self._lock:
            self._verified.clear()
            self._bench.clear()
            self._families.clear()
            self.forget_decisions()

    def take_records(self, device_key: str, records: Sequence[BenchRecord]) -> None:
        """Records this process has just stored for ``device_key`` (a first-use measurement, an in-situ check's
        timings): kept with those already read, in the order the store keeps them (newest last), without reading
        the store again; every decision and route is dropped, so each class decides again at its next call (reading
        its family's records only). Re-reading instead (:meth:`refresh`) cost that next call 69-80 ms on a CPU host
        at 4622 records, 2026-11-29 (docs/dispatch-overhead.md, seventeenth session), and grows with the home."""
        with self._lock:
            bench = self._bench.get(device_key)
            if bench is not None:
                fresh = self._current(records)
                self._bench[device_key] = [*bench, *fresh]  # a new list: a decision reading the old one keeps it whole
                index = self._families.get(device_key)
                if index is not None:
                    grown = dict(index)
                    for r in fresh:
                        family = family_of(r.shape.shape_class)
                        grown[family] = [*grown.get(family, []), r]
                    self._families[device_key] = grown
            self.forget_decisions()

    def _current(self, records: Iterable[BenchRecord]) -> list[BenchRecord]:
        """``records`` less the measurements of another installed version of their backend (they say nothing about
        this one)."""
        current = self.versions()
        return [r for r in records if r.backend_version is None or current.get(r.backend) is None
                or r.backend_version == current[r.backend]]

    def _source(self) -> RecordSource:
        if self._records is None:
            self._records = runtime_records()
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
                self._bench[key] = self._current(source.bench_records(key))
            return self._verified[key], self._bench[key]

    def _family_records(self, key: str, bench: list[BenchRecord], shape_class: ShapeClass) -> list[BenchRecord]:
        """Of the device's bench records ``bench`` (:meth:`_records_for`), those of ``shape_class``'s family: all
        that :func:`policy.measurements` reads for it (:func:`attnforge.ranking.by_family`), grouped once per load
        of the records, not per decision."""
        with self._lock:
            index = self._families.get(key)
            if index is None:
                index = by_family(bench)
                if self._bench.get(key) is bench:  # else a refresh came between: not kept for later decisions
                    self._families[key] = index
        return index.get(family_of(shape_class), [])

    # -- deciding ---------------------------------------------------------------------------------------
    def _plan(self, q: torch.Tensor, k: torch.Tensor, *, causal: bool, precision: str, needs_grad: bool,
              forced: str | None, uses: frozenset[str] = frozenset(),
              head_dim_v: int | None = None) -> tuple[Decision, tuple[BackendAdapter, ...], bool]:
        """The decision for the call class of bhsd ``q``/``k`` (cached per class), its adapters in order, and
        whether it was decided just now (only then may measure-on-first-use run for it)."""
        if forced is not None and (forced.__class__ is not str or not forced):
            self.adapter(forced)  # raises: not a backend name (unhashable as a key), or "" (not "no backend")
        _, hq, sq, d = q.shape
        _, hkv, sk, _ = k.shape
        # the call class: everything unsupported_reasons looks at; (n - 1).bit_length() is bench's S bucket; the
        # memory layout, whose measurements the decision reads
        key = (q.device, q.dtype, d, causal, hq // hkv, (sq - 1).bit_length(), (sk - 1).bit_length(),
               (sq > sk) - (sq < sk), needs_grad, precision, forced, uses, head_dim_v, memory_layout(k))
        plan = self._plans.get(key)
        if plan is None:
            generation = self._generation
            if not q.is_floating_point():
                raise DispatchError(f"attention needs floating-point tensors, got {q.dtype}", hint="q.float()")
            call = self.describe(q, k, causal=causal, precision=precision, needs_grad=needs_grad, uses=uses,
                                 head_dim_v=head_dim_v)
            dev_key = self._device(q.device).key
            decision = forced_decision(call, forced, self.adapter(forced)) if forced else self._decide(call, dev_key)
            plan = (decision, tuple(self.adapter(name) for name in decision.order))
            with self._lock:
                if self._generation == generation:  # else a backend broke or records changed meanwhile
                    self._plans[key] = plan
            return (*plan, True)
        return (*plan, False)

    def route(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key: tuple[Any, ...] | None, *,
              causal: bool, scale: float | None, layout: str, precision: str, forced: str | None) -> Route:
        """Validate a plain call seen for the first time, decide it, and remember its route under ``key`` (the
        hot path of :func:`attnforge.attention` looks it up in :attr:`routes` next time).

        Takes the caller's tensors in ``layout``. Raises what :func:`attention` raises for bad input or a
        forced backend that cannot serve the call; nothing is remembered then.
        """
        qh, kh, vh = _validate(q, k, v, layout=layout, precision=precision, scale=scale)
        causal = check_flag("causal", causal)
        scale = None if scale is None else float(scale)
        needs_grad = records_grad(q, k, v)
        generation = self._generation
        route = self._plain_route(qh, kh, vh, causal=causal, scale=scale, precision=precision,
                                  needs_grad=needs_grad, forced=forced, bshd=layout == "bshd")
        self._note_shape(qh, kh, needs_grad)
        if key is not None:
            with self._lock:
                if self._generation == generation:
                    if len(self.routes) >= ROUTES_MAX:
                        self.routes.clear()
                    self.routes[key] = route
        return route

    def _plain_route(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                     scale: float | None, precision: str, needs_grad: bool, forced: str | None,
                     bshd: bool) -> Route:
        """The route of a call without features on bhsd tensors (Dv != D is the only feature it can use),
        bound to its causal flag, scale, shapes and the caller's layout; a zero-sized call's route is the exact
        math: no kernel ever sees one (SIGFPE in some)."""
        if features.is_empty(q, k) or v.shape[3] == 0:
            if forced is not None:
                self.adapter(forced)  # an unknown name is refused here too
            exact = bound_call(self.exact, None, causal=causal, scale=scale, bshd=bshd)
            return ((self.exact, exact),), None, (scale, None)
        dv = v.shape[3] if v.shape[3] != q.shape[3] else None
        uses = frozenset(("dv",)) if dv else frozenset()
        caller = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)) if bshd else (q, k, v)
        decision, adapters, call = self.decide_call(q, k, v, causal=causal, precision=precision,
                                                    needs_grad=needs_grad, forced=forced, uses=uses,
                                                    head_dim_v=dv, scale=scale, bshd=bshd, caller=caller)
        return self._bind(adapters, call, causal=causal, scale=scale, bshd=bshd, forced=forced, decision=decision)

    def feature_route(self, prepared: features.Prepared, *, scale: float | None, forced: str | None,
                      precision: str, key: tuple[Any, ...] | None = None,
                      dynamic_key: tuple[Any, ...] | None = None) -> Route:
        """The route of a call that uses a feature (:func:`attnforge.dispatch.features.prepare` checked it):
        every backend bound to the call's feature keywords, on the prepared bhsd views (or packed tensors).
        The route is not remembered (the keywords hold the caller's tensors); the decision per class is, and
        with ``key`` (the call's exact signature) the decided backends too, in :attr:`feature_plans`
        (:meth:`planned_route` binds them to a later call of the signature); once the class is dynamic, under
        ``dynamic_key`` (:func:`features.dynamic_signature`) as well, for the lengths it has not shown yet."""
        p = prepared
        qp, kp = p.probe
        dense = "varlen" not in p.uses and "paged" not in p.uses
        # a decode loop with a mask or softcap is dynamic too: no per-shape compile for each step
        dynamic = dense and self._note_shape(qp, kp, p.needs_grad)
        generation = self._generation
        decision, adapters, call = self.decide_call(
            qp, kp, p.v if dense else None, causal=p.causal, precision=precision, needs_grad=p.needs_grad,
            forced=forced, uses=p.uses, head_dim_v=p.head_dim_v, scale=scale, bshd=False,
            caller=(p.q, p.k, p.v) if dense else None, opts=p.opts)
        plan = FeaturePlan(decision=decision, adapters=adapters, call=call, forced=forced, prepared=p)
        route = self.planned_route(plan, p)
        if key is not None:
            first, step = route[0][0]
            # the first backend called as it is where nothing wraps its step (the in-situ sampler counts calls)
            direct = first if not forced and not insitu.wraps(step) else None
            with self._lock:
                if self._generation == generation:  # else a measurement or a failure changed the decision
                    kept = dataclasses.replace(plan, prepared=p.template(), direct=direct)
                    self.remember_plan(key, kept)
                    if dynamic and dynamic_key is not None:  # decided for the class: every length of it
                        self.remember_plan(dynamic_key, kept)
        return route

    def remember_plan(self, key: tuple[Any, ...], plan: FeaturePlan) -> None:
        """Keep ``plan`` for ``key`` (an exact or a class-level signature; at most :data:`ROUTES_MAX` plans: all
        are dropped when full, as routes are)."""
        with self._lock:
            if len(self.feature_plans) >= ROUTES_MAX:
                self.feature_plans.clear()
            self.feature_plans[key] = plan

    def planned_route(self, plan: FeaturePlan, prepared: features.Prepared) -> Route:
        """``plan``'s backends bound to ``prepared`` (a call of the signature the plan was decided for)."""
        return self._bind(plan.adapters, plan.call, causal=prepared.causal, scale=prepared.scale, bshd=False,
                          forced=plan.forced, decision=plan.decision, opts=prepared.opts)

    def _bind(self, adapters: tuple[BackendAdapter, ...], call: AttentionCall, *, causal: bool,
              scale: float | None, bshd: bool, forced: str | None, decision: Decision,
              opts: Mapping[str, Any] | None = None) -> Route:
        """The decided backends bound to the call, less those that raised on its signature before (unforced);
        the exact math ends every unforced route (the one last resort, :meth:`serve`)."""
        if forced and not adapters:
            features.raise_forced(forced, decision)
        if not forced and self.demoted:
            skipped = self.failures.skipped(failure_signature(call, scale, opts))
            adapters = tuple(a for a in adapters if a.name not in skipped)
        if not forced and (not adapters or adapters[-1] is not self.exact):
            adapters = (*adapters, self.exact)
        steps = tuple((a, bound_call(a, call, causal=causal, scale=scale, bshd=bshd, opts=opts)) for a in adapters)
        return (steps if forced else insitu.sampled(self, steps, call, decision, bshd=bshd)), call, (scale, opts)

    def decide_call(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, *, causal: bool,
                    precision: str, needs_grad: bool, forced: str | None, uses: frozenset[str],
                    head_dim_v: int | None, scale: float | None, bshd: bool,
                    caller: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
                    opts: Mapping[str, Any] | None = None,
                    ) -> tuple[Decision, tuple[BackendAdapter, ...], AttentionCall]:
        """The decision for bhsd ``q``/``k``, measured first when :mod:`attnforge.dispatch.autotune` wants it:
        the candidates' bound calls are timed on ``caller`` (the caller's tensors as the route receives them;
        None: not measurable here). Returns the decision, its adapters in order and the call's description."""
        decision, adapters, fresh = self._plan(q, k, causal=causal, precision=precision, needs_grad=needs_grad,
                                               forced=forced, uses=uses, head_dim_v=head_dim_v)
        call = self.describe(q, k, causal=causal, precision=precision, needs_grad=needs_grad, uses=uses,
                             head_dim_v=head_dim_v)
        if not fresh or forced or caller is None or v is None:  # a class is considered once, when decided
            return decision, adapters, call
        if autotune.first_use(self, caller, call=call, decision=decision, device_key=self._device(q.device).key,
                              bind=lambda a: bound_call(a, call, causal=causal, scale=scale, bshd=bshd, opts=opts),
                              bhsd=(q, k, v), store=self._source, versions=self.versions):
            decision, adapters, _ = self._plan(q, k, causal=causal, precision=precision, needs_grad=needs_grad,
                                               forced=None, uses=uses, head_dim_v=head_dim_v)
        return decision, adapters, call

    def versions(self) -> dict[str, str | None]:
        """The installed version of each backend (:func:`attnforge.backends.registry.installed_versions`), read
        once: measurements of another version are not used."""
        if self._versions is None:
            self._versions = installed_versions(self.adapters)
        return self._versions

    def describe(self, q: torch.Tensor, k: torch.Tensor, *, causal: bool, precision: str,
                 needs_grad: bool, uses: frozenset[str] = frozenset(),
                 head_dim_v: int | None = None) -> AttentionCall:
        """The :class:`AttentionCall` of ``[B, Hq, Sq, D]`` / ``[B, Hkv, Sk, D]`` tensors (or views: K's memory
        layout is the call's, :func:`attnforge.dispatch.inputs.memory_layout`)."""
        dev = self._device(q.device)
        return AttentionCall(device_type=q.device.type, compute_capability=dev.compute_capability,
                             dtype=str(q.dtype).removeprefix("torch."), batch=q.shape[0],
                             heads_q=q.shape[1], heads_kv=k.shape[1], seqlen_q=q.shape[2],
                             seqlen_k=k.shape[2], head_dim=q.shape[3], causal=causal, needs_grad=needs_grad,
                             precision=precision, features=uses - ROUTING_ONLY, head_dim_v=head_dim_v,
                             top_left="causal_top_left" in uses, layout=memory_layout(k))

    def _note_shape(self, q: torch.Tensor, k: torch.Tensor, needs_grad: bool) -> bool:
        """Count the exact shapes of a shape class; when it turns dynamic, decide its calls again (so a
        backend compiled per shape drops out of it, see :func:`attnforge.dispatch.features.admit`). Returns
        whether the class is dynamic."""
        cls = failure_class(self.describe(q, k, causal=False, precision="exact", needs_grad=needs_grad))
        seen = self._shapes_seen.setdefault(cls, set())
        before = len(seen)
        if before > features.DYNAMIC_AFTER:
            return True  # already dynamic; the count needs to go no higher
        seen.add((*q.shape, *k.shape))
        if before == features.DYNAMIC_AFTER and len(seen) > before:
            self.forget_decisions()
        return len(seen) > features.DYNAMIC_AFTER

    def _decide(self, call: AttentionCall, dev_key: str) -> Decision:
        verified, bench = self._records_for(dev_key)
        shape_class = class_of_call(call)
        quantized = [name for name, adapter in self.adapters.items() if quantizes(adapter)]
        measured = measurements(self._family_records(dev_key, bench, shape_class), shape_class, call.layout, quantized)
        tflops = {name: m.tflops for name, m in measured.items()}
        broken = self.failures.broken_in(class_key(call))
        seen = len(self._shapes_seen.get(failure_class(dataclasses.replace(call, causal=False)), ()))
        _, refused = features.admit(call, self.adapters, tflops=tflops, shapes_seen=seen, verified=verified,
                                     fallback=self.fallback)
        decision = decide(call, self.adapters, priorities=self.priorities, verified=verified, measured=measured,
                          broken=broken)
        decision = features.close_with_fallback(decision, call, self.fallback, refused, measured)
        decision = insitu.annotate(self, decision, call)
        return autotune.provisional(decision) if autotune.pending(self, call, dev_key) else decision

    def adapter(self, name: str) -> BackendAdapter:
        """The adapter of backend id ``name`` (``"sdpa"``: the fallback; ``"exact"``: the exact math).

        Raises:
            DispatchError: ``name`` is unknown (the hint lists the known ids).
        """
        if name == FALLBACK:
            return self.fallback
        if name == EXACT:
            return self.exact
        adapter = self.adapters.get(name) if isinstance(name, str) else None
        if adapter is None:
            known = ", ".join(sorted([*self.adapters, FALLBACK, EXACT]))
            raise DispatchError(f"unknown attention backend {name!r}", hint=f"known backends: {known}")
        return adapter

    def explain(self, q: torch.Tensor, k: torch.Tensor, *, causal: bool, precision: str, needs_grad: bool,
                backend: str | None, uses: frozenset[str] = frozenset(), head_dim_v: int | None = None,
                scale: float | None = None, opts: Mapping[str, Any] | None = None,
                empty: bool = False) -> Explanation:
        """The decision for bhsd tensors, as an :class:`Explanation` (see :func:`explain`), less the backends
        that raised on the signature of a call with ``scale`` and feature keywords ``opts`` (as :meth:`_bind`).
        ``empty``: the call has zero elements (as :meth:`_plain_route` and ``features._serve`` see it), so the
        exact math serves it whatever is forced: the explanation says so."""
        forced = _FORCED.get() if backend is None else backend
        call = self.describe(q, k, causal=causal, precision=precision, needs_grad=needs_grad, uses=uses,
                             head_dim_v=head_dim_v)
        dev_key = self._device(q.device).key
        if forced is not None:
            self.adapter(forced)  # raises for an unknown name ("" too: it is not "no backend")
        if empty or features.is_empty(q, k) or head_dim_v == 0:
            return Explanation(call=call, device=dev_key, shape_class=str(class_of_call(call)), chosen=EXACT,
                               forced=False, order=(EXACT,),
                               basis=("the call has zero elements: no kernel sees one, the exact math returns its "
                                      "empty (or zero) result",), rejected=(),
                               notes=(f"backend={forced!r} is not run for a call with zero elements",) if forced
                               else ())
        decision = forced_decision(call, forced, self.adapter(forced)) if forced else self._decide(call, dev_key)
        skipped = {} if forced else self.failures.skipped(failure_signature(call, scale, opts))
        order, basis, rejected, notes = without_skipped(decision, skipped, None if forced else EXACT)
        serving = getattr(self.adapter(order[0]), "serving_notes", None) if order else None  # AdapterBase's
        if serving is not None:
            notes = (*notes, *serving(call))
        return Explanation(call=call, device=dev_key, shape_class=str(class_of_call(call)),
                           chosen=order[0] if order else None, forced=forced is not None, order=order,
                           basis=basis, rejected=rejected, notes=notes)

    # -- running ----------------------------------------------------------------------------------------
    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float | None,
            backend: str | None, precision: str, needs_grad: bool) -> torch.Tensor:
        """Serve one call on validated ``[B, H, S, D]`` tensors.

        Raises:
            DispatchError: a forced backend is unknown or cannot serve the call.
        """
        forced = _FORCED.get() if backend is None else backend
        route = self._plain_route(q, k, v, causal=causal, scale=scale, precision=precision,
                                  needs_grad=needs_grad, forced=forced, bshd=False)
        out: torch.Tensor = self.serve(route, q, k, v, forced)
        return out

    def pinned(self, key: tuple[Any, ...], served: Any) -> Any:
        """For a call under saved-tensor hooks (the non-reentrant ``torch.utils.checkpoint``'s forward or its
        recomputation; the caller asks :func:`attnforge.backends._base.saving_tensors` first): in the forward,
        ``served`` (the route or plan about to serve the call of signature ``key``) is kept and returned; in the
        recomputation (inside the backward), the one its forward kept. A recomputation must save the tensors its
        forward saved: a class decided anew in between (a measurement landing, an in-situ revert made by a call
        outside the region, another layer's first use) sent it to another backend, and the backward raised
        ``CheckpointError`` (review, 2026-12-02). Several forwards before their backwards (gradient accumulation,
        pipeline schedules) keep the latest forward's: the same unless the decision changed between them."""
        if torch._C._current_graph_task_id() != -1:  # inside a backward: the recomputation
            return self.pins.get(key, served)
        if len(self.pins) >= ROUTES_MAX:
            self.pins.clear()
        self.pins[key] = served
        return served

    def serve(self, route: Route, q: Any, k: Any, v: Any, forced: str | None) -> Any:
        """Run ``route`` on the caller's tensors. The one rule for plain and featured calls alike
        (docs/dispatch-policy.md): the first backend that does not raise serves the call; an unforced backend
        that raises is skipped for the call's signature (:meth:`_demote`) and the next one serves; the last
        one's error (the exact math's, or a forced backend's) reaches the caller, and so does running out of
        memory (a fallback would need more still). A first backend that missed a file of a compile cache whose
        folder was removed while the process ran gets the call once more, the folder made again
        (:func:`attnforge._system.compile_cache.recreate_folder`). A sparse or MKL-DNN tensor among the call's
        arguments (whose shape, dtype and device pass validation) is refused with :class:`DispatchError` once a
        backend raised on it, and no backend is skipped."""
        steps = route[0]
        try:  # the first backend serves nearly every call: no loop on the hot path
            return steps[0][1](q, k, v)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:
            if callers_own(exc):
                raise  # activation checkpointing stopping its recomputation: not a failure of the backend
            if isinstance(exc, FileNotFoundError) and recreate_folder(exc):
                # a compile cache's folder removed while the process ran, made again: the same call once more (a
                # second miss finds the folder there and takes the rule below)
                return self.serve(route, q, k, v, forced)
            refuse_non_strided({"q": q, "k": k, "v": v, **(route[2][1] or {})})
            if forced or len(steps) == 1:
                raise
            self._demote(steps[0][0].name, exc, route, (q, k, v))
        last = len(steps) - 1
        for i in range(1, len(steps)):
            adapter, fn = steps[i]
            try:
                return fn(q, k, v)
            except torch.OutOfMemoryError:
                raise
            except Exception as exc:
                if i == last or callers_own(exc):
                    raise
                self._demote(adapter.name, exc, route, (q, k, v))
        raise AssertionError("unreachable: the last backend returned or raised")

    def forget_decisions(self) -> None:
        """Drop the remembered decisions and routes (the next call of each class decides again, and may be
        measured on first use); records stay."""
        with self._lock:
            self._generation += 1
            self._plans.clear()
            self.routes.clear()
            self.feature_plans.clear()

    def forget_feature_plans(self, which: Callable[[AttentionCall], bool]) -> None:
        """Drop the remembered feature plans whose call ``which`` picks (the next call of their signature plans
        again from the class's decision, which stays, as do the routes and every other plan)."""
        with self._lock:
            for key in [key for key, plan in self.feature_plans.items() if which(plan.call)]:
                del self.feature_plans[key]

    def _demote(self, name: str, exc: Exception, route: Route, tensors: tuple[Any, Any, Any]) -> None:
        """Skip ``name`` for the signature of ``route``'s call, or its shape class (the rule and the warning:
        :meth:`FailureMemory.demote`); the routes are rebuilt, and the plans when a class lost it. Nothing is
        skipped where the call (``tensors``: its q, k, v) ran inside what its signature does not hold
        (:func:`~attnforge.dispatch.failures.unrecorded_context`)."""
        outcome = self.failures.demote(name, exc, route[1], *route[2], context=unrecorded_context(*tensors))
        if outcome is not None:
            with self._lock:
                self._generation += 1
                self.routes.clear()
                self.feature_plans.clear()
                if outcome == "class":
                    self._plans.clear()
