"""PyTorch SDPA adapters: one per forced kernel (flash, memory-efficient, cuDNN, math) and the default.

Forcing uses ``torch.nn.attention.sdpa_kernel([backend])`` (source: runtime-anchors.md §3.1), which enables
only that kernel for the call and restores the previous flags on exit; if the kernel cannot serve the inputs
SDPA raises instead of silently running another kernel, so a forced adapter never returns another kernel's
result.

Causal alignment: SDPA's ``is_causal`` is top-left. It is used only when Sq == Sk, where top-left and
bottom-right agree; otherwise the adapter passes an explicit bottom-right boolean ``attn_mask`` (capability
``causal = "mask"``) and zeroes the rows that see no key, as the float64 reference and FlashAttention do.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnforge.backends._base import (
    AdapterBase,
    bottom_right_mask,
    expand_kv,
    four_dims,
    graph_capturing,
    kept_outside_capture,
    records_grad,
)
from attnforge.backends.capabilities import GqaMode
from attnforge.backends.exact import hides_keys, visible_keys
from attnforge.backends.sdpa_original import kernels_restricted, original_sdpa

if TYPE_CHECKING:
    import torch

    from attnforge.backends.adapter import AttentionCall

#: catalog id -> name of the ``torch.nn.attention.SDPBackend`` member it forces (None: SDPA chooses)
SDPA_KERNELS: dict[str, str | None] = {
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
    "sdpa-cudnn": "CUDNN_ATTENTION",
    "sdpa-math": "MATH",
    "sdpa": None,
}


@functools.cache
def _safe_softmax_on_cpu() -> bool:
    """SDPA on CPU returns zeros (with finite gradients) for rows whose mask hides every key since torch 2.5
    (the math backend's safe softmax); tests/dispatch/test_features.py checks it with such masks. Elsewhere
    the adapter opens those rows and zeroes them itself."""
    import torch

    from attnforge.types.versions import loose_version

    return loose_version(torch.__version__).release[:2] >= (2, 5)


class _OpenedMasks:
    """The last few caller masks the adapter prepared for SDPA (:data:`KEPT` of them, the newest first): the mask
    as SDPA gets it (additive, in q's dtype, the rows that see no key opened) and those rows
    (``[B or 1, H or 1, Sq, 1]`` bool). A model passes one mask object to every layer (transformers builds it once
    per forward; Gemma-2 two, a sliding and a full one, alternating by layer), so the pass over all
    ``B x Sq x Sk`` entries runs once per mask and forward, not once per layer. An entry is found only for the same
    mask object (a weak reference: a new mask never matches a dead one's entry, and the entry is dropped with
    the caller's mask), at the same version counter (an in-place change misses) and with the same preparation
    parameters; masks that require grad are never kept."""

    __slots__ = ("_entries",)

    #: masks kept at once (transformers' models use one or two per forward)
    KEPT = 4

    def __init__(self) -> None:
        self._entries: list[tuple[Any, ...]] = []

    def get(self, mask: torch.Tensor, params: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor] | None:
        for entry in self._entries:
            if entry[0]() is mask and entry[1] == mask._version and entry[2] == params:
                return entry[3]  # type: ignore[no-any-return]
        return None

    def put(self, mask: torch.Tensor, params: tuple[Any, ...], value: tuple[torch.Tensor, torch.Tensor]) -> None:
        ref = weakref.ref(mask, self._drop)
        self._entries = [(ref, mask._version, params, value), *self._entries[: self.KEPT - 1]]

    def _drop(self, ref: weakref.ref[Any]) -> None:
        """The caller's mask is gone: free what was derived from it."""
        self._entries = [e for e in self._entries if e[0] is not ref]


_OPENED = _OpenedMasks()


@dataclass(slots=True, kw_only=True)
class SdpaAdapter(AdapterBase):
    """``torch.nn.functional.scaled_dot_product_attention``, optionally forced to one kernel.

    Attributes:
        kernel: the ``SDPBackend`` member name to force, or None to let SDPA choose (the fallback).
    """

    kernel: str | None = None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None, **features: Any) -> torch.Tensor:
        """SDPA on ``[B, Hq, Sq, D]`` / ``[B, Hkv, Sk, D]``; returns ``[B, Hq, Sq, D]``.

        ``features``: ``attn_mask``, ``dropout_p``, ``window``, ``causal_alignment`` (its capabilities'
        ``features``); causal, window and mask are folded into one SDPA ``attn_mask`` when needed.
        """
        sdpa: Callable[..., torch.Tensor] = original_sdpa()
        if features:
            return self._with_features(sdpa, q, k, v, causal=causal, scale=scale, **features)
        if q.shape[1] == k.shape[1] and not causal:  # the common case, kept short: it runs on every call
            if self.kernel is None:
                if q.shape[2] <= DECODE_ROWS and q.device.type == "cuda":  # a decode step: see _run
                    return self._run(sdpa, q, k, v, {"scale": scale})
                return sdpa(q, k, v, scale=scale)
            with _force(self.kernel):
                return sdpa(q, k, v, scale=scale)
        kwargs: dict[str, Any] = {}
        if q.shape[1] != k.shape[1]:
            if self.caps.gqa is GqaMode.NATIVE:
                kwargs["enable_gqa"] = True
            else:
                k, v = expand_kv(k, v, q.shape[1])
        seen = None
        if causal:
            if q.shape[2] == k.shape[2]:
                kwargs["is_causal"] = True
            elif hides_keys(q.shape[2], k.shape[2], causal=True, top_left=False, window=None):
                kwargs["attn_mask"], seen = _bottom_right_additive(q.shape[2], k.shape[2], q.dtype, q.device)
            # else one query row at the end of the keys (a decode step): bottom-right causal hides nothing
        return self._run(sdpa, q, k, v, dict(kwargs, scale=scale), seen=seen)


    def serving_notes(self, call: AttentionCall) -> tuple[str, ...]:
        """A decode step on CUDA that SDPA chooses the kernel for: how :meth:`_run` serves it."""
        if self.kernel is not None or call.device_type != "cuda" or call.seqlen_q > DECODE_ROWS:
            return ()
        if call.causal and call.seqlen_q == call.seqlen_k:
            return ()  # SDPA's own top-left causal: SDPA chooses
        return (f"a decode step (Sq <= {DECODE_ROWS}): SDPA's memory-efficient kernel serves each shape until it "
                f"has been met {_MetShapes.SETTLED} times, then SDPA's own choice (cuDNN builds a graph for every "
                "new sequence length, ~40-50 ms on an H200)",)

    def bind(self, call: AttentionCall, *, scale: float | None, bshd: bool) -> Callable[..., torch.Tensor] | None:
        """The plain call as SDPA itself, for a route (:func:`attnforge.backends.bound.bound_call`): a
        ``functools.partial`` of the unpatched SDPA taking ``(q, k, v)`` ``[B, H, S, D]``, so nothing of the
        adapter runs per call. Only unforced SDPA on bhsd tensors whose causal mask SDPA's ``is_causal`` gives
        (Sq == Sk) and whose heads need no repeat; None otherwise (``__call__`` serves)."""
        if self.kernel is not None or bshd or (call.causal and call.seqlen_q != call.seqlen_k):
            return None
        if call.seqlen_q <= DECODE_ROWS and call.device_type == "cuda":
            return None  # a decode step: __call__'s decode path, not SDPA's per-length cuDNN graph
        kwargs: dict[str, Any] = {"scale": scale}
        if call.causal:
            kwargs["is_causal"] = True
        if call.heads_q != call.heads_kv:
            if self.caps.gqa is not GqaMode.NATIVE:
                return None
            kwargs["enable_gqa"] = True
        return functools.partial(original_sdpa(), **kwargs)

    def _with_features(self, sdpa: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                       v: torch.Tensor, *, causal: bool, scale: float | None, attn_mask: Any = None,
                       dropout_p: float = 0.0, window: Any = None,
                       causal_alignment: str = "bottom_right") -> torch.Tensor:
        import torch

        kwargs: dict[str, Any] = {"dropout_p": dropout_p, "scale": scale}
        if q.shape[1] != k.shape[1]:
            if self.caps.gqa is GqaMode.NATIVE:
                kwargs["enable_gqa"] = True
            else:
                k, v = expand_kv(k, v, q.shape[1])
        sq, sk = q.shape[2], k.shape[2]
        top_left = causal_alignment == "top_left" or sq == sk
        seen = None
        if attn_mask is None and window is None and causal and top_left:
            kwargs["is_causal"] = True  # SDPA's own top-left causal
        else:
            params = (sq, sk, causal, top_left, window, q.dtype, q.device)
            keep = (attn_mask is not None and not attn_mask.requires_grad and not torch.compiler.is_compiling()
                    and not (q.device.type == "cpu" and _safe_softmax_on_cpu()))
            opened = _OPENED.get(attn_mask, params) if keep else None
            if opened is None:
                mask, seen = self._sdpa_mask(attn_mask, q, sq=sq, sk=sk, causal=causal, top_left=top_left,
                                              window=window)
                # never kept from inside CUDA graph capture: the captured kernels have not run, so the tensors
                # would hold garbage for an eager call of the same mask object until the graph is replayed
                if keep and seen is not None and not (mask.device.type == "cuda" and graph_capturing()):
                    _OPENED.put(attn_mask, params, (mask, seen))
            else:
                mask, seen = opened
            kwargs["attn_mask"] = mask
        return self._run(sdpa, q, k, v, kwargs, seen=seen)

    def _run(self, sdpa: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             kwargs: dict[str, Any], *, seen: torch.Tensor | None = None) -> torch.Tensor:
        """SDPA on the prepared keywords: under the forced kernel, or for a decode shape not yet settled (masked,
        or without a causal mask to apply) without cuDNN (:func:`_decode_without_cudnn`), else as SDPA chooses.
        ``seen`` (bool, broadcastable to ``[B, Hq, Sq, 1]``): the rows that see some key; the others, opened in the
        mask, become zeros."""
        if self.kernel is not None:
            with _force(self.kernel):
                out = sdpa(q, k, v, **kwargs)
        elif (q.shape[2] <= DECODE_ROWS and q.device.type == "cuda" and not kwargs.get("is_causal")
                and _cudnn_free_decode() and _MET.unsettled(q, k, v, kwargs.get("attn_mask"))):
            return _decode_without_cudnn(sdpa, q, k, v, kwargs, seen=seen)
        else:
            out = sdpa(q, k, v, **kwargs)
        return _zero_unseen(out, seen)

    @staticmethod
    def _sdpa_mask(attn_mask: Any, q: torch.Tensor, *, sq: int, sk: int, causal: bool, top_left: bool,
                   window: Any) -> tuple[Any, Any]:
        """The one ``attn_mask`` SDPA gets for the caller's mask, causal alignment and window, and which rows see
        some key (bool ``[..., Sq, 1]``: the output is multiplied by it; None where SDPA itself returns zeros for
        rows that see none: CPU since torch 2.5)."""
        import torch

        visible = visible_keys(sq, sk, causal=causal, top_left=top_left, window=window, device=q.device)
        mask = attn_mask
        if mask is not None and mask.dtype not in (torch.bool, q.dtype):
            mask = mask.to(q.dtype)  # SDPA takes additive masks in q's dtype only
        if visible is not None:
            if mask is None or mask.dtype == torch.bool:
                mask = visible if mask is None else mask & visible
            else:
                mask = mask.masked_fill(~visible, float("-inf"))
        seen = None
        if mask is not None and not (q.device.type == "cpu" and _safe_softmax_on_cpu()):
            # rows that see no key are opened to every key (no NaN in softmax or its gradient) and zeroed
            seen = (mask if mask.dtype == torch.bool else mask > float("-inf")).any(dim=-1, keepdim=True)
            if mask.dtype == torch.bool:
                # additive, as SDPA turns a bool mask on every call (a where and two fills, torch 2.11), here once
                # per mask object: -inf where a row that sees some key hides a key (mask < seen), else 0
                hidden = mask < seen
                if mask.device.type == "cuda" and not torch.compiler.is_compiling() and not graph_capturing():
                    # one kernel, into rows whose stride is a multiple of 8 elements: the memory-efficient kernel
                    # takes the mask as it is (SDPA pads an unaligned one on every call, _efficient_bias too)
                    n = hidden.shape[-1]
                    out = torch.empty((*hidden.shape[:-1], n + (-n) % _BIAS_ALIGNMENT), dtype=q.dtype,
                                      device=mask.device)[..., :n]
                    mask = torch.where(hidden, *_additive_values(q.dtype, mask.device), out=out)
                else:  # the values' tensors are made outside capture and tracing only
                    mask = torch.zeros(mask.shape, dtype=q.dtype, device=mask.device).masked_fill_(hidden,
                                                                                                  float("-inf"))
            else:
                mask = torch.where(seen, mask, 0.0)
        return mask, seen


#: the query rows (Sq) up to which a call is served as a decode step (:func:`_decode_without_cudnn`)
DECODE_ROWS = 16


class _MetShapes:
    """How often the adapter has met each decode call's shapes (and strides), for the newest :data:`KEPT` shapes: a
    shape met fewer than :data:`SETTLED` times is served without cuDNN (:func:`_decode_without_cudnn`: no graph to
    build, 0.25-0.32 ms at a new length instead of 40-55 ms on an H200, 2026-11-28); after that SDPA chooses, and
    cuDNN builds its graph once and reuses it (at a repeated length on that H200: 48.6 µs a call through SDPA on its
    cached graph, 121 µs through attention() without it).
    A model meets a step's shape once per layer (26-42 layers in the published decoders), so a decode loop whose
    cache grows never settles a length and never waits for a graph; a fixed-size cache settles after a few steps,
    and a length that recurs across requests after a few requests, each paying one build."""

    __slots__ = ("_seen",)

    #: shapes remembered at once (a forgotten one is served without cuDNN again: slower, never wrong)
    KEPT = 4096
    #: meetings after which a shape goes to SDPA's own choice: more than any model's layers in one step
    SETTLED = 256

    def __init__(self) -> None:
        from collections import OrderedDict

        self._seen: OrderedDict[tuple[Any, ...], int] = OrderedDict()

    def unsettled(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> bool:
        """Counts a meeting of this call's shapes, strides, dtypes and device (``mask`` None: no mask); True while
        they have been met fewer than :data:`SETTLED` times."""
        key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, q.device,
               None if mask is None else (mask.shape, mask.stride(), mask.dtype))
        # no lock: a count lost to another thread's call, or a key it evicts, only delays settling
        met = self._seen.pop(key, 0) + 1
        self._seen[key] = met
        while len(self._seen) > self.KEPT:
            try:
                self._seen.popitem(last=False)
            except KeyError:
                break
        return met <= self.SETTLED


_MET = _MetShapes()


def _cudnn_free_decode() -> bool:
    """Whether a decode call may leave cuDNN out: SDPA's kernel choice is the caller's (no
    ``sdpa_kernel`` context restricting it) and nothing traces the call (``torch.compile`` fixes its kernel when it
    compiles)."""
    import torch

    return not kernels_restricted() and not torch.compiler.is_compiling()


def _decode_without_cudnn(sdpa: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          kwargs: dict[str, Any], *, seen: torch.Tensor | None = None) -> torch.Tensor:
    """A call of a few query rows (a decode step; ``q [B, Hq, Sq, D]``, ``Sq <=`` :data:`DECODE_ROWS`), masked or
    with no causal mask to apply, on SDPA's memory-efficient kernel, not cuDNN's; returns ``[B, Hq, Sq, Dv]``.

    SDPA picks cuDNN's attention for such a call on an H100/H200 (torch 2.11), and cuDNN builds a graph for every
    new sequence length: the first call at each new ``Sk`` took 42-67 ms masked, 36-39 ms unmasked, on an H200
    (2026-11-28,
    ``scripts/gpu/decode_probe.py``, docs/benchmarks.md; cuDNN SDPA graphs are rebuilt when the sequence length
    changes, ml-explore/mlx#2743), which a decode loop meets at every step of every new request. SDPA's
    memory-efficient kernel takes the same additive mask and compiles nothing per shape, but has no GQA: the
    ``Hq / Hkv`` query heads of one K/V head are folded into its rows (``[B, Hkv, g * Sq, D]``, K/V read as they
    are) and a mask's rows repeated to match (a copy only when ``Sq > 1`` and the mask has rows). Measured
    there: the first call at a new length 0.25-0.32 ms through ``attention()`` (SDPA: 38-55 ms); at a repeated
    length it is slower than cuDNN's cached graph (attention() 121 µs a call, SDPA 48.6 µs), so only shapes not
    yet met often (:class:`_MetShapes`) come here.

    ``seen`` (bool, broadcastable to ``[B, Hq, Sq, 1]``), the rows that see some key, zeroes the others: with the
    query folded, in the one kernel that copies the output back to ``[B, Hq, Sq, Dv]`` (a multiply into it)."""
    import torch

    b, hq, sq, d = q.shape
    hkv = k.shape[1]
    mask = kwargs.get("attn_mask")
    if hq == hkv:
        return _zero_unseen(_memory_efficient(sdpa, q, k, v, kwargs), seen)
    g = hq // hkv
    kwargs = {key: val for key, val in kwargs.items() if key != "enable_gqa"}
    if mask is not None:
        kwargs["attn_mask"] = _fold_mask_rows(mask, hq=hq, hkv=hkv, sq=sq)
    out = _memory_efficient(sdpa, q.reshape(b, hkv, g * sq, d), k, v, kwargs)
    dv = out.shape[-1]
    if seen is None:
        return out.reshape(b, hq, sq, dv)
    out5 = out.reshape(b, hkv, g, sq, dv)  # a view of the kernel's output
    s = four_dims(seen)
    s5 = s.reshape(s.shape[0], *((hkv, g) if s.shape[1] == hq else (1, 1)), s.shape[2], 1)
    if out.requires_grad:
        return (out5 * s5).reshape(b, hq, sq, dv)
    zeroed = torch.empty((b, hkv, g, sq, dv), dtype=out.dtype, device=out.device)
    return torch.mul(out5, s5, out=zeroed).view(b, hq, sq, dv)


def _zero_unseen(out: torch.Tensor, seen: torch.Tensor | None) -> torch.Tensor:
    """``out`` (``[B, H, Sq, Dv]``) with the rows that see no key (``seen`` False, broadcastable to
    ``[B, H, Sq, 1]``; None: every row sees one) zeroed: in place when nothing records ``out`` for backward (one
    kernel instead of a copy and a multiply)."""
    if seen is None:
        return out
    return out.mul(seen) if out.requires_grad else out.mul_(seen)


def _memory_efficient(sdpa: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      kwargs: dict[str, Any]) -> torch.Tensor:
    """SDPA's memory-efficient kernel on equal heads and an additive mask in q's dtype (``[B, H, Sq, D]`` in and
    out), called as SDPA calls it once chosen (``aten::_scaled_dot_product_efficient_attention``, the mask
    prepared by :func:`_efficient_bias`), so no global ``torch.backends`` flag is switched, which another thread's
    SDPA call would see. Anything else goes to ``sdpa`` (SDPA's own choice: right, if slower). An input the kernel
    refuses goes there too, and so does every later call of its kind (:data:`_REFUSED`, logged once): a refusal is
    a C++ exception, ~350 µs a call on an H200 (2026-11-28: Llama-3-8B's decode 0.84x its default while every
    call raised)."""
    import torch

    mask = kwargs.get("attn_mask")
    if (q.device.type in _EFFICIENT_DEVICES and (mask is None or mask.dtype == q.dtype)
            and _EFFICIENT_KW.issuperset(kwargs)):
        kind = (q.dtype, q.shape[-1], v.shape[-1], mask is None, q.stride(-2) % 8, k.stride(-2) % 8,
                v.stride(-2) % 8)
        if kind not in _REFUSED:
            grad = records_grad(q, k, v, mask)
            try:
                return torch.ops.aten._scaled_dot_product_efficient_attention(  # type: ignore[no-any-return]
                    q, k, v, None if mask is None else _efficient_bias(mask, q, k), grad,
                    kwargs.get("dropout_p", 0.0), False, scale=kwargs.get("scale"))[0]
            except RuntimeError as exc:
                _REFUSED[kind] = str(exc).splitlines()[0][:300]
                import logging

                logging.getLogger("attnforge").warning(
                    "SDPA's memory-efficient kernel refused a decode call (q %s %s, k %s %s, mask %s): %s; calls "
                    "of this kind go to SDPA's own choice from now on", tuple(q.shape), q.stride(), tuple(k.shape),
                    k.stride(), None if mask is None else (tuple(mask.shape), mask.stride()), _REFUSED[kind])
    return sdpa(q, k, v, **kwargs)


#: the devices whose memory-efficient kernel :func:`_memory_efficient` calls itself (the op is CUDA's; a test's fake
#: kernel is the seam that adds the CPU)
_EFFICIENT_DEVICES = frozenset({"cuda"})
#: the SDPA keywords :func:`_memory_efficient` hands the kernel itself
_EFFICIENT_KW = frozenset({"attn_mask", "dropout_p", "scale"})
#: the memory-efficient kernel's refusals in this process: the kind of call (dtype, head dims, masked or not, the
#: alignment of the rows of q, k, v) -> the kernel's message; :func:`_memory_efficient` sends that kind to SDPA
_REFUSED: dict[tuple[Any, ...], str] = {}
#: the stride alignment, in elements, of every dimension of the mask but the last that SDPA gives the kernel
#: (``mem_eff_alignment``, aten/src/ATen/native/transformers/attention.cpp, torch 2.4-2.11)
_BIAS_ALIGNMENT = 8


def _efficient_bias(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The additive ``mask`` (broadcastable to ``[B, H, Sq, Sk]`` of ``q [B, H, Sq, D]`` and ``k [B, H, Sk, D]``) as
    the memory-efficient kernel takes it: exactly ``[B, H, Sq, Sk]`` (an expanded view) with the last dimension
    contiguous and every other stride a multiple of :data:`_BIAS_ALIGNMENT`, else the kernel raises ("attn_bias is
    not correctly aligned"). SDPA prepares it the same way before that kernel (``preprocess_mask``: pad the last
    dimension, slice it back, expand; attention.cpp), which the op itself does not; a mask whose dimensions longer
    than 1 are aligned already is not copied."""
    import torch.nn.functional as F  # noqa: N812

    m = four_dims(mask)
    # a dimension of size 1 is expanded (stride 0), so only the others' strides count, as in the kernel's check
    aligned = (m.stride(-1) == 1 and m.storage_offset() % _BIAS_ALIGNMENT == 0
               and all(st % _BIAS_ALIGNMENT == 0 for n, st in zip(m.shape[:-1], m.stride()[:-1], strict=True) if n > 1))
    if not aligned:
        n = m.shape[-1]
        m = F.pad(m, (0, _BIAS_ALIGNMENT - n % _BIAS_ALIGNMENT))[..., :n]
    return m.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def _fold_mask_rows(mask: torch.Tensor, *, hq: int, hkv: int, sq: int) -> torch.Tensor:
    """``mask`` (broadcastable to ``[B, Hq, Sq, Sk]``) for the folded query of :func:`_decode_without_cudnn`,
    broadcastable to ``[B, Hkv, g * Sq, Sk]``: row ``i * Sq + s`` of K/V head ``h`` is query head ``h * g + i``'s row
    ``s``."""
    g = hq // hkv
    m = four_dims(mask)
    mb, mh, mq, sk = m.shape
    if mh == 1 and mq == 1:
        return m  # the same row for every head and query: it broadcasts as it is
    m5 = m.reshape(mb, hkv, g, mq, sk) if mh == hq else m.reshape(mb, 1, 1, mq, sk)
    return m5.expand(mb, m5.shape[1], g, sq, sk).reshape(mb, m5.shape[1], g * sq, sk)


@kept_outside_capture(64)
def _bottom_right_additive(seqlen_q: int, seqlen_k: int, dtype: torch.dtype,
                           device: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`~attnforge.backends._base.bottom_right_mask` as SDPA takes it without converting it on every call:
    additive (0 / -inf) in ``dtype``, the rows that see no key opened; and which rows see some key (bool
    ``[Sq, 1]``, or None when all do). Kept per ``(Sq, Sk, dtype, device)`` outside CUDA graph capture
    (:func:`~attnforge.backends._base.kept_outside_capture`)."""
    import torch

    allowed, empty = bottom_right_mask(seqlen_q, seqlen_k, device)
    additive = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
    return additive, (None if empty is None else ~empty)


@functools.lru_cache(maxsize=16)
def _additive_values(dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``-inf`` and ``0`` as 0-dim tensors of ``dtype`` on ``device``: an additive mask in one ``torch.where``."""
    import torch

    return (torch.full((), float("-inf"), dtype=dtype, device=device),
            torch.zeros((), dtype=dtype, device=device))


def _force(kernel: str) -> Any:
    """``sdpa_kernel([SDPBackend.<kernel>])``: only that SDPA kernel may run inside the context."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, kernel)])
