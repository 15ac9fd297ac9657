"""``attention()``: every call served by the fastest verified backend that supports it, SDPA as the fallback.

Shapes: ``B`` batch, ``Hq`` query heads, ``Hkv`` key/value heads (Hq a multiple of Hkv: GQA), ``Sq``/``Sk``
query/key lengths, ``D`` head dim. ``causal=True`` masks are aligned to the bottom-right when Sq != Sk (query
``i`` sees key ``j`` when ``j <= i + Sk - Sq``, as in FlashAttention >= 2.1); SDPA's ``is_causal=True`` keeps
SDPA's top-left alignment (``j <= i``). :mod:`attnforge.backends.capabilities` documents how each backend is
made to follow either rule.

State per process (thread-safe): verify and bench records, read once per device on first use
(:func:`refresh` re-reads them); the decision per call class; the backends that raised at run time (each
skipped for the call signature it raised on, and for a whole shape class only once it raised on several
signatures of it: :meth:`Dispatcher.serve`); the exact shapes seen per shape class (a
class with many is dynamic, and a backend compiled per shape is not chosen for it); and the *route* per exact
call signature (shapes, dtypes, devices, causal, layout, precision, forced backend, grad).

Calls that use a feature (mask, dropout, window, softcap, sinks, lse, varlen, paged KV, top-left causal) take
:mod:`attnforge.dispatch.features` instead of the route cache; Dv != D and zero-sized inputs stay on the hot
path (a zero-sized call's route is the exact math, so no kernel ever sees it).

The hot path (docs/dispatch-overhead.md): a call whose exact signature was served before looks its route up
in one dict and runs it; validation and the decision ran when the signature was first seen, and they depend
on nothing but the signature, the records and the broken set. :meth:`Dispatcher.refresh` and a backend that
raises clear the routes (a generation counter keeps a route decided before that from being stored after it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from attnforge.backends._base import records_grad, saving_tensors
from attnforge.dispatch import _op, features
from attnforge.dispatch.autotune import AutotuneConfig, configured, contested_rounds_for
from attnforge.dispatch.dispatcher import _FORCED, Dispatcher, RecordSource
from attnforge.dispatch.explanation import Explanation
from attnforge.dispatch.inputs import check_heads, check_scale, check_softcap, check_softcap_scale, check_window
from attnforge.dispatch.inputs import validate as _validate
from attnforge.errors import DispatchError

__all__ = ["Dispatcher", "RecordSource", "attention", "autotune", "explain", "get_dispatcher", "refresh",
           "set_dispatcher", "use_backend"]

_DISPATCHER: Dispatcher | None = None
_DISPATCHER_LOCK = threading.Lock()


def get_dispatcher() -> Dispatcher:
    """The process-wide dispatcher (built on first use)."""
    global _DISPATCHER  # noqa: PLW0603 - one lazily built process-wide state
    if _DISPATCHER is None:
        with _DISPATCHER_LOCK:
            if _DISPATCHER is None:
                _DISPATCHER = Dispatcher()
    return _DISPATCHER


def set_dispatcher(dispatcher: Dispatcher | None) -> Dispatcher | None:
    """Replace the process-wide dispatcher (None: rebuild on next use); returns the previous one.

    The seam for embedding attnforge with custom adapters or record sources, and for tests.
    """
    global _DISPATCHER
    with _DISPATCHER_LOCK:
        previous, _DISPATCHER = _DISPATCHER, dispatcher
    return previous


_op.serve_with(get_dispatcher)  # the compiled path's op runs on the same process-wide dispatcher


def refresh() -> None:
    """Re-read verify and bench records on the next call (after ``attnforge verify`` or ``bench`` ran)."""
    get_dispatcher().refresh()


@contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Force one backend for every :func:`attention` call in this context (per thread / asyncio task).

    Args:
        name: a catalog backend id (``"flash-attn"``, ``"sdpa-cudnn"`` ...) or ``"sdpa"``.

    Raises:
        DispatchError: ``name`` is unknown (the hint lists the known names); a call inside the context that
            the forced backend cannot serve raises with the backend's reasons.
    """
    get_dispatcher().adapter(name)  # validate now, not at the first call
    token = _FORCED.set(name)
    try:
        yield
    finally:
        _FORCED.reset(token)


@contextmanager
def autotune(*, budget_s: float = 1.0, rounds: int = 5, clock: Callable[[], float] = time.perf_counter,
             background: bool = False, compiling: bool = False, layouts: bool = False,
             contested_rounds: int | None = None) -> Iterator[AutotuneConfig]:
    """Measure unmeasured shape classes on first use inside this context, on any device (see
    :mod:`attnforge.dispatch.autotune`; on CUDA it is on by default, this sets the budget). ``ATTNFORGE_AUTOTUNE=0``
    still wins. Classes the process-wide dispatcher decided before the context are considered again; leaving the
    context waits for the measurements started in it.

    Args:
        budget_s: seconds of timed repetitions per shape class, all candidates together.
        rounds: interleaved rounds per candidate.
        clock: the timer on a CPU (tests pass a fake one).
        background: measure off the calling thread, or inside the first call (the default).
        compiling: inside the first call, also time backends that compile their kernel on their first call
            (FlashAttention-4: seconds a kernel variant); ``attnforge warmup`` sets it, the default leaves them
            out so that no call waits for a compile to be measured.
        layouts: also measure a class measured only in the other memory layout (``[B, H, S, D]`` against
            ``[B, S, H, D]`` tensors or views) in the call's own; ``attnforge warmup`` sets it, the default decides
            such a class on the other layout's measurements so that no call waits.
        contested_rounds: further rounds of a class the first ones leave contested (a tie handed to a
            lower-overhead path more than 2 % slower than the top); None: the mode's default
            (:func:`attnforge.dispatch.autotune.contested_rounds_for`: ten off the calling thread, none inside the
            first call; ``attnforge warmup`` passes ten).
    """
    if contested_rounds is None:
        contested_rounds = contested_rounds_for(background=background)
    config = AutotuneConfig(budget_s=budget_s, rounds=max(1, rounds), clock=clock, background=background,
                            compiling=compiling, layouts=layouts, contested_rounds=max(0, contested_rounds))
    with configured(config):
        get_dispatcher().forget_decisions()
        yield config


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0, scale: float | None = None, causal: bool = False,
    causal_alignment: str = "bottom_right", enable_gqa: bool = True,
    window: tuple[int | None, int | None] | None = None, softcap: float | None = None,
    sinks: torch.Tensor | None = None, return_lse: bool = False, cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None, max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
    layout: str = "bhsd", backend: str | None = None, precision: str = "exact", is_causal: bool | None = None,
    block_table: torch.Tensor | None = None, seqused_k: torch.Tensor | None = None,
) -> Any:
    """Scaled dot-product attention on the fastest backend this machine verified for these inputs.

    Every feature is served exactly: a call goes only to a backend whose capability table lists every feature
    it uses, and the exact fallback (float32-accumulating math in torch, :mod:`attnforge.backends.exact`)
    serves what no verified backend does. Nothing is dropped.

    Args:
        q: ``[B, Hq, Sq, D]`` (``[B, Sq, Hq, D]`` with ``layout="bshd"``; packed ``[total_q, Hq, D]`` with
            ``cu_seqlens_q``), float16/bfloat16/float32/float64, CPU or CUDA.
        k: ``[B, Hkv, Sk, D]`` (or ``[B, Sk, Hkv, D]``; packed ``[total_k, Hkv, D]``), Hq a multiple of Hkv.
        v: as k, with its own head dim ``Dv`` (may differ from ``D``).
        attn_mask: bool (True = attend) or additive float mask broadcastable to ``[B, Hq, Sq, Sk]`` (SDPA's);
            it combines with ``causal`` and ``window`` (all of them apply; SDPA itself refuses both at once).
        dropout_p: dropout probability in [0, 1) on the attention weights, applied when > 0 (as SDPA: pass 0
            in eval).
        scale: softmax scale, a number > 0 and at most float32's largest (Python or numpy); None means ``1/sqrt(D)``.
        causal: mask future keys, aligned as ``causal_alignment`` says (bottom-right by default).
        is_causal: SDPA's argument with SDPA's meaning: ``is_causal=True`` is ``causal=True,
            causal_alignment="top_left"``; passing ``causal=True`` as well is an error unless
            ``causal_alignment="top_left"`` (they would disagree when Sq != Sk).
        causal_alignment: ``"bottom_right"`` (FlashAttention: query ``i`` sees key ``j`` iff
            ``j <= i + Sk - Sq``) or ``"top_left"`` (SDPA's ``is_causal``: ``j <= i``); they agree when Sq == Sk.
            Windows are aligned the same way. Rows that see no key are zeros.
        enable_gqa: allow Hq != Hkv (a multiple); False makes Hq != Hkv an error, as in SDPA.
        window: sliding window ``(left, right)`` of ints: query ``i`` sees keys ``i' - left .. i' + right``
            where ``i'`` is ``i`` aligned as above; a None or -1 side is unbounded, and so is a side of at least
            ``max(Sq, Sk)`` (it hides no key; ``10**30`` is accepted and made unbounded).
        softcap: logit soft-capping ``softcap * tanh(logits / softcap)`` (Gemma 2), a finite number >= 0
            (Python or numpy); None or 0: off.
        sinks: ``[Hq]`` float tensor: an extra logit per head in the softmax denominator that carries no
            value (GPT-OSS ``s_aux``).
        return_lse: also return the float32 log-sum-exp ``[B, Hq, Sq]`` (``[Hq, total_q]`` for varlen).
        cu_seqlens_q, cu_seqlens_k: int32 offsets ``[batch + 1]`` of packed sequences (varlen) on q's device:
            they start at 0, never decrease and end at the packed rows of q and k.
        max_seqlen_q, max_seqlen_k: the longest sequence of each: None (computed), or an int at least that.
        block_table: paged KV cache: ``[B, blocks]`` int32 page indices; k and v are then the page pools
            ``[num_blocks, page_size, Hkv, D]`` (``Dv`` for v) in any layout, and ``seqused_k [B]`` int32 says
            how many keys of each sequence are filled (all pages when None).
        layout: ``"bhsd"`` or ``"bshd"`` for 4-D inputs; the output uses the same layout.
        backend: force a backend id (``"flash-attn"``, ``"sdpa"``, ``"exact"`` ...); see :func:`use_backend`.
        precision: ``"exact"``, or ``"allow_quantized"`` to admit SageAttention's int8/fp8 kernels.

    Returns:
        The output ``[B, Hq, Sq, Dv]`` (in the input layout) in q's dtype, or ``(out, lse)`` with
        ``return_lse``; differentiable. Zero-sized inputs return the right empty (or zero) result without
        running a kernel. Under ``torch.compile`` a plain call is one custom op (``attnforge::attention``).
        Under ``torch.autocast``, q, k and v in float32, float16 or bfloat16 are first cast to the autocast dtype
        of their device, as SDPA's autocast rule does (float64 is left alone): a model whose RoPE left q and k in
        float32 beside a bfloat16 v is served in bfloat16, not refused for mixed dtypes. A compiled call follows
        the same rule (the cast is traced ahead of the op, and Dynamo guards the graph on the autocast state).

    Raises:
        DispatchError: bad shapes, dtypes, devices, layout, precision or feature arguments (nested tensors,
            numpy arrays and packed inputs without ``cu_seqlens`` included), each with a hint; an unknown forced
            backend; a forced backend that cannot serve the call (with its reasons). Every argument is checked
            before a backend runs (:mod:`attnforge.dispatch.inputs`), except a sparse tensor's layout, refused
            once a backend raised on it (it has a dense tensor's shape, dtype and device, and checking every call's
            layout would cost the hot path); a backend that raises on an accepted call
            is skipped for that call's signature (docs/features.md, "When a backend raises").
    """
    # ~0.1 µs when off. Traced as well: Dynamo folds the autocast state to constants and guards the graph on it, so
    # the casts land in the graph ahead of the op (a custom op gets no autocast of its own; skipped while tracing, a
    # compiled call computed in float32 and refused RoPE's float32 q, k beside a bfloat16 v)
    if torch._C._is_any_autocast_enabled():
        q, k, v = _autocast_inputs(q, k, v)
    if window is not None and _checked(check_window, window) == (None, None):
        window = None  # FlashAttention's default window_size=(-1, -1): unbounded on both sides, it hides nothing
    if softcap is not None and _checked(check_softcap, softcap) is None:
        softcap = None  # FlashAttention's default softcap=0.0: off
    if is_causal is not None and causal is False:  # SDPA's spelling (a drop-in for F.scaled_dot_product_attention)
        if is_causal is False:
            is_causal = None  # it asks for nothing
        elif is_causal is True and _same_size(q, k, layout, 2, cu_seqlens_q, cu_seqlens_k, block_table):
            # top-left causal with Sq == Sk is bottom-right causal (and so is a window's alignment): the plain path
            is_causal, causal, causal_alignment = None, True, "bottom_right"
    if causal_alignment == "top_left" and is_causal is None and ((causal is False and window is None) or _same_size(
            q, k, layout, 2, cu_seqlens_q, cu_seqlens_k, block_table)):
        # it aligns nothing here: no causal or window (SDPA-style callers pass it on every call), or Sq == Sk
        causal_alignment = "bottom_right"
    if enable_gqa is False and _same_size(q, k, layout, 1, block_table):
        enable_gqa = True  # it refuses nothing here (SDPA's default, passed on by diffusers and patch_sdpa)
    if not (attn_mask is window is softcap is sinks is cu_seqlens_q is cu_seqlens_k is is_causal is block_table  # type: ignore[comparison-overlap]
            is seqused_k is None
            # a float: False == 0.0, and a tensor's == is a tensor; anything else is checked on the feature path
            and isinstance(dropout_p, float) and dropout_p == 0.0 and return_lse is False and enable_gqa is True
            and isinstance(causal, bool) and causal_alignment == "bottom_right"):
        if (torch.compiler.is_compiling()  # first: an eager call asks nothing else here
                and block_table is seqused_k is None
                # isinstance, no generator: torch 2.11's Dynamo read ``causal.__class__ is bool`` and ``all(... for
                # ...)`` here as False and traced the feature path inline (H200, 2026-12-01: a masked and a varlen
                # call under reduce-overhead failed on torch.cuda.get_device_name and on reading the offsets)
                and isinstance(dropout_p, float) and dropout_p == 0.0 and return_lse is False and enable_gqa is True
                and isinstance(causal, bool)
                and (attn_mask is None or (isinstance(attn_mask, torch.Tensor) and not attn_mask.requires_grad))
                and (sinks is None or isinstance(sinks, torch.Tensor))
                and (cu_seqlens_q is None or isinstance(cu_seqlens_q, torch.Tensor))
                and (cu_seqlens_k is None or isinstance(cu_seqlens_k, torch.Tensor))
                and (max_seqlen_q is None or (isinstance(max_seqlen_q, int) and not isinstance(max_seqlen_q, bool)))
                and (max_seqlen_k is None or (isinstance(max_seqlen_k, int) and not isinstance(max_seqlen_k, bool)))):
            # one opaque op, the feature path run eagerly inside it at run time, decided or not: traced, that path
            # decides under the records' lock ("Unsupported context manager" on a class nobody decided) and reads
            # the device's name on a CUDA tensor (torch.cuda.get_device_name: "torch.* op returned non-Tensor",
            # H200, torch 2.11, 2026-12-01, even for a class decided by an eager call). Its cost: Python per call at
            # run time (a masked decode call compiled: 48 against 26 us traced on a 2-core CPU host); none in a
            # CUDA graph's replay (mode="reduce-overhead")
            return _features_op(q, k, v, attn_mask=attn_mask, sinks=sinks, causal=causal,
                                causal_alignment=causal_alignment, is_causal=is_causal, window=window,
                                softcap=softcap, scale=scale, layout=layout, backend=backend, precision=precision,
                                varlen=(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))
        if torch.compiler.is_compiling() and enable_gqa is False and block_table is None:
            # Hq != Hkv here (as many heads turned it True above): eager's refusal, raised when the compiled code runs
            # (traced, the feature path's check was Dynamo's "Observed exception")
            try:
                qh, kh, _ = _validate(q, k, v, layout=layout, precision=precision, scale=scale)
                check_heads(qh.shape[1], kh.shape[1], enable_gqa=False)
            except DispatchError as exc:
                return _op.refused(q, v, exc)
        dispatcher = _DISPATCHER or get_dispatcher()
        # a mask and a scale (and a softcap: Gemma-2), nothing else (transformers' call of every layer): a repeat of
        # the previous call on the same mask object takes the lane its backend offered (features.lane_call), no
        # signature or plan lookup; never while torch.compile traces (Dynamo cannot trace a ContextVar's get:
        # fullgraph would fail). Either causal alignment: without causal or a window it changes nothing (patch_sdpa
        # passes top-left)
        lane = (attn_mask is not None and window is sinks is cu_seqlens_q is cu_seqlens_k is is_causal  # type: ignore[comparison-overlap]
                is block_table is seqused_k is None and isinstance(dropout_p, float) and dropout_p == 0.0
                and causal is False and return_lse is False and enable_gqa is True
                and causal_alignment in ("bottom_right", "top_left") and layout == "bhsd" and backend is None
                and precision == "exact" and not torch.compiler.is_compiling() and _FORCED.get() is None)
        if lane:
            served = features.lane_call(q, k, v, attn_mask, scale=scale, softcap=softcap, dispatcher=dispatcher)
            if served is not None:
                return served
        return features.attention(
            q, k, v, dispatcher=dispatcher, lane=lane, attn_mask=attn_mask, dropout_p=dropout_p,
            scale=scale, causal=causal, causal_alignment=causal_alignment, enable_gqa=enable_gqa, window=window,
            softcap=softcap,
            sinks=sinks, return_lse=return_lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, layout=layout,
            backend=backend if backend is not None or torch.compiler.is_compiling() else _FORCED.get(),
            precision=precision, is_causal=is_causal, block_table=block_table,
            seqused_k=seqused_k)
    if torch.compiler.is_compiling():
        try:
            qh, kh, vh = _validate(q, k, v, layout=layout, precision=precision, scale=scale)
        except DispatchError as exc:  # raised when the compiled code runs, as eager raises it (_op.refuse_op)
            return _op.refused(q, v, exc)
        needs_grad = records_grad(q, k, v)
        scale = None if scale is None else float(scale)  # a numpy scale passed validation; the op takes a float
        out: torch.Tensor = _op.attention_op(qh, kh, vh, causal, scale, backend, precision, needs_grad)
        # a bshd caller gets contiguous bshd, as in eager (flash-attn's convention; the op's output is bhsd)
        return out.transpose(1, 2).contiguous() if layout == "bshd" else out
    dispatcher = _DISPATCHER or get_dispatcher()
    forced = _FORCED.get() if backend is None else backend
    # the hot path: the exact signature of a call served before names its route (see the module docstring)
    try:
        # records_grad(q, k, v), inlined: this line runs on every call (~130 ns less than the call)
        needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        # scale's class too: True == 1.0 (and hashes alike), so scale=True would reuse a route bound to scale=1.0
        signature = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device,
                     causal, scale, scale.__class__, layout, precision, forced, needs_grad)
        route = dispatcher.routes.get(signature)
        key: tuple[Any, ...] | None = signature
    except (AttributeError, RuntimeError, TypeError):  # not tensors (a strided nested tensor has no shape), or
        # unhashable arguments: validation says why
        key = route = None
    if route is None:
        route = dispatcher.route(q, k, v, key, causal=causal, scale=scale, layout=layout, precision=precision,
                                 forced=forced)
    if key is not None and needs_grad and saving_tensors():  # a checkpointed forward or its recomputation
        route = dispatcher.pinned(key, route)
    return dispatcher.serve(route, q, k, v, forced)


def _autocast_inputs(q: Any, k: Any, v: Any) -> tuple[Any, Any, Any]:
    """q, k, v as SDPA's autocast rule gives them to its kernel: on a device where ``torch.autocast`` is on, each
    float32/float16/bfloat16 tensor cast to the autocast dtype (float64 and what is not a tensor left as they are:
    validation reports the latter). Traceable by Dynamo (``torch.is_autocast_enabled`` and ``torch.get_autocast_dtype``
    fold to constants that its global-state guard covers), so eager and compiled calls share this one rule."""
    import torch

    device = getattr(getattr(q, "device", None), "type", None)
    try:
        if device is None or not torch.is_autocast_enabled(device):
            return q, k, v
    except RuntimeError:  # a device type autocast does not know ("meta"): nothing is cast there, as SDPA does
        return q, k, v
    dtype = torch.get_autocast_dtype(device)
    lower = (torch.float32, torch.float16, torch.bfloat16)

    def cast(t: Any) -> Any:
        return t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype in lower and t.dtype != dtype else t

    return cast(q), cast(k), cast(v)


def _features_op(q: Any, k: Any, v: Any, *, attn_mask: Any, sinks: Any, causal: bool, causal_alignment: str,
                 is_causal: bool | None, window: Any, softcap: Any, scale: Any, layout: str, backend: str | None,
                 precision: str, varlen: tuple[Any, Any, int | None, int | None]) -> Any:
    """A call with a mask, a window, a softcap, sinks, top-left alignment or packed sequences while ``torch.compile``
    traces: q, k, v (dense ones), the window, the softcap and the scale checked in traced code, then one
    ``attnforge::attention_features`` op (``attnforge::attention_varlen`` for packed sequences, kept out of CUDA
    graphs; :mod:`attnforge.dispatch._op`), whose real implementation serves the call
    through :func:`attnforge.dispatch.features.attention` at run time (the mask and packed sequences' offsets are
    checked there). A bad argument raises its :class:`DispatchError` when the compiled code runs, as in eager mode
    (``attnforge::refuse``). ``varlen``: ``cu_seqlens_q``, ``cu_seqlens_k``, ``max_seqlen_q``, ``max_seqlen_k``."""
    packed = varlen[0] is not None or varlen[1] is not None
    try:
        if packed:  # [total, H, D]: no layout to swap; the offsets are checked at run time, on the host
            qh, kh, vh = q, k, v
            scale = check_scale(scale)
        else:
            qh, kh, vh = _validate(q, k, v, layout=layout, precision=precision, scale=scale)
        sides = None
        if window is not None:
            left, right = check_window(window)
            # -1 unbounded; a side past any sequence (10**30 is accepted) hides nothing either; an op takes int64
            sides = [-1 if side is None or side >= 1 << 62 else side for side in (left, right)]
        checked_softcap = check_softcap(softcap)
        check_softcap_scale(checked_softcap, None if scale is None else float(scale))
    except DispatchError as exc:  # raised when the compiled code runs, as eager raises it (_op.refuse_op)
        return _op.refused(q, v, exc)
    op = _op.attention_varlen_op if packed else _op.attention_features_op
    out = op(qh, kh, vh, attn_mask, sinks, causal, causal_alignment, is_causal, sides, checked_softcap,
             None if scale is None else float(scale), backend, precision, *varlen)
    return out.transpose(1, 2).contiguous() if layout == "bshd" and not packed else out


#: what :func:`_checked` gives for a refused value: equal to no checked one, and a constant torch.compile's Dynamo can
#: compare (an ``object()`` sentinel compared with ``==`` was "Missing richcompare_impl override" under fullgraph)
_REFUSED = ("refused",)


def _checked(check: Callable[[Any], Any], value: Any) -> Any:
    """``check(value)`` (a rule of :mod:`attnforge.dispatch.inputs`: :func:`check_window` gives ``(None, None)`` for
    a window that hides nothing, :func:`check_softcap` None for a softcap that is off), or :data:`_REFUSED` where the
    value is refused: validation on the feature path then says why, as it would have."""
    try:
        return check(value)
    except DispatchError:
        return _REFUSED


def _same_size(q: Any, k: Any, layout: str, dim: int, *packed: Any) -> bool:
    """Whether 4-D ``q`` and ``k`` are as long in ``dim`` of ``[B, H, S, D]`` (1: heads, 2: positions; dims 1 and 2
    swap with ``layout="bshd"``): as many heads, ``enable_gqa=False`` refuses nothing; as many positions (Sq == Sk),
    top-left and bottom-right alignment agree and ``is_causal=True`` is ``causal=True``. Either way the call may take
    the plain path (a call with any argument off its default goes through
    :func:`attnforge.dispatch.features.attention`). False for a packed (varlen) or paged call (``packed``: its
    ``cu_seqlens_q``, ``cu_seqlens_k``, ``block_table``, any not None), whose k holds other dimensions there (a page
    pool ``[blocks, page_size, Hkv, D]``), and for anything else (validation says what is wrong)."""
    for t in packed:  # a loop, not any() over a generator: traced under torch.compile (see attention()'s op test)
        if t is not None:
            return False
    try:
        axis = 3 - dim if layout == "bshd" else dim
        return bool(q.dim() == 4 and k.dim() == 4 and q.shape[axis] == k.shape[axis])
    except (AttributeError, IndexError, RuntimeError, TypeError):  # RuntimeError: a strided nested tensor's shape
        return False


def explain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
            layout: str = "bhsd", backend: str | None = None, precision: str = "exact",
            **kwargs: Any) -> Explanation:
    """Which backend :func:`attention` would use for these inputs, and why every other one is skipped.

    Takes the same arguments as :func:`attention` (features included); runs no kernel.

    Raises:
        DispatchError: bad inputs or an unknown forced backend (a forced backend that cannot serve the call is
            reported in the explanation instead).
    """
    if torch._C._is_any_autocast_enabled():  # as attention() sees them (its docstring)
        q, k, v = _autocast_inputs(q, k, v)
    call = features.prepare(q, k, v, scale=scale, layout=layout, precision=precision, **kwargs)
    qp, kp = call.probe
    return get_dispatcher().explain(qp, kp, causal=call.causal, precision=precision, needs_grad=call.needs_grad,
                                    backend=backend, uses=call.uses, head_dim_v=call.head_dim_v,
                                    scale=call.scale, opts=call.opts, empty=call.empty)
