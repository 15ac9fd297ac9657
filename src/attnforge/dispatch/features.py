"""The feature path of :func:`attnforge.attention`: masks, dropout, windows, softcap, sinks, lse, varlen.

A call that uses none of these takes the route cache of :mod:`attnforge.dispatch.runtime` (the hot path);
every other call comes here: its arguments are checked, the features it uses are named (the names of
:data:`attnforge.backends.adapter.FEATURES`), and it is served by the first backend in the decided order whose
capabilities list every one of them, the SDPA fallback when it has them all, else the exact math fallback
(:mod:`attnforge.backends.exact`). A backend gets only the keywords of the features the call uses.

Also here, because the decision uses them: which adapters a call admits (:func:`admit`: features, and the
rule for kernels compiled per shape) and how a decision ends (:func:`close_with_fallback`).
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from attnforge.backends._base import callers_own, kept_version, records_grad, saving_tensors
from attnforge.backends.adapter import AttentionCall, BackendAdapter, required_features, supported_features
from attnforge.backends.exact import EXACT
from attnforge.dispatch.inputs import (
    bound_window,
    check_dropout,
    check_dtypes,
    check_flag,
    check_heads,
    check_index_tensor,
    check_layout_and_precision,
    check_mask,
    check_max_seqlen,
    check_offsets,
    check_scale,
    check_sinks,
    check_softcap,
    check_softcap_scale,
    check_window,
    mask_view,
    refuse_nested_or_packed,
    validate,
)
from attnforge.dispatch.policy import FALLBACK, Decision, Rejection
from attnforge.errors import DispatchError
from attnforge.ranking import Measurement, beats
from attnforge.records import VerifyRecord

if TYPE_CHECKING:
    import torch

ALIGNMENTS = ("bottom_right", "top_left")
#: a shape class with more exact shapes than this is dynamic (generation): no per-shape JIT kernel for it
DYNAMIC_AFTER = 3


def is_empty(q: torch.Tensor, k: torch.Tensor) -> bool:
    """bhsd ``q``/``k`` with a zero batch, head count, length or head dim: served without a kernel."""
    return q.shape[0] == 0 or q.shape[1] == 0 or q.shape[2] == 0 or k.shape[2] == 0 or q.shape[3] == 0


def one_line(exc: BaseException, limit: int = 240) -> str:
    """``"Type: first line of the message"``, at most ``limit`` characters: a warning, never a trace."""
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def admit(call: AttentionCall, adapters: Mapping[str, BackendAdapter], *, tflops: Mapping[str, float],
          shapes_seen: int, verified: Mapping[str, VerifyRecord] | None = None,
          fallback: BackendAdapter | None = None) -> tuple[dict[str, BackendAdapter], list[Rejection]]:
    """Split ``adapters`` into those that may serve ``call`` and those refused here, with the reason.

    Refused: an adapter that lacks a feature the call uses; an adapter compiled per exact shape
    (``caps.jit_per_shape``) unless bench measured it fastest for the call's shape class, and always once
    the class has shown more than :data:`DYNAMIC_AFTER` exact shapes (each would compile anew) - except where
    the ``fallback`` (SDPA) lacks a feature of the call, when the alternative is the exact math and one compile
    per shape is worth it while the class is not dynamic; an adapter
    whose ``caps.win_required_on`` names the call's device unless bench measured it faster than plain SDPA
    for the class (so plain SDPA stays the default on CPU); an adapter whose verify record lists a feature
    of the call among its ``failed_features``.
    """
    admitted: dict[str, BackendAdapter] = {}
    refused: list[Rejection] = []
    sdpa_lacks = bool(required_features(call) - supported_features(fallback)) if fallback is not None else False
    for name, adapter in adapters.items():
        reasons = []
        needed = required_features(call)
        missing = needed - supported_features(adapter)
        if missing:
            reasons.append(f"does not support {', '.join(sorted(missing))}")
        record = (verified or {}).get(name)
        failed = needed & set(record.details.get("failed_features", ())) if record is not None else set()
        if failed:
            reasons.append(f"verify failed for {', '.join(sorted(failed))} (attnforge verify {name} says why)")
        caps = getattr(adapter, "caps", None)
        if call.device_type in getattr(caps, "win_required_on", ()) and not (
                name in tflops and tflops[name] > tflops.get(FALLBACK, float("inf"))):
            reasons.append(f"on {call.device_type} chosen only where bench measured it faster than plain SDPA"
                           f" for this shape class (run: attnforge bench --device {call.device_type})")
        if getattr(caps, "jit_per_shape", False):
            best = max(tflops.values(), default=0.0)
            if not sdpa_lacks and (name not in tflops or tflops[name] < best):
                reasons.append("compiles per shape and bench measured no win for this shape class")
            elif shapes_seen > DYNAMIC_AFTER:
                reasons.append(f"compiles per shape and this shape class changed shape {shapes_seen} times")
        if reasons:
            refused.append(Rejection(backend=name, reasons=tuple(reasons)))
        else:
            admitted[name] = adapter
    return admitted, refused


def close_with_fallback(decision: Decision, call: AttentionCall, fallback: BackendAdapter,
                        refused: list[Rejection], measured: Mapping[str, Measurement] | None = None) -> Decision:
    """Take the ``refused`` backends out of the order (their reasons join the others); when SDPA lacks a
    feature of the call, SDPA leaves the order and the exact math ends it, after every verified backend that
    serves the call: the exact math serves only what no verified kernel can (issue 22: a Gemma-2 call went to
    it, 28x slower than a verified FlexAttention that had the features). The exact math is then the baseline a
    kernel must not be slower than, as plain SDPA is for plain calls: where it was measured (``measured``,
    first use times it as a candidate then) and it beats every kernel left in the order beyond the noise
    (:func:`attnforge.ranking.beats`), it leads; on a tie the kernel keeps the call (it needs far less memory)."""
    extra = {r.backend: r.reasons for r in refused}
    if not extra and not required_features(call) - supported_features(fallback):
        return decision
    kept = [(n, b) for n, b in zip(decision.order, decision.basis, strict=True) if n not in extra]
    rejected = [Rejection(backend=r.backend, reasons=tuple(dict.fromkeys((*r.reasons, *extra.pop(r.backend, ())))))
                for r in decision.rejected]
    rejected += [Rejection(backend=name, reasons=reasons) for name, reasons in extra.items()]
    missing = required_features(call) - supported_features(fallback)
    exact = None
    if missing:
        lacks = f"does not support {', '.join(sorted(missing))}"
        why = f"exact fallback: float32 math in torch (SDPA {lacks})"
        kept = [(n, b) for n, b in kept if n not in (FALLBACK, EXACT)]
        exact = (measured or {}).get(EXACT)
        others = [(measured or {}).get(n) for n, _ in kept]
        if exact is not None and kept and all(m is not None and beats(exact, m) for m in others):
            kept.insert(0, (EXACT, f"{why}; measured {exact.tflops:.4g} TFLOP/s, faster than every kernel that "
                                   "serves the call beyond the noise"))
        else:
            kept.append((EXACT, why))
        rejected.append(Rejection(backend=FALLBACK, reasons=(lacks,)))
    return dataclasses.replace(decision, order=tuple(n for n, _ in kept), basis=tuple(b for _, b in kept),
                               rejected=tuple(rejected), exact=exact)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """A checked feature call: the tensors the backend gets, what the decision sees, the keywords to pass.

    Attributes:
        q, k, v: bhsd views (dense) or the packed tensors (varlen).
        probe: bhsd tensors with the call's sizes, for the decision (the q and k views when dense).
        empty: a zero-sized call (served without a kernel).
        uses: the features the call uses (:data:`~attnforge.backends.adapter.FEATURES` names).
        head_dim_v: Dv when it differs from D.
        opts: the feature keywords every backend in the order gets.
        causal, needs_grad: as the call.
        scale: the checked softmax scale (a float, or None for ``1/sqrt(D)``).
    """

    q: Any
    k: Any
    v: Any
    probe: tuple[Any, Any]
    empty: bool
    uses: frozenset[str]
    head_dim_v: int | None
    opts: dict[str, Any]
    causal: bool
    needs_grad: bool
    scale: float | None = None

    def template(self) -> Prepared:
        """This call without its tensors (q, k, v, the mask): what a remembered plan may hold without keeping
        a caller's tensors alive (a decode loop's K/V caches, a prefill's mask)."""
        opts = {name: val for name, val in self.opts.items() if name != "attn_mask"}
        return Prepared(q=None, k=None, v=None, probe=(None, None), empty=self.empty, uses=self.uses,
                        head_dim_v=self.head_dim_v, opts=opts, causal=self.causal, needs_grad=self.needs_grad,
                        scale=self.scale)

    def rebound(self, q: Any, k: Any, v: Any, attn_mask: Any, *, layout: str) -> Prepared:
        """This checked dense call (or its :meth:`template`) on new tensors of the same :func:`signature`
        (:meth:`arguments`); every scalar keyword stays as checked."""
        q, k, v, opts = self.arguments(q, k, v, attn_mask, layout=layout)
        return Prepared(q=q, k=k, v=v, probe=(q, k), empty=False, uses=self.uses, head_dim_v=self.head_dim_v,
                        opts=opts, causal=self.causal, needs_grad=self.needs_grad, scale=self.scale)

    def arguments(self, q: Any, k: Any, v: Any, attn_mask: Any, *, layout: str) -> tuple[Any, Any, Any, dict[str, Any]]:
        """What a backend gets for new tensors of this call's signature: their bhsd views, and the feature
        keywords with the mask as :func:`~attnforge.dispatch.inputs.mask_view` gives it."""
        if layout == "bshd":
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        return q, k, v, (self.opts if attn_mask is None else {**self.opts, "attn_mask": mask_view(attn_mask)})


def attention(q: Any, k: Any, v: Any, *, dispatcher: Any, layout: str, backend: str | None, precision: str,
              scale: float | None, lane: bool = False, **kwargs: Any) -> Any:
    """Serve a call that uses a feature (see the module docstring) on ``dispatcher`` (the process-wide
    :class:`~attnforge.dispatch.dispatcher.Dispatcher` that :func:`attnforge.attention` passes); the other arguments
    as :func:`attnforge.attention`. ``lane``: the call is a bhsd call with a mask and a scale and nothing else, no
    backend forced (:func:`lane_call` can serve its repeats): a plan served directly offers its backend's lane."""
    generation = dispatcher.generation  # before the plan is read: a lane holds only while its plan does
    key = signature(q, k, v, layout=layout, backend=backend, precision=precision, scale=scale, kwargs=kwargs)
    plans = dispatcher.feature_plans
    plan = plans.get(key) if key is not None else None
    # a checkpointed forward or its recomputation (:meth:`Dispatcher.pinned`): the recomputation takes the plan its
    # forward took, whatever was decided in between
    import torch

    pinning = key is not None and torch.is_grad_enabled() and saving_tensors()
    if pinning and torch._C._current_graph_task_id() != -1:
        plan = dispatcher.pinned(key, plan)
    dynamic = None
    if plan is None and key is not None:  # a new length of a dynamic class: its class-level plan, if any
        dynamic = dynamic_signature(key, layout=layout)
        plan = plans.get(dynamic) if dynamic is not None else None
        if plan is not None and not _same_window(plan.prepared, kwargs.get("window"), key, layout=layout):
            plan = None
        if plan is not None:  # the next call of this exact signature (the next layer) finds it at once
            dispatcher.remember_plan(key, plan)
    if plan is not None:  # a signature served before: checked then, decided then; only its tensors are new
        call = plan.prepared
        out = _direct(plan, q, k, v, kwargs["attn_mask"], layout=layout)
        if out is None:
            call = call.rebound(q, k, v, kwargs["attn_mask"], layout=layout)
            out = dispatcher.serve(dispatcher.planned_route(plan, call), call.q, call.k, call.v, backend)
        elif lane:
            _offer_lane(plan, q, k, v, kwargs["attn_mask"], scale=scale, softcap=kwargs.get("softcap"),
                        dispatcher=dispatcher, generation=generation)
    else:
        call = prepare(q, k, v, layout=layout, precision=precision, scale=scale, **kwargs)
        out = _serve(dispatcher, call, scale=call.scale, backend=backend, precision=precision, keys=(key, dynamic))
        plan = plans.get(key) if lane and key is not None else None  # the plan this call's decision was kept as
        if plan is not None and plan.direct is not None:
            _offer_lane(plan, q, k, v, kwargs["attn_mask"], scale=scale, softcap=kwargs.get("softcap"),
                        dispatcher=dispatcher, generation=generation)
    if pinning and key is not None and (kept := plans.get(key)) is not None:
        dispatcher.pinned(key, kept)  # the forward's (a no-op in the recomputation)
    if layout == "bshd" and "varlen" not in call.uses:
        # contiguous, as flash_attn_func's output is (a bshd caller's next step is often ``out.view(B, S, -1)``):
        # a backend that computed bhsd (the exact math for a softcap or sinks, Flex) gave a transposed view, which
        # ``view`` refuses (2026-12-02); a no-op where the backend wrote bshd already
        if "lse" in call.uses:
            return out[0].transpose(1, 2).contiguous(), out[1]
        return out.transpose(1, 2).contiguous()
    return out


def _direct(plan: Any, q: Any, k: Any, v: Any, attn_mask: Any, *, layout: str) -> Any:
    """A remembered signature's output from its first backend called directly (``plan.direct``: unforced, nothing
    wrapping its step), or None when there is none or it raised: the whole route then
    serves the call, with the rule for a backend that raises (``Dispatcher.serve``). The arguments are
    :meth:`Prepared.arguments`, without building a :class:`Prepared` or a route."""
    import torch

    adapter = plan.direct
    if adapter is None:
        return None
    t = plan.prepared
    q, k, v, opts = t.arguments(q, k, v, attn_mask, layout=layout)
    try:
        return adapter(q, k, v, causal=t.causal, scale=t.scale, **opts)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:  # the route runs it again and handles it as any raising backend
        if callers_own(exc):
            raise  # activation checkpointing stopping its recomputation
        return None


@dataclasses.dataclass(slots=True)
class _Lane:
    """A remembered call's direct backend path (:func:`lane_call`) and what a repeat of that call must match."""

    mask: weakref.ref[Any]
    version: int
    dispatcher: weakref.ref[Any]
    generation: int
    scale: Any
    softcap: Any
    geometry: tuple[Any, ...]
    run: Callable[..., Any] | None  # None: the backend offered none for this mask (not asked again for it)


#: each thread's lanes (:func:`lane_call`), the newest first, one per mask object
_LANES = threading.local()
#: lanes kept per thread: transformers' models pass one mask a forward (Gemma-2 two, alternating by layer)
LANES_KEPT = 4


def _geometry(q: Any, k: Any, v: Any) -> tuple[Any, ...]:
    """What a repeat of a call must share with it besides the mask object and the scale: q, k and v's shapes,
    strides, dtypes and devices."""
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype, q.device,
            k.device, v.device)


def _same_scale(a: Any, b: Any) -> bool:
    return a is b or (a.__class__ is float and b.__class__ is float and a == b)


def lane_call(q: Any, k: Any, v: Any, attn_mask: Any, *, scale: Any, dispatcher: Any, softcap: Any = None) -> Any:
    """A repeat of one of this thread's last lane-offering calls (:func:`attention` with ``lane``): the same mask
    object at the same version counter, q/k/v of the same geometry (:func:`_geometry`), the same scale and softcap
    (None, or the same float), on the same
    dispatcher with its plans unchanged since (:attr:`~attnforge.dispatch.dispatcher.Dispatcher.generation`),
    served by the lane its backend offered (for SDPA, :class:`attnforge.backends.sdpa.DecodeLane`; for
    FlashAttention-4's padded decode route, :class:`attnforge.backends.flash.Fa4DecodeLane`): the next
    layers of a decode step, which transformers calls with one mask object, skip the call's signature, the plan
    lookup and the adapter's checks. Returns the output ``[B, Hq, Sq, Dv]``, or None for any other call (and where
    the lane declines it): :func:`attention` then serves it. Never raises for bad input (that is
    :func:`attention`'s to report)."""
    lanes = getattr(_LANES, "lanes", None)
    if not lanes:
        return None
    for lane in lanes:
        if lane.mask() is attn_mask:
            break
    else:
        return None
    if (lane.run is None or lane.dispatcher() is not dispatcher or lane.generation != dispatcher.generation
            or not _same_scale(scale, lane.scale) or not _same_scale(softcap, lane.softcap)):
        return None
    try:
        if kept_version(attn_mask) != lane.version or _geometry(q, k, v) != lane.geometry:
            return None
    except (AttributeError, RuntimeError, TypeError):  # not tensors, nested shapes: attention() says what is wrong
        return None
    import torch

    try:
        out = lane.run(q, k, v, attn_mask)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:  # as features._direct: attention() serves it, with the rule for a raising backend
        if callers_own(exc):
            raise  # activation checkpointing stopping its recomputation
        lane.run = None
        return None
    if out is None and getattr(lane.run, "retired", False):
        lane.run = None  # it declines for good: not asked again for this mask object
    return out


def _offer_lane(plan: Any, q: Any, k: Any, v: Any, attn_mask: Any, *, scale: Any, softcap: Any, dispatcher: Any,
                generation: int) -> None:
    """After ``plan``'s direct backend served a call that :func:`lane_call` can serve the repeats of: keep that
    backend's lane for it (``decode_lane``, where the backend has one), one per mask object and thread, made again
    when the mask changed in place (a mask object reused step after step), the plans changed, or the geometry or
    scale differ; the :data:`LANES_KEPT` newest are kept."""
    import torch

    try:
        if attn_mask.__class__ is not torch.Tensor:
            return  # a tensor subclass
        version, geometry = kept_version(attn_mask), _geometry(q, k, v)
        if version is None:
            return  # no version counter to check (torch.inference_mode, a mask attnforge did not make)
    except (AttributeError, RuntimeError, TypeError):
        return
    lanes = getattr(_LANES, "lanes", None)
    if lanes is None:
        lanes = _LANES.lanes = []
    for lane in lanes:
        if lane.mask() is attn_mask:
            if (lane.version == version and lane.generation == generation and lane.geometry == geometry
                    and _same_scale(scale, lane.scale) and _same_scale(softcap, lane.softcap)
                    and lane.dispatcher() is dispatcher):
                return  # asked already for this call
            break
    offer = getattr(plan.direct, "decode_lane", None)
    try:
        run = None if offer is None else offer(q, k, v, attn_mask, scale=plan.prepared.scale,
                                               softcap=plan.prepared.opts.get("softcap"))
    except (AttributeError, RuntimeError, TypeError):
        return
    made = _Lane(mask=weakref.ref(attn_mask), version=version, dispatcher=weakref.ref(dispatcher),
                 generation=generation, scale=scale, softcap=softcap, geometry=geometry, run=run)
    # this mask's older lane and the lanes of masks that are gone make way (identity only: == on tensors compares
    # their elements)
    kept = [lane for lane in lanes if (m := lane.mask()) is not None and m is not attn_mask]
    lanes[:] = [made, *kept[: LANES_KEPT - 1]]


#: the keywords of :func:`prepare` a call signature (:func:`signature`) does not carry: tensors other than the mask
#: (and varlen's lengths); a call that passes one is not signed
_UNSIGNED = ("sinks", "cu_seqlens_q", "cu_seqlens_k", "block_table", "seqused_k", "max_seqlen_q", "max_seqlen_k")


def signature(q: Any, k: Any, v: Any, *, layout: str, backend: str | None, precision: str, scale: Any,
              kwargs: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The exact signature of a dense call with features: everything :func:`prepare` and the decision look at
    (shapes, dtypes, devices, whether autograd records it, the mask's shape, dtype and device, every scalar
    keyword), never a tensor's values. None for a call that is not signed this way (a tensor feature other than
    the mask: sinks, varlen offsets, a page table; an unhashable keyword; while ``torch.compile`` traces)."""
    import torch

    get = kwargs.get
    for name in _UNSIGNED:
        if get(name) is not None:
            return None
    mask = get("attn_mask")
    try:
        if mask is not None and not (mask.__class__ is torch.Tensor and not mask.is_nested):
            return None
        if not (q.__class__ is k.__class__ is v.__class__ is torch.Tensor) or torch.compiler.is_compiling():
            return None
        grad = records_grad(q, k, v, mask)  # a mask that requires grad (a learned bias) needs a backward too
        key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device,
               None if mask is None else (mask.shape, mask.dtype, mask.device), grad, layout, backend, precision,
               scale, scale.__class__, tuple(kwargs),
               *[None if val is mask else _typed(val) for val in kwargs.values()])
        hash(key)
    except (AttributeError, RuntimeError, TypeError, ValueError):  # nested shapes, unhashable windows, ...
        return None
    return key


def _typed(value: Any) -> Any:
    """``value`` with its class (a tuple's, element by element) for a signature: ``True == 1`` and ``False == 0.0``
    hash alike, so without it ``softcap=True``, ``window=(True, 0)`` or ``dropout_p=False`` would reuse the plan of
    an equal valid call instead of being refused."""
    if value.__class__ is tuple:
        return tuple((part.__class__, part) for part in value)
    return value.__class__, value


def dynamic_signature(key: tuple[Any, ...], *, layout: str) -> tuple[Any, ...] | None:
    """The class-level form of an exact :func:`signature`: the same call at any sequence lengths of the same
    power-of-two buckets (:func:`attnforge.types.shapes.bucket`, the shape class's), with Sq == Sk or not as the
    signature has it, and Sq > Sk too (under causal alignment bottom-right its first rows see no key, which some
    backends refuse; and V's length == K's), the mask's last two dimensions named where they are Sk and Sq rather
    than sized. A dynamic shape class (a decode loop: a new Sk every step) reuses the plan decided for it under this
    key, for every length (:meth:`~attnforge.dispatch.dispatcher.Dispatcher.feature_route` stores it once the class
    is dynamic, when the decision no longer depends on the exact shape). None for a zero-sized call.

    What :func:`prepare` derives from the lengths is either in the key (the buckets, Sq == Sk, which mask
    dimensions are a length) or checked again per call (a window's sides past the sequences: :func:`_same_window`)."""
    from attnforge.types.shapes import bucket

    s = 2 if layout == "bhsd" else 1
    q_shape, k_shape, v_shape = key[0], key[1], key[2]
    if 0 in q_shape or 0 in k_shape or 0 in v_shape:
        return None
    sq, sk = q_shape[s], k_shape[s]

    def sized(shape: Any, n: int) -> tuple[Any, ...]:
        return (*shape[:s], ("S", bucket(n)), *shape[s + 1:])

    mask = key[9]
    if mask is not None:  # its last dimension is Sk's, the one before Sq's (or 1: broadcast); the rest are sizes
        dims = list(mask[0])
        for i, (n, name) in enumerate(((sk, "Sk"), (sq, "Sq")), start=1):
            if i <= len(dims) and dims[-i] == n:
                dims[-i] = name
        mask = (tuple(dims), *mask[1:])
    return ("dynamic", sized(q_shape, sq), sized(k_shape, sk), sized(v_shape, v_shape[s]), *key[3:9], mask,
            *key[10:], (sq > sk) - (sq < sk), v_shape[s] == sk)


def _same_window(template: Prepared, window: Any, key: tuple[Any, ...], *, layout: str) -> bool:
    """Whether ``window`` bounds the same sides at this call's lengths (in ``key``) as it did for ``template``'s
    call: a side at least ``max(Sq, Sk)`` is unbounded (:func:`~attnforge.dispatch.inputs.bound_window`), so
    a window can start to bind as a decode loop's Sk grows."""
    if window is None:
        return True
    s = 2 if layout == "bhsd" else 1
    bounded = bound_window(check_window(window), key[0][s], key[1][s])
    return bool(template.opts.get("window", (None, None)) == bounded)


def prepare(
    q: Any, k: Any, v: Any, *, attn_mask: Any = None, dropout_p: float = 0.0, scale: float | None = None,
    causal: bool = False, causal_alignment: str = "bottom_right", enable_gqa: bool = True, window: Any = None,
    softcap: float | None = None, sinks: Any = None, return_lse: bool = False, cu_seqlens_q: Any = None,
    cu_seqlens_k: Any = None, max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
    layout: str = "bhsd", precision: str = "exact", is_causal: bool | None = None, block_table: Any = None,
    seqused_k: Any = None,
) -> Prepared:
    """Check a call's arguments and name its features; raises :class:`DispatchError` for bad input.

    ``is_causal=True`` is SDPA's: causal, aligned top-left (``causal=True, causal_alignment="top_left"``);
    ``causal=True`` keeps FlashAttention's bottom-right alignment (or ``causal_alignment``'s). Passing both
    ``causal=True`` and ``is_causal`` is refused unless they agree (``is_causal=True`` with
    ``causal_alignment="top_left"``).
    """
    causal = check_flag("causal", causal)
    enable_gqa = check_flag("enable_gqa", enable_gqa)
    return_lse = check_flag("return_lse", return_lse)
    if causal_alignment not in ALIGNMENTS:
        raise DispatchError(f"unknown causal_alignment {causal_alignment!r}",
                            hint="use 'bottom_right' (FlashAttention) or 'top_left' (SDPA's is_causal)")
    if is_causal is not None:
        is_causal = check_flag("is_causal", is_causal)
        if causal and not (is_causal and causal_alignment == "top_left"):
            raise DispatchError(f"causal=True and is_causal={is_causal} disagree: causal aligns bottom-right"
                                " (FlashAttention), is_causal top-left (SDPA)",
                                hint="pass one of them (is_causal=True is causal=True,"
                                     " causal_alignment='top_left')")
        if is_causal:
            causal, causal_alignment = True, "top_left"
    scale = check_scale(scale)
    refuse_nested_or_packed(q, k, v, packed=False)
    uses: set[str] = set()
    opts: dict[str, Any] = {}
    dropout_p = check_dropout(dropout_p)
    if dropout_p:
        uses.add("dropout")
        opts["dropout_p"] = dropout_p
    sides = check_window(window) if window is not None else None
    softcap = check_softcap(softcap)
    check_softcap_scale(softcap, scale)
    if softcap:
        uses.add("softcap")
        opts["softcap"] = softcap
    if return_lse:
        uses.add("lse")
        opts["return_lse"] = True
    if block_table is not None or seqused_k is not None:
        if cu_seqlens_q is not None or cu_seqlens_k is not None or attn_mask is not None:
            raise DispatchError("a paged KV call takes no cu_seqlens and no attn_mask",
                                hint="seqused_k gives each sequence's length in its pages")
        return _paged(q, k, v, block_table=block_table, seqused_k=seqused_k, layout=layout, precision=precision,
                      scale=scale, uses=uses, opts=opts, causal=causal, alignment=causal_alignment,
                      enable_gqa=enable_gqa, sinks=sinks, window=sides)
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        check_layout_and_precision(layout, precision)
        return _varlen(q, k, v, uses=uses, opts=opts, attn_mask=attn_mask, causal=causal,
                       alignment=causal_alignment, enable_gqa=enable_gqa, sinks=sinks, cu_q=cu_seqlens_q,
                       cu_k=cu_seqlens_k, max_q=max_seqlen_q, max_k=max_seqlen_k, window=sides, scale=scale)
    refuse_nested_or_packed(q, k, v, packed=True)
    qh, kh, vh = validate(q, k, v, layout=layout, precision=precision, scale=scale)
    check_heads(qh.shape[1], kh.shape[1], enable_gqa)
    if attn_mask is not None:
        opts["attn_mask"] = check_mask(attn_mask, qh, kh)
        uses.add("mask")
    _window(sides, qh.shape[2], kh.shape[2], uses=uses, opts=opts)
    dv = _shared_features(qh, vh, uses=uses, opts=opts, causal=causal, alignment=causal_alignment, sinks=sinks,
                          square=qh.shape[2] == kh.shape[2])
    # a mask that requires grad (a learned bias, T5's position bias) needs a backend with a backward pass as q does:
    # flex on CPU, which has none, raised inside Inductor for such a call
    return Prepared(q=qh, k=kh, v=vh, probe=(qh, kh), empty=is_empty(qh, kh) or vh.shape[3] == 0, uses=frozenset(uses),
                    head_dim_v=dv, opts=opts, causal=causal, needs_grad=records_grad(q, k, v, sinks, attn_mask),
                    scale=scale)


def _window(sides: tuple[int | None, int | None] | None, seqlen_q: int, seqlen_k: int, *, uses: set[str],
            opts: dict[str, Any]) -> None:
    """Name the window feature when ``sides`` (checked) still bound a side once sides past the sequences are
    made unbounded (:func:`~attnforge.dispatch.inputs.bound_window`)."""
    if sides is None:
        return
    bounded = bound_window(sides, seqlen_q, seqlen_k)
    if bounded != (None, None):
        uses.add("window")
        opts["window"] = bounded


def _serve(dispatcher: Any, call: Prepared, *, scale: float | None, backend: str | None,
           precision: str, keys: tuple[tuple[Any, ...] | None, tuple[Any, ...] | None] = (None, None)) -> Any:
    """Run the decided order on the prepared call (:meth:`~attnforge.dispatch.dispatcher.Dispatcher.serve`:
    the one rule for plain and featured calls); ``keys``: the call's :func:`signature` and
    :func:`dynamic_signature`, to remember its plan."""
    if call.empty:  # no kernel ever sees a zero-sized input; the exact math returns the right empty/zero result
        if backend is not None:
            dispatcher.adapter(backend)  # an unknown name is refused here too
        return dispatcher.exact(call.q, call.k, call.v, causal=call.causal, scale=scale, **call.opts)
    route = dispatcher.feature_route(call, scale=scale, forced=backend, precision=precision, key=keys[0],
                                     dynamic_key=keys[1])
    return dispatcher.serve(route, call.q, call.k, call.v, backend)


def _varlen(q: Any, k: Any, v: Any, *, uses: set[str], opts: dict[str, Any], attn_mask: Any,
            causal: bool, alignment: str, enable_gqa: bool, sinks: Any, cu_q: Any, cu_k: Any,
            max_q: Any, max_k: Any, window: tuple[int | None, int | None] | None, scale: float | None) -> Prepared:
    """Packed ``[total, H, D]`` sequences with ``cu_seqlens``: checked, then served like a dense call."""
    import torch

    if cu_q is None or cu_k is None:
        raise DispatchError("varlen needs both cu_seqlens_q and cu_seqlens_k",
                            hint="for self-attention pass the same offsets twice")
    if attn_mask is not None:
        raise DispatchError("varlen calls take no attn_mask",
                            hint="the sequences in cu_seqlens are the mask; use causal/window for more")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise DispatchError(f"varlen {name} must be a packed [total, H, D] tensor",
                                cause=f"got {getattr(t, 'shape', type(t).__name__)}",
                                hint="pack the sequences along dim 0: torch.cat(seqs) with [len, H, D] each")
    if k.shape[:2] != v.shape[:2] or q.shape[2] != k.shape[2] or not k.shape[1] or q.shape[1] % k.shape[1]:
        raise DispatchError("varlen q, k, v disagree in length, heads or head dim",
                            cause=f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}",
                            hint="k and v need the same rows and heads, q and k the same head dim, Hq % Hkv == 0")
    check_dtypes(q, k, v)
    if q.device != k.device or q.device != v.device:
        raise DispatchError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}",
                            hint="move them to one device: k.to(q.device), v.to(q.device)")
    check_heads(q.shape[1], k.shape[1], enable_gqa)
    lens_q, lens_k, longest_q, longest_k = check_offsets(cu_q, cu_k, rows_q=q.shape[0], rows_k=k.shape[0],
                                                         device=q.device)
    batch = cu_q.numel() - 1
    max_q = check_max_seqlen("max_seqlen_q", max_q, longest_q, q.shape[0])
    max_k = check_max_seqlen("max_seqlen_k", max_k, longest_k, k.shape[0])
    _window(window, q.shape[0], k.shape[0], uses=uses, opts=opts)
    uses.add("varlen")
    opts.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k)
    if alignment == "top_left" and (causal or "window" in uses) and not torch.equal(lens_q, lens_k):
        uses.add("causal_top_left")
        opts["causal_alignment"] = "top_left"
    if sinks is not None:
        opts["sinks"] = check_sinks(sinks, q.permute(1, 0, 2).unsqueeze(0))
        uses.add("sinks")
    dv = v.shape[2] if v.shape[2] != q.shape[2] else None
    if dv is not None:
        uses.add("dv")
    empty = batch == 0 or q.shape[0] == 0 or k.shape[0] == 0 or q.shape[1] == 0
    # bhsd stand-ins that describe the call to the decision (zero strides over q's and k's first elements)
    if empty:  # no row to stand for the rest: zero-element bhsd stand-ins of the call's sizes
        probe = (q.new_zeros(()).expand(batch, q.shape[1], max_q, q.shape[2]),
                 k.new_zeros(()).expand(batch, k.shape[1], max_k, k.shape[2]))
    else:
        probe = (_rows_as_bhsd(q[0], batch, max_q), _rows_as_bhsd(k[0], batch, max_k))
    return Prepared(q=q, k=k, v=v, probe=probe, empty=empty or not max_q or not max_k,
                    uses=frozenset(uses), head_dim_v=dv, opts=opts, causal=causal,
                    needs_grad=records_grad(q, k, v, sinks), scale=scale)


def _rows_as_bhsd(row: Any, batch: int, seqlen: int) -> Any:
    """One token's ``[H, D]`` row as a ``[batch, H, seqlen, D]`` stand-in (zero strides over batch and sequence, the
    row's own over heads and D): a view, valid whatever the tensor's strides (an expanded or sliced input too,
    where ``as_strided`` with assumed strides read past its storage)."""
    return row.unsqueeze(0).unsqueeze(2).expand(batch, row.shape[0], seqlen, row.shape[1])


def _page_facts(block_table: Any, seqused_k: Any) -> tuple[int, int, int, int]:
    """The lowest and highest page index of ``block_table`` and the lowest and highest length of ``seqused_k`` (0
    where a tensor is empty or None), read in one copy to the host: the paged call's one device sync (three before,
    one per ``int()`` or ``bool()`` of a device value; a serving loop makes a paged call per layer and step)."""
    import torch

    pages, used = block_table.numel() > 0, seqused_k is not None and seqused_k.numel() > 0
    parts = ([block_table.min(), block_table.max()] if pages else []) + ([seqused_k.min(), seqused_k.max()] if used
                                                                          else [])
    values = torch.stack(parts).tolist() if parts else []
    low, high = values[:2] if pages else (0, 0)
    used_low, used_high = values[-2:] if used else (0, 0)
    return low, high, used_low, used_high


def _paged(q: Any, k: Any, v: Any, *, block_table: Any, seqused_k: Any, layout: str, precision: str,
           scale: float | None, uses: set[str], opts: dict[str, Any], causal: bool, alignment: str,
           enable_gqa: bool, sinks: Any, window: tuple[int | None, int | None] | None) -> Prepared:
    """A paged KV call: dense q, K/V page pools addressed by ``block_table``."""
    import torch

    if block_table is None:
        raise DispatchError("seqused_k without block_table", hint="pass the block table of the paged cache")
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise DispatchError(f"paged {name} must be a page pool [num_blocks, page_size, Hkv, D]",
                                cause=f"got {getattr(t, 'shape', type(t).__name__)}",
                                hint="k and v are the page pools; block_table says which pages each sequence uses")
    if k.shape[:3] != v.shape[:3]:
        raise DispatchError("the paged k and v pools differ in pages, page size or K/V heads",
                            cause=f"k {tuple(k.shape)}, v {tuple(v.shape)}",
                            hint="k and v are [num_blocks, page_size, Hkv, D] and [num_blocks, page_size, Hkv, Dv]: "
                                 "one page of v for each page of k")
    if not isinstance(q, torch.Tensor):
        raise DispatchError(f"q is a {type(q).__name__}, not a torch.Tensor", hint="pass torch tensors")
    check_index_tensor("block_table", block_table, dims=2, device=q.device, shape="[B, blocks]")
    pages = block_table.shape[1] * k.shape[1]
    if seqused_k is not None:
        check_index_tensor("seqused_k", seqused_k, dims=1, device=q.device, shape="[B]")
        if tuple(seqused_k.shape) != (block_table.shape[0],):
            raise DispatchError(f"seqused_k must be [B] ints within 0..{pages} (the keys in each sequence's pages)",
                                cause=f"got {tuple(seqused_k.shape)}", hint="one filled length per row of block_table")
    low, high, used_low, used_high = _page_facts(block_table, seqused_k)
    if block_table.numel() and (low < 0 or high >= k.shape[0]):
        raise DispatchError(f"block_table points outside the {k.shape[0]} pages of the cache",
                            hint=f"page indices are 0..{k.shape[0] - 1}")
    if seqused_k is not None and seqused_k.numel() and (used_low < 0 or used_high > pages):
        raise DispatchError(f"seqused_k must be [B] ints within 0..{pages} (the keys in each sequence's pages)",
                            cause=f"got values {used_low}..{used_high}",
                            hint="one filled length per row of block_table")
    if q.dim() == 4 and block_table.shape[0] != q.shape[0]:
        raise DispatchError(f"block_table has {block_table.shape[0]} rows, q a batch of {q.shape[0]}",
                            hint="one block_table row per sequence of q")
    # checked as dense calls: q in its layout against a [B, Hkv, pages, D] view of the pool's first page rows
    probe_k, probe_v = (
        _rows_as_bhsd(t[0, 0], block_table.shape[0], pages) if t.numel()
        else t.new_zeros((block_table.shape[0], t.shape[2], pages, t.shape[3])) for t in (k, v))
    if layout == "bshd":
        probe_k, probe_v = probe_k.transpose(1, 2), probe_v.transpose(1, 2)
    qh, kp, _ = validate(q, probe_k, probe_v, layout=layout, precision=precision, scale=scale)
    check_heads(qh.shape[1], kp.shape[1], enable_gqa)
    _window(window, qh.shape[2], pages, uses=uses, opts=opts)
    uses.add("paged")
    opts.update(block_table=block_table, seqused_k=seqused_k)
    dv = _shared_features(qh, v, uses=uses, opts=opts, causal=causal, alignment=alignment, sinks=sinks)
    return Prepared(q=qh, k=k, v=v, probe=(qh, kp), empty=is_empty(qh, kp), uses=frozenset(uses),
                    head_dim_v=dv, opts=opts, causal=causal, needs_grad=records_grad(q, k, v, sinks), scale=scale)


def _shared_features(qh: Any, v: Any, *, uses: set[str], opts: dict[str, Any], causal: bool, alignment: str,
                     sinks: Any, square: bool = False) -> int | None:
    """Name the features dense and paged calls share (top-left alignment, moot when ``square``; sinks; Dv) in
    ``uses``/``opts``; returns ``Dv`` when it differs from ``D``."""
    if alignment == "top_left" and not square and (causal or "window" in uses):
        uses.add("causal_top_left")
        opts["causal_alignment"] = "top_left"
    if sinks is not None:
        opts["sinks"] = check_sinks(sinks, qh)
        uses.add("sinks")
    dv = v.shape[3] if v.shape[3] != qh.shape[3] else None
    if dv is not None:
        uses.add("dv")
    return dv


def raise_forced(forced: str, decision: Any) -> None:
    """Raise the error of a forced backend that cannot serve a call, with the decision's reasons for it."""
    reasons = "; ".join(decision.rejected[0].reasons)
    raise DispatchError(f"forced attention backend {forced!r} cannot serve this call", cause=reasons,
                        hint="drop the forced backend or change the inputs")
