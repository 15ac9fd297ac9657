"""PyTorch SDPA adapters: one per forced kernel (flash, memory-efficient, cuDNN, math) and the default.

Forcing uses ``torch.nn.attention.sdpa_kernel([backend])`` (source: runtime-anchors.md §3.1), which enables
only that kernel for the call and restores the previous flags on exit; if the kernel cannot serve the inputs
SDPA raises instead of silently running another kernel, so a forced adapter never returns another kernel's
result.

Causal alignment: SDPA's ``is_causal`` is top-left. It is used only when Sq == Sk, where top-left and
bottom-right agree; otherwise the adapter passes an explicit bottom-right boolean ``attn_mask`` (capability
``causal = "mask"``) and zeroes the rows that see no key, as the float64 reference and FlashAttention do (or
leaves them to SDPA's kernels where those return zeros for them: :func:`_unseen_rows_zeroed`).
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnforge.backends._base import (
    AdapterBase,
    KeptPerMask,
    bottom_right_mask,
    device_state,
    expand_kv,
    four_dims,
    graph_capturing,
    kept_outside_capture,
    made_for_autograd,
    narrowed,
    records_grad,
)
from attnforge.backends._padded_decode import varlen_decode
from attnforge.backends.bound import other_layout
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


def _additive_dtype(q: torch.Tensor) -> torch.dtype:
    """The dtype SDPA gets a caller's additive mask of another dtype in, beside ``q``: float32 on CPU where q is in
    half precision, else q's own. SDPA takes a float32 mask beside any q (``validate_sdpa_input``: "bool or float
    or ... query dtype"), and its CPU kernels (math, flash) add it to float32 logits, so the mask keeps its
    precision there, as in the exact math; cast to bfloat16, a float32 ALiBi-like bias of -500 + small offsets lost
    them (bfloat16's spacing at 500 is 4; the output was off by up to 1.1, 2026-12-02). CUDA's memory-efficient
    kernel takes q's dtype only ("invalid dtype for bias - should match query's dtype")."""
    import torch

    if q.device.type == "cpu" and q.dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return q.dtype


#: for a caller's mask, the mask as SDPA gets it (additive, in q's dtype, the rows that see no key opened) and those
#: rows (``[B or 1, H or 1, Sq, 1]`` bool): a model passes one mask object to every layer (transformers builds it
#: once per forward; Gemma-2 two, a sliding and a full one, alternating by layer), so the pass over all
#: ``B x Sq x Sk`` entries runs once per mask and forward, not once per layer
_OPENED: KeptPerMask[tuple[torch.Tensor, torch.Tensor]] = KeptPerMask()


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
                if q.shape[2] <= DECODE_ROWS and q.device.type in _EFFICIENT_DEVICES:  # a decode step: see _run
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
                "new sequence length, ~40-50 ms on an H200); where a memory-efficient thread block would walk "
                f"{_FLASH_FROM_KEYS}+ keys, FlashAttention-2's split-KV kernel serves it instead (a padded batch's "
                "step at every meeting: it never settles on cuDNN)",)

    def bind(self, call: AttentionCall, *, scale: float | None, bshd: bool) -> Callable[..., torch.Tensor] | None:
        """The plain call as SDPA itself, for a route (:func:`attnforge.backends.bound.bound_call`): a
        ``functools.partial`` of the unpatched SDPA taking ``(q, k, v)`` ``[B, H, S, D]``, so nothing of the
        adapter runs per call. Only unforced SDPA whose heads need no repeat, on calls without causal, with SDPA's own
        ``is_causal`` (Sq == Sk), with one query row (bottom-right causal hides no key), or a chunked prefill
        (``DECODE_ROWS < Sq < Sk``: :func:`_bottom_right_bound`); None otherwise (``__call__`` serves).
        ``bshd``: the caller's tensors are ``[B, S, H, D]``; the same call on their ``[B, H, S, D]`` views, the
        output viewed back (what the generic bshd route does around ``__call__``, without ``__call__``: a diffusers
        model's SDPA-chosen calls)."""
        if self.kernel is not None:
            return None
        sq, sk = call.seqlen_q, call.seqlen_k
        # bottom-right causal: Sq == Sk is SDPA's own is_causal; one query row at the end of the keys (a decode step
        # called FlashAttention's way, causal=True on every call) hides no key, so it is the call without causal, as
        # __call__ serves it; Sq < Sk (a chunked prefill) takes the kept bottom-right mask; Sq > Sk (rows that see no
        # key, zeroed) and a masked decode step (__call__'s decode path counts its mask) stay with __call__
        causal = call.causal and (sq == sk or hides_keys(sq, sk, causal=True, top_left=False, window=None))
        chunk = causal and sq != sk
        if chunk and (sq > sk or sq <= DECODE_ROWS):
            return None
        kwargs: dict[str, Any] = {"scale": scale}
        if causal and not chunk:
            kwargs["is_causal"] = True  # Sq == Sk here: SDPA's own top-left causal, which no decode path takes
        if call.heads_q != call.heads_kv:
            if self.caps.gqa is not GqaMode.NATIVE:
                return None
            kwargs["enable_gqa"] = True
        bound: Callable[..., torch.Tensor]
        if chunk:
            bound = _bottom_right_bound(sq, sk, kwargs)
        elif call.seqlen_q <= DECODE_ROWS and call.device_type in _EFFICIENT_DEVICES and not causal:
            bound = _DecodeBound(self, kwargs)  # a decode step: __call__'s decode path until its shape settles
        else:
            bound = functools.partial(original_sdpa(), **kwargs)
        return other_layout(bound, contiguous=True) if bshd else bound

    def settle_repeated(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> bool:
        """An unmasked decode call (``q [B, Hq, Sq, D]``, Sq <= :data:`DECODE_ROWS`, CUDA, SDPA choosing) whose
        shapes repeat is served as a settled shape at once (:meth:`_MetShapes.settle`): SDPA's own choice, cuDNN's
        graph built on the next call (36-39 ms on an H200) and reused after it (the grid's decode GQA cell, B8 Hq32
        Hkv8, 4096 keys, H200, torch 2.11, 2026-11-28: plain SDPA 62.9 µs a call, FlashAttention-2's split-KV op
        through SDPA 98.5). The decode path's unsettled kernels exist for lengths that do not repeat. A causal call
        of more than one query row is not settled here (its bottom-right mask is counted with the shape, or SDPA's
        own causal serves it)."""
        if (self.kernel is not None or q.shape[2] > DECODE_ROWS or q.device.type not in _EFFICIENT_DEVICES
                or (causal and q.shape[2] > 1) or not _cudnn_free_decode()):
            return False
        return _MET.settle(q, k, v, None)  # the unmasked key: the in-situ check settles plain calls only

    def decode_lane(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, *,
                    scale: float | None, softcap: float | None = None) -> DecodeLane | None:
        """The lean path of the masked decode call just served (``q [B, Hq, Sq, D]``, ``k/v [B, Hkv, Sk, D]``, the
        caller's ``mask``; not causal, no window, no dropout), kept for the calls that repeat it
        (:class:`DecodeLane`), or None where that call did not take the memory-efficient kernel on the batch fold
        (a forced kernel, more than :data:`DECODE_ROWS` query rows, another device, a long walk that
        FlashAttention-2 serves, K/V whose batch and head dimensions do not merge, no kept bias for the mask: the
        shape settled on cuDNN, capture, an inference tensor; a softcap, which SDPA never serves)."""
        # a call FlashAttention-2's varlen op served kept no bias for the mask: no lane for it (below)
        if (softcap or self.kernel is not None or q.shape[2] > DECODE_ROWS or q.device.type not in _EFFICIENT_DEVICES
                or not _batch_merges(k, v)):
            return None
        bias = _DECODE_BIASES.get(mask, _bias_params(q, k, batch_folded=True))
        if bias is None:
            return None
        b, hq, sq, _ = q.shape
        return DecodeLane(bias=weakref.ref(bias), scale=scale, shape=(b, hq, sq), cuda=q.device.type == "cuda")

    def _with_features(self, sdpa: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                       v: torch.Tensor, *, causal: bool, scale: float | None, attn_mask: Any = None,
                       dropout_p: float = 0.0, window: Any = None,
                       causal_alignment: str = "bottom_right") -> torch.Tensor:
        import torch

        sq, sk = q.shape[2], k.shape[2]
        top_left = causal_alignment == "top_left" or sq == sk
        met: bool | None = None  # the hook's count of this decode shape, if it counted it (see _run)
        capturing: bool | None = None  # asked once (a CUDA API call) where a mask is given: see below
        if (attn_mask is not None and sq <= DECODE_ROWS and not dropout_p and self.kernel is None
                and q.device.type in _EFFICIENT_DEVICES):
            # a decode step under the caller's mask alone: the lean paths take it as it is, no opening of its rows;
            # the checks run cheapest first (every layer of every decode step passes here)
            capturing = q.device.type == "cuda" and graph_capturing()
            if (not capturing and not records_grad(q, k, v, attn_mask) and _cudnn_free_decode()
                    and not hides_keys(sq, sk, causal=causal, top_left=top_left, window=window)):
                lean = _varlen_decode(q, k, v, attn_mask, scale=scale) if sq == 1 else None
                if lean is None:
                    met = _MET.unsettled(q, k, v, attn_mask)  # settled: SDPA's choice (cuDNN's graph, built once)
                    lean = _efficient_decode(q, k, v, attn_mask, seen=None, scale=scale) if met else None
                if lean is not None:
                    return lean
        if capturing is None:  # nothing is kept or found, and no lean path runs, under graph capture
            capturing = attn_mask is not None and q.device.type == "cuda" and graph_capturing()
        kwargs: dict[str, Any] = {"dropout_p": dropout_p, "scale": scale}
        if q.shape[1] != k.shape[1]:
            if self.caps.gqa is GqaMode.NATIVE:
                kwargs["enable_gqa"] = True
            else:
                k, v = expand_kv(k, v, q.shape[1])
        seen = None
        if attn_mask is None and window is None and causal and top_left:
            kwargs["is_causal"] = True  # SDPA's own top-left causal
        else:
            compiling = torch.compiler.is_compiling()
            mask_grad = attn_mask is not None and attn_mask.requires_grad
            # rows that see no key left to SDPA's kernels, which return zeros for them (and, where autograd records
            # the call, the right gradients: the probe asks each kernel)
            plain = (sq > DECODE_ROWS and q.device.type in _MASK_KERNELS and not capturing and not compiling
                     and not mask_grad  # the probe asks no mask's gradient
                     and _unseen_rows_zeroed(q, v, self.kernel, grad=records_grad(q, k, v, attn_mask)))
            params = (sq, sk, causal, top_left, window, q.dtype, q.device, plain)
            keep = (attn_mask is not None and not mask_grad and not compiling
                    and not (q.device.type == "cpu" and _safe_softmax_on_cpu()) and not capturing)
            opened = _OPENED.get(attn_mask, params) if keep else None
            if opened is None:
                mask, seen = self._sdpa_mask(attn_mask, q, sq=sq, sk=sk, causal=causal, top_left=top_left,
                                              window=window, plain=plain)
                # never kept nor found under CUDA graph capture (keep): the captured kernels have not run, so the
                # tensors would hold garbage for an eager call of the same mask object until the graph is replayed,
                # and a capture that found an eager entry would replay it after the caller changed the mask in place
                if keep and (seen is not None or mask is not attn_mask):
                    _OPENED.put(attn_mask, params, (mask, seen))
            else:
                mask, seen = opened
            kwargs["attn_mask"] = mask
        return self._run(sdpa, q, k, v, kwargs, seen=seen, unsettled=met)

    def _run(self, sdpa: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             kwargs: dict[str, Any], *, seen: torch.Tensor | None = None,
             unsettled: bool | None = None) -> torch.Tensor:
        """SDPA on the prepared keywords: under the forced kernel, or for a decode shape not yet settled (masked,
        or without a causal mask to apply) without cuDNN (:func:`_decode_without_cudnn`), else as SDPA chooses.
        ``seen`` (bool, broadcastable to ``[B, Hq, Sq, 1]``): the rows that see some key; the others, opened in the
        mask, become zeros. ``unsettled``: the caller's count of this decode shape (:data:`_MET`), made where it found
        the decode path open to the call (a decode step, not causal, :func:`_cudnn_free_decode`), so neither is
        asked twice; None: asked and counted here."""
        if self.kernel is not None:
            with _force(self.kernel):
                out = sdpa(q, k, v, **kwargs)
        elif unsettled or (unsettled is None and q.shape[2] <= DECODE_ROWS and q.device.type in _EFFICIENT_DEVICES
                           and not kwargs.get("is_causal") and _cudnn_free_decode()
                           and _MET.unsettled(q, k, v, kwargs.get("attn_mask"))):
            return _decode_without_cudnn(sdpa, q, k, v, kwargs, seen=seen)
        else:
            out = sdpa(q, k, v, **kwargs)
        return _zero_unseen(out, seen)

    @staticmethod
    def _sdpa_mask(attn_mask: Any, q: torch.Tensor, *, sq: int, sk: int, causal: bool, top_left: bool,
                   window: Any, plain: bool = False) -> tuple[Any, Any]:
        """The one ``attn_mask`` SDPA gets for the caller's mask, causal alignment and window, and which rows see
        some key (bool ``[..., Sq, 1]``: the output is multiplied by it; None where SDPA itself returns zeros for
        rows that see none: CPU since torch 2.5, and ``plain``: the call's kernels do, :func:`_unseen_rows_zeroed`;
        the mask is then additive with those rows -inf at every key, nothing opened)."""
        import torch

        visible = visible_keys(sq, sk, causal=causal, top_left=top_left, window=window, device=q.device)
        mask = attn_mask
        if mask is not None and mask.dtype not in (torch.bool, q.dtype):
            mask = narrowed(mask, _additive_dtype(q))
        if visible is not None:
            if mask is None or mask.dtype == torch.bool:
                mask = visible if mask is None else mask & visible
            else:
                mask = mask.masked_fill(~visible, float("-inf"))
        seen = None
        if mask is not None and plain:
            # additive, as SDPA turns a bool mask on every call, here once per mask object (torch 2.11's own turning
            # left cuDNN a row that sees no key not zeroed: scripts/gpu/mask_reuse.py, 2026-11-29)
            return (_aligned_additive(mask, q.dtype, hide=False) if mask.dtype == torch.bool else mask), None
        if mask is not None and not (q.device.type == "cpu" and _safe_softmax_on_cpu()):
            # rows that see no key are opened to every key (no NaN in softmax or its gradient) and zeroed
            seen = (mask if mask.dtype == torch.bool else mask > float("-inf")).any(dim=-1, keepdim=True)
            if mask.dtype == torch.bool:
                # additive, as SDPA turns a bool mask on every call (a where and two fills, torch 2.11), here once
                # per mask object: -inf where a row that sees some key hides a key (mask < seen), else 0
                hidden = mask < seen
                if mask.device.type == "cuda" and not torch.compiler.is_compiling() and not graph_capturing():
                    mask = _aligned_additive(hidden, q.dtype, hide=True)
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

    @staticmethod
    def _key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> tuple[Any, ...]:
        return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, q.device,
                None if mask is None else (mask.shape, mask.stride(), mask.dtype))

    def unsettled(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> bool:
        """Counts a meeting of this call's shapes, strides, dtypes and device (``mask`` None: no mask); True while
        they have been met fewer than :data:`SETTLED` times."""
        return self.count(q, k, v, mask) <= self.SETTLED

    def count(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> int:
        """Counts a meeting as :meth:`unsettled` does; returns the meetings so far, this one included."""
        key = self._key(q, k, v, mask)
        # no lock: a count lost to another thread's call, or a key it evicts, only delays settling
        met = self._seen.pop(key, 0) + 1
        self._seen[key] = met
        while len(self._seen) > self.KEPT:
            try:
                self._seen.popitem(last=False)
            except KeyError:
                break
        return met

    def settle(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> bool:
        """Counts these shapes as met :data:`SETTLED` times (the caller knows they repeat); True when they were
        not settled before."""
        key = self._key(q, k, v, mask)
        before = self._seen.pop(key, 0)
        self._seen[key] = max(before, self.SETTLED)
        return before < self.SETTLED


_MET = _MetShapes()


class _DecodeBound:
    """An unmasked decode route (``q [B, Hq, Sq, D]``, Sq <= :data:`DECODE_ROWS`, not causal, SDPA choosing) bound
    to the adapter: calls go through the adapter's decode path (:meth:`SdpaAdapter._run`, each meeting counted once)
    until their shape and strides settle (:class:`_MetShapes`), then straight to SDPA with the route's keywords (what
    the adapter's settled path calls), the strides kept so a settled call is not counted again. Shapes, dtypes and
    devices are the route's (its signature); other strides take the adapter's path. Takes and returns ``[B, H, S, D]``.

    Why: the grid's decode GQA cell (``q [8, 32, 1, 128]``, K/V ``[8, 8, 4096, 128]``, bf16) on an H200, torch
    2.11, 2026-11-28 (twelfth session, ``scripts/gpu/decode_probe.py gqa_decode_cell``, host µs a call with the
    device kept busy, best of 7 interleaved rounds): this route 41.5, the adapter bound as a partial 52.4, plain SDPA
    42.6; ``attention()`` 45.8, i.e. +3.2 µs over SDPA (+10.3 through the adapter in the tenth session)."""

    __slots__ = ("_adapter", "_kwargs", "_sdpa", "_settled")

    def __init__(self, adapter: SdpaAdapter, kwargs: dict[str, Any]) -> None:
        self._adapter = adapter
        self._kwargs = kwargs
        self._sdpa: Callable[..., torch.Tensor] = original_sdpa()
        self._settled: tuple[Any, ...] | None = None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        strides = (q.stride(), k.stride(), v.stride())
        if strides == self._settled:
            return self._sdpa(q, k, v, **self._kwargs)
        # what SdpaAdapter.__call__ does for the route's calls (no features, not causal, GQA native); of _run's
        # condition for the decode path only the process's state varies between them, asked here with the count
        unsettled = False
        if _cudnn_free_decode():
            met = _MET.count(q, k, v, None)
            unsettled = met <= _MetShapes.SETTLED
            if met >= _MetShapes.SETTLED:  # the next call of these strides is served as settled
                self._settled = strides
        return self._adapter._run(self._sdpa, q, k, v, self._kwargs, unsettled=unsettled)


def _cudnn_free_decode() -> bool:
    """Whether a decode call may leave cuDNN out: SDPA's kernel choice is the caller's (no
    ``sdpa_kernel`` context restricting it) and nothing traces the call (``torch.compile`` fixes its kernel when it
    compiles)."""
    import torch

    return not kernels_restricted() and not torch.compiler.is_compiling()


def _decode_without_cudnn(sdpa: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          kwargs: dict[str, Any], *, seen: torch.Tensor | None = None) -> torch.Tensor:
    """A call of a few query rows (a decode step; ``q [B, Hq, Sq, D]``, ``Sq <=`` :data:`DECODE_ROWS`), masked or
    with no causal mask to apply, on a kernel that builds nothing per length, not cuDNN's; returns
    ``[B, Hq, Sq, Dv]``.

    SDPA picks cuDNN's attention for such a call on an H100/H200 (torch 2.11), and cuDNN builds a graph for every
    new sequence length: the first call at each new ``Sk`` took 42-67 ms masked, 36-39 ms unmasked, on an H200
    (2026-11-28,
    ``scripts/gpu/decode_probe.py``, docs/benchmarks.md; cuDNN SDPA graphs are rebuilt when the sequence length
    changes, ml-explore/mlx#2743), which a decode loop meets at every step of every new request. SDPA's
    memory-efficient kernel takes the same additive mask and compiles nothing per shape, but has no GQA: the
    ``Hq / Hkv`` query heads of one K/V head are folded into its rows (``[B, Hkv, g * Sq, D]``, K/V read as they
    are) and a mask's rows repeated to match. Measured
    there: the first call at a new length 0.25-0.32 ms through ``attention()`` (SDPA: 38-55 ms); at a repeated
    length it is slower than cuDNN's cached graph (attention() 114-121 µs a call, SDPA 48.6-117 µs), so only shapes
    not yet met often (:class:`_MetShapes`) come here.

    With nothing recorded for backward (generation), a masked call takes :func:`_efficient_decode` (its bias
    prepared once per mask object) and an unmasked one whose keys are many :func:`_flash_decode`. Otherwise:
    ``seen`` (bool, broadcastable to ``[B, Hq, Sq, 1]``), the rows that see some key, zeroes the others: with the
    query folded, in the one kernel that copies the output back to ``[B, Hq, Sq, Dv]`` (a multiply into it)."""
    import torch

    mask = kwargs.get("attn_mask")
    if not records_grad(q, k, v, mask) and _DECODE_KW.issuperset(kwargs) and not kwargs.get("dropout_p"):
        lean = (_flash_decode(q, k, v, kwargs.get("scale")) if mask is None
                else _efficient_decode(q, k, v, mask, seen=seen, scale=kwargs.get("scale")))
        if lean is not None:
            return lean
    b, hq, sq, d = q.shape
    hkv = k.shape[1]
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


def _varlen_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, *,
                   scale: float | None) -> torch.Tensor | None:
    """A decode step (``q [B, Hq, 1, D]``, ``k/v [B, Hkv, Sk, D]``) under a padding mask, with nothing recorded for
    backward, no kernel restriction of the caller's and no CUDA graph capture (the adapter checked: the one host
    sync below would break a capture), on FlashAttention-2's split-KV kernel in its varlen form (SDPA's own copy,
    ``aten::_flash_attention_forward``): no graph per length, no copy of K/V, of the mask or of the output; returns
    ``[B, Hq, 1, D]`` (a view of the kernel's output), or None where it does not apply (the caller's path serves).

    ``mask`` (the caller's) must show each batch row one run of visible keys, as a left- or right-padded batch's
    decode mask does: :func:`attnforge.backends._padded_decode.varlen_decode` reads the runs once per mask object
    (one host sync per step; a model's layers share the mask) and gives the varlen sequences. A mask with a row that
    sees no key is left to the caller's path.

    Measured on an H200 (torch 2.11, 2026-11-28, ``decode_probe.py decode_kernels``, Llama-3-8B's padded step):
    15.5 µs of device time at 1025 keys (the memory-efficient kernel 47.6, cuDNN's cached graph 16.8) and 18 µs at
    4097 keys for one sequence (memory-efficient 163, it splits no keys). But reading the runs cost a host sync and
    some fifteen small kernels per mask object (then; read on the host since,
    :func:`attnforge.backends._padded_decode.padding_runs`): taken at 1025 keys, the 2-layer Llama-3-8B- and
    Qwen2.5-shaped decoders' decode fell from 0.92-0.96x to 0.84-0.85x their default (attention() 173 µs a call
    against 124 on the memory-efficient kernel). So only calls whose memory-efficient walk is long
    (:func:`_efficient_walk` from :data:`_FLASH_FROM_KEYS`, as :func:`_flash_decode`) come here, where a layer saves
    more device time than a step's read costs; no shape settles on cuDNN here (:class:`_MetShapes` is for the
    memory-efficient path)."""
    import torch

    if not _flash_serves(q, k, v):
        return None
    kind = ("varlen", q.dtype, q.shape[-1])
    if kind in _REFUSED:
        return None
    seqs = varlen_decode(q, k, v, mask)
    if seqs is None:
        return None  # not one run of visible keys per row, or a layout the views do not take
    try:
        out = torch.ops.aten._flash_attention_forward(
            seqs.q, seqs.k, seqs.v, seqs.cu_seqlens_q, seqs.cu_seqlens_k, 1, seqs.max_seqlen_k, 0.0, False, False,
            scale=scale, seqused_k=seqs.seqused_k)[0]
    except RuntimeError as exc:
        _refuse(kind, exc, q, k, mask)
        return None
    return out.view(q.shape)  # type: ignore[no-any-return]


def _flash_serves(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether FlashAttention-2's op (:func:`_flash_decode`, :func:`_varlen_decode`) takes these decode inputs and
    is worth its host path: its device, fp16/bf16 for all three, head dims up to 256 in multiples of 8 and equal,
    every last dimension contiguous (``mha_fwd``/``mha_varlen_fwd``'s checks, torch 2.11; checked here so that an
    odd call does not turn the op off as a refusal), and a memory-efficient walk of :data:`_FLASH_FROM_KEYS` keys or
    more (:func:`_efficient_walk`)."""
    import torch

    if q.device.type not in _FLASH_DEVICES or _efficient_walk(q, k) < _FLASH_FROM_KEYS:  # the most selective first
        return False
    d = q.shape[-1]
    return (q.dtype in (torch.float16, torch.bfloat16) and not d % 8 and d <= 256 and v.shape[-1] == d
            and k.dtype == q.dtype and v.dtype == q.dtype and q.stride(-1) == 1 and k.stride(-1) == 1
            and v.stride(-1) == 1)


def _efficient_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, *,
                      seen: torch.Tensor | None, scale: float | None) -> torch.Tensor | None:
    """A masked decode call with nothing recorded for backward on the memory-efficient kernel, its per-call host
    work cut to the kernel alone: ``q [B, Hq, Sq, D]``, ``k/v [B, Hkv, Sk, D]``, ``mask`` broadcastable to
    ``[B, Hq, Sq, Sk]``: the caller's (bool, or additive in any float dtype; ``seen`` None), or additive as the
    adapter prepares it for SDPA, the rows that see no key opened, and ``seen`` those rows; returns
    ``[B, Hq, Sq, Dv]``, or None where the kernel cannot serve the call (another device, or a kind it refused: the
    caller's general path serves it).

    The kernel has no GQA. Each (batch row, K/V head) is one batch entry of the kernel, with one head and the
    ``g x Sq`` query rows of its ``g = Hq / Hkv`` query heads (:func:`_batch_folded`): q, K/V and the output are then
    views of the caller's tensors, in the output's case a view of ``[B, Hq, Sq, Dv]`` itself, with no copy (the
    query heads folded into the K/V heads' rows instead, ``[B, Hkv, g x Sq, D]``, leave the output in the order
    ``(g, Hkv)``: a copy kernel per call, ~10 µs of host time on an H200's host, 2026-11-28). Where K/V's batch and
    head dimensions do not merge into one stride (a bhsd view of a bshd cache), the query heads are folded into the
    rows as before.

    The kernel's bias (:func:`_decode_bias`) is made once per mask object and kept beside it
    (:data:`_DECODE_BIASES`; a model's layers share one mask per step). The rows that see no key are hidden in it,
    and the kernel returns zeros for a row whose bias hides every key (measured on an H200, torch 2.11, 2026-11-28:
    ``decode_probe.py`` ``op_folded_all_hidden_row``, max 0.0, no NaN; ``tests/dispatch/test_gpu.py`` holds such a
    row), so no multiply zeroes them."""
    import torch

    b, hq, sq, d = q.shape
    hkv = k.shape[1]
    if q.device.type not in _EFFICIENT_DEVICES or not (mask.dtype == torch.bool or mask.is_floating_point()):
        return None
    g = hq // hkv
    folded = _batch_folded(q, k, v)
    if folded is None:  # the query heads into the K/V heads' rows: [B, Hkv, g x Sq, D], the output copied back
        qf, kf, vf = q.reshape(b, hkv, g * sq, d), k, v
    else:
        qf, kf, vf = folded
    if _REFUSED and _efficient_kind(qf, kf, vf, masked=True) in _REFUSED:  # asked once some kind was refused
        return None
    params = _bias_params(q, k, batch_folded=folded is not None)
    bias = _DECODE_BIASES.get(mask, params)
    if bias is None:
        capturing = graph_capturing()
        bias = _decode_bias(mask, seen, b=b, hkv=hkv, g=g, sq=sq, sk=k.shape[2], dtype=q.dtype,
                            batch_folded=folded is not None, capturing=capturing)
        if not capturing:  # a captured kernel has not run: the bias would hold garbage for an eager call
            _DECODE_BIASES.put(mask, params, bias)
    return _efficient_folded(qf, kf, vf, bias, scale=scale, shape=(b, hq, sq))


def _bias_params(q: torch.Tensor, k: torch.Tensor, *, batch_folded: bool) -> tuple[Any, ...]:
    """What a decode call's kept bias (:data:`_DECODE_BIASES`, beside its mask object) was made for: the fold, B,
    Hkv, g, Sq, Sk, dtype and device; :func:`_efficient_decode` keeps it under this key and
    :meth:`SdpaAdapter.decode_lane` finds it by the same key."""
    b, hq, sq, _ = q.shape
    hkv = k.shape[1]
    return (batch_folded, b, hkv, hq // hkv, sq, k.shape[2], q.dtype, q.device)


def _efficient_folded(qf: torch.Tensor, kf: torch.Tensor, vf: torch.Tensor, bias: torch.Tensor, *,
                      scale: float | None, shape: tuple[int, int, int]) -> torch.Tensor | None:
    """The memory-efficient kernel on a decode call folded as :func:`_efficient_decode` folds it, with its bias; the
    output as ``[B, Hq, Sq, Dv]`` (``shape``: ``(B, Hq, Sq)``), or None where the kernel refused (:func:`_efficient_op`:
    that kind is refused from then on)."""
    out = _efficient_op(None, qf, kf, vf, bias, scale=scale, grad=False)
    return None if out is None else out.reshape(*shape, out.shape[-1])


@dataclass(slots=True)
class DecodeLane:
    """A masked decode call's lean path bound to one mask object, for the calls that repeat the call it was made
    for (the next layers of a step: the same mask object, q/k/v of the same shapes, strides, dtypes and devices,
    the same scale; :func:`attnforge.dispatch.features.lane_call` checks that): what :func:`_efficient_decode`
    decided for the first call (the kernel's bias, made once per mask object; the batch fold) is kept, so each
    later call runs only the checks of the process's state, the meeting count (:data:`_MET`) and the kernel.
    Calling it returns ``[B, Hq, Sq, Dv]``, or None where the call must take the adapter's general path (autograd
    records it, CUDA graph capture, the caller restricted SDPA's kernels, ``torch.compile`` traces, the shape
    settled on cuDNN, the kernel refused).

    Why: on an H200's host (2026-11-28, ``decode_probe.py host_costs``) the dispatch and the adapter's checks cost
    ~20 µs of the 62.8 a call took through the transformers integration, against 59.3 for transformers' own SDPA
    call; a 2-layer decoder's decode step read 0.97-0.98x its default at repeated lengths."""

    #: the bias kept beside the mask (:data:`_DECODE_BIASES`), held weakly: a lane outlives its mask in its thread,
    #: and a bias (up to ``B x Hq x Sq x Sk`` elements for a mask per head) must not
    bias: weakref.ref[torch.Tensor]
    scale: float | None
    shape: tuple[int, int, int]
    cuda: bool
    #: True once the lane declines for good (the bias gone, the shape settled on cuDNN, the kernel refused the kind):
    #: its keeper (:func:`attnforge.dispatch.features.lane_call`) drops it instead of asking it again every call
    retired: bool = False

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        if (self.cuda and graph_capturing()) or records_grad(q, k, v, mask) or not _cudnn_free_decode():
            return None  # this call only: the next may be outside capture, without grad, unrestricted
        bias = self.bias()
        if bias is None or not _MET.unsettled(q, k, v, mask):
            self.retired = True
            return None
        folded = _batch_views(q, k, v)  # the lane's geometry is its first call's, whose K/V merged
        if _REFUSED and _efficient_kind(*folded, masked=True) in _REFUSED:
            self.retired = True
            return None
        out = _efficient_folded(*folded, bias, scale=self.scale, shape=self.shape)
        self.retired = out is None  # None: the kernel refused this kind now
        return out


def _batch_folded(q: torch.Tensor, k: torch.Tensor,
                  v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``q [B, Hq, Sq, D]``, ``k/v [B, Hkv, Sk, D]`` as the memory-efficient kernel's batch of ``B x Hkv`` entries
    of one head each: q ``[B x Hkv, 1, g x Sq, D]`` (row ``i x Sq + s`` of entry ``b x Hkv + h`` is query head
    ``h x g + i``'s row ``s``; a view where q's strides allow, else a copy of q), K/V ``[B x Hkv, 1, Sk, D]`` views
    of their storage; None where K's or V's batch stride is not ``Hkv`` times its head stride (their two dimensions
    do not merge into one: a bhsd view of a bshd cache). The kernel writes its output ``[B x Hkv, g x Sq, 1, Dv]``,
    which is ``[B, Hq, Sq, Dv]`` in memory."""
    return _batch_views(q, k, v) if _batch_merges(k, v) else None


def _batch_views(q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_batch_folded`'s views, for K/V whose batch and head dimensions merge (:func:`_batch_merges`; a C++
    view each, ~1 µs on this repository's CPU machine, 2026-11-28)."""
    n = k.shape[0] * k.shape[1]
    return (q.reshape(n, 1, -1, q.shape[3]), k.view(n, 1, k.shape[2], k.shape[3]),
            v.view(n, 1, v.shape[2], v.shape[3]))


def _batch_merges(k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether ``k/v [B, Hkv, Sk, D]``'s batch and head dimensions merge into one (the batch stride ``Hkv`` times
    the head stride, or one of them of size 1): :func:`_batch_folded`'s views exist."""
    b, hkv = k.shape[0], k.shape[1]
    return b == 1 or hkv == 1 or (k.stride(0) == hkv * k.stride(1) and v.stride(0) == hkv * v.stride(1))


def _decode_bias(mask: torch.Tensor, seen: torch.Tensor | None, *, b: int, hkv: int, g: int, sq: int, sk: int,
                 dtype: torch.dtype, batch_folded: bool, capturing: bool) -> torch.Tensor:
    """The memory-efficient kernel's bias for a decode call's ``mask`` (broadcastable to ``[B, Hq, Sq, Sk]``, ``Hq =
    Hkv x g``; bool, True where a key is seen, or additive in any float dtype) with its query heads folded as
    :func:`_efficient_decode` folds them: ``[B x Hkv, 1, g x Sq, Sk]`` (``batch_folded``) or ``[B, Hkv, g x Sq,
    Sk]`` (``sk``: K's length; a mask whose last dimension is 1 is expanded to it), additive in ``dtype``, -inf where
    a key is hidden and over every key of a row ``seen`` says sees none
    (bool, broadcastable to ``[B, Hq, Sq, 1]``, or None). One kernel writes it (a ``where``, or a copy and a fill
    for an additive mask with ``seen``) into rows whose stride is a multiple of :data:`_BIAS_ALIGNMENT`, over the
    dimensions the mask varies in (the batch and K/V head dimensions merged when folded so); the others are
    expanded (stride 0), as the kernel takes them (:func:`_efficient_bias`). ``capturing``: under CUDA graph
    capture, where :func:`_aligned_additive`'s kept values are not made."""
    import torch

    m = four_dims(mask)
    mb, mh, mq, mk = m.shape  # mk: Sk, or 1 for a mask that broadcasts over the keys (the kernel wants all Sk)
    heads = mh > 1
    m5 = m.reshape(mb, hkv, g, mq, mk) if heads else m.reshape(mb, 1, 1, mq, mk)
    rows = (g, sq) if heads or mq > 1 else (1, 1)
    if batch_folded:
        lead = (b, hkv) if mb > 1 or heads else (1, 1)
    else:
        lead = (mb, hkv if heads else 1)
    n = sk + (-sk) % _BIAS_ALIGNMENT
    rows_n = rows[0] * rows[1]
    buf = torch.empty(lead[0] * lead[1] * rows_n * n, dtype=dtype, device=mask.device)
    out = buf.as_strided((*lead, *rows, sk), (lead[1] * rows_n * n, rows_n * n, rows[1] * n, n, 1))
    src = m5.expand(out.shape)
    if m.dtype == torch.bool and not capturing:
        inf, zero = _additive_values(dtype, mask.device)
        torch.where(src, zero, inf, out=out)
    elif m.dtype == torch.bool:  # the kept values are made outside capture only
        out.zero_().masked_fill_(~src, float("-inf"))
    else:
        # narrowed: a float32 mask's finite hiding value (transformers' finfo.min) stays finite in bfloat16/float16,
        # where a plain cast made it -inf and a row it hides entirely zeros instead of the exact math's mean of v
        # (on the mask's own, unexpanded elements: the narrowing's few kernels run on them, not on the expansion)
        out.copy_(narrowed(m5, dtype).expand(out.shape))
        if seen is not None:
            s = four_dims(seen)
            s5 = s.reshape(s.shape[0], hkv, g, s.shape[2], 1) if s.shape[1] > 1 else s.reshape(
                s.shape[0], 1, 1, s.shape[2], 1)
            out.masked_fill_(~s5.expand(*out.shape[:-1], 1), float("-inf"))
    # one view of the buffer in the kernel's shape: a dimension the mask does not vary in has stride 0
    m_stride = n if rows_n > 1 else 0
    if batch_folded:
        # B x Hkv entries: their own rows wherever the mask varies by batch row or head (b may be 1: heads vary)
        return buf.as_strided((b * hkv, 1, g * sq, sk), (rows_n * n if lead[0] * lead[1] > 1 else 0, 0, m_stride, 1))
    return buf.as_strided((b, hkv, g * sq, sk), (lead[1] * rows_n * n if lead[0] > 1 else 0,
                                                  rows_n * n if lead[1] > 1 else 0, m_stride, 1))


def _flash_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor | None:
    """An unmasked decode call with nothing recorded for backward on FlashAttention-2's split-KV kernel (SDPA's own
    copy, ``aten::_flash_attention_forward``, GQA native, ``[B, S, H, D]`` views of the bhsd tensors) when the
    memory-efficient kernel would walk many keys per thread block; returns ``[B, Hq, Sq, D]`` (a view of the
    kernel's bshd output), or None (fp16/bf16 and head dims up to 256 in multiples of 8 only; a kind the kernel
    refused; few keys: the memory-efficient kernel then).

    Why a threshold: on an H200 (torch 2.11, 2026-11-28, ``decode_probe.py decode_kernels``, Llama-3-8B's step at
    1025-1040 keys, 4 x 8 K/V heads) the memory-efficient kernel took 38 µs of device time with no bias (32 thread
    blocks, each walking every key; it splits no keys) and ~40 µs a call; FlashAttention-2 splits the keys
    (14 µs of device time) but its host path costs ~58 µs a call. The walk grows with the keys and with the waves
    of thread blocks (:func:`_efficient_walk`); from :data:`_FLASH_FROM_KEYS` keys a block the split kernel's
    device time saving outweighs its host cost."""
    import torch

    if not _flash_serves(q, k, v):
        return None
    kind = ("flash", q.dtype, q.shape[-1])
    if kind in _REFUSED:
        return None
    try:
        out = torch.ops.aten._flash_attention_forward(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, None, q.shape[2], k.shape[2], 0.0,
            False, False, scale=scale)[0]
    except RuntimeError as exc:
        _refuse(kind, exc, q, k, None)
        return None
    return out.transpose(1, 2)  # type: ignore[no-any-return]


def _efficient_walk(q: torch.Tensor, k: torch.Tensor) -> int:
    """The keys each thread block of the memory-efficient kernel walks, times its waves of blocks, for ``q [B, Hq,
    Sq, D]`` folded as :func:`_decode_without_cudnn` folds it: ``Sk x ceil(B x Hkv x ceil(g x Sq / 64) / SMs)``
    (64 query rows a block: ``fmha_cutlassF_*_64x128``, torch 2.11)."""
    b, hq, sq, _ = q.shape
    hkv = k.shape[1]
    blocks = b * hkv * -(-(hq // hkv) * sq // 64)
    return int(k.shape[2]) * -(-blocks // _multiprocessors(q.device))


@functools.cache
def _multiprocessors(device: Any) -> int:
    """The streaming multiprocessors of a CUDA ``device`` (``torch.cuda.get_device_properties``)."""
    import torch

    return int(torch.cuda.get_device_properties(device).multi_processor_count)


#: per device type, the SDPA kernels that take a mask (``SDPBackend`` member names, FlashAttention-2 takes none): where
#: each returns zeros for the rows that see no key, the adapter leaves those rows to them (:func:`_unseen_rows_zeroed`;
#: a test's probe of CPU's math kernel is the seam that adds the CPU)
_MASK_KERNELS: dict[str, tuple[str, ...]] = {"cuda": ("CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")}


def _unseen_rows_zeroed(q: torch.Tensor, v: torch.Tensor, kernel: str | None, *, grad: bool = False) -> bool:
    """Whether the SDPA kernel of a call on ``q [B, Hq, Sq, D]``, ``v [B, Hkv, Sk, Dv]`` returns zeros (finite, no NaN)
    for the query rows whose additive mask is -inf at every key, so the adapter need not open those rows and zero
    them after the call (a pass over the whole output: 89 µs of a 219 µs call at Llama-3-8B's prefill layer, B4
    Hq32 Hkv8 S1024 D128 bf16, on an H200 with torch 2.11, 2026-11-29, ``scripts/gpu/mask_reuse.py --shape
    llama3-8b``, docs/benchmarks.md). ``kernel``: the forced kernel's name; None (SDPA chooses): every kernel of
    :data:`_MASK_KERNELS` for the device must. Asked of the kernels themselves (:func:`_zeroing_kernels`), once per
    device, dtype and head dims: torch 2.1-2.4's memory-efficient kernel returned NaN there
    (pytorch/pytorch#110213); torch 2.11's cuDNN, memory-efficient and math kernels return zeros (that run).
    ``grad``: a call autograd records, whose kernels' gradients must also be right there (the probe's ``grad``)."""
    zeroing = _zeroing_kernels(q.device, q.dtype, int(q.shape[-1]), int(v.shape[-1]), grad)
    return kernel in zeroing if kernel is not None else zeroing.issuperset(_MASK_KERNELS[q.device.type])


def ask_mask_kernels(device: Any, dtype: Any, head_dim: int, head_dim_v: int, *, grad: bool = False) -> None:
    """Ask now what a masked call's first use would (:func:`_zeroing_kernels`: three probe calls, one of them a cuDNN
    graph build) for ``dtype`` (a ``torch.dtype``) and head dims on ``device``; nothing where the device has no such
    kernels. ``grad``: the question of a call autograd records (the probe's gradients too). ``attnforge warmup``
    asks it for each dtype, head dims and mode it warms, so a padded batch's first call pays none of it.

    Raises:
        RuntimeError: the device's state (out of memory, a CUDA error), as the probe raises it."""
    import torch

    dev = torch.device(device)
    if dev.type in _MASK_KERNELS:
        _zeroing_kernels(dev, dtype, int(head_dim), int(head_dim_v), grad)


#: rows of the probe's query that see no key (:func:`_zeroing_kernels`), of its :data:`_PROBE_ROWS`
_PROBE_HIDDEN, _PROBE_ROWS = 16, 256
#: the probe's largest relative L2 error of a kernel's gradient against float32 math's (:func:`_zeroing_kernels` with
#: ``grad``), by dtype; float32 and wider: 1e-3. Measured on an H200 (torch 2.11, 2026-11-30, ``mask_reuse.py --shape
#: llama3-8b``, bf16, an upstream gradient on every row): cuDNN, memory-efficient and math given the rows -inf at every
#: key 0.003-0.006; the same kernels given those rows opened and not zeroed after (a wrong gradient) 0.044-0.157
_PROBE_GRAD_TOL = {"torch.bfloat16": 2e-2, "torch.float16": 1e-2}


@functools.cache
def _zeroing_kernels(device: Any, dtype: Any, d: int, dv: int, grad: bool) -> frozenset[str]:
    """The kernels of :data:`_MASK_KERNELS` for ``device`` that return zeros and nothing but finite values for the
    query rows that see no key, called as SDPA calls each once chosen on a ``[1, 2, 256, d]`` query (``dv``: V's
    head dim) in ``dtype`` whose first 16 rows an additive mask hides every key from, the others causal. ``grad``:
    also their gradients, an upstream gradient arriving on every row: finite, zero for the hidden rows' queries,
    and the gradients of Q, K and V within :data:`_PROBE_GRAD_TOL` of float32 math's with the hidden rows' outputs
    zeroed (what the adapter's opening and zeroing gives). A kernel that raises there (not built, not for this
    dtype or head dim) is left out: it is not known to. Once per process for each device, dtype, head dims and
    ``grad`` (one host sync per kernel; cuDNN builds a graph for the shape).

    Raises:
        RuntimeError: the device's state (out of memory, a CUDA error: :func:`device_state`), not a refusal."""
    import torch

    if grad:  # its own tensors record gradients even where the caller runs under torch.inference_mode
        with torch.inference_mode(False), torch.enable_grad():
            return _probe_kernels(device, dtype, d, dv, grad=True)
    return _probe_kernels(device, dtype, d, dv, grad=False)


def _probe_kernels(device: Any, dtype: Any, d: int, dv: int, *, grad: bool) -> frozenset[str]:
    """:func:`_zeroing_kernels`'s probe calls, uncached."""
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    q, k = (torch.randn(1, 2, _PROBE_ROWS, d, device=device, dtype=dtype, generator=gen) for _ in range(2))
    v = torch.randn(1, 2, _PROBE_ROWS, dv, device=device, dtype=dtype, generator=gen)
    go = torch.randn(1, 2, _PROBE_ROWS, dv, device=device, dtype=dtype, generator=gen) if grad else None
    visible = torch.ones(_PROBE_ROWS, _PROBE_ROWS, dtype=torch.bool, device=device).tril()
    visible[:_PROBE_HIDDEN] = False
    bias = _aligned_additive(visible, dtype, hide=False).expand(1, 2, _PROBE_ROWS, _PROBE_ROWS)
    ref = _probe_reference_grads(q, k, v, visible, go) if go is not None else ()
    if grad:
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    calls: dict[str, Callable[[], Any]] = {
        "CUDNN_ATTENTION": lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, bias, grad, 0.0, False, False, scale=None)[0],
        "EFFICIENT_ATTENTION": lambda: torch._scaled_dot_product_efficient_attention(
            q, k, v, bias, grad, 0.0, False, scale=None)[0],
        "MATH": lambda: torch.ops.aten._scaled_dot_product_attention_math(q, k, v, bias, 0.0, False, None,
                                                                          scale=None)[0],
    }
    zeroing = []
    for name in _MASK_KERNELS.get(torch.device(device).type, ()):
        try:
            with torch.no_grad() if go is None else contextlib.nullcontext():
                out = calls[name]()
                grads = torch.autograd.grad(out, (q, k, v), go) if go is not None else ()
        except Exception as exc:  # any refusal (a missing op, a dtype, a head dim) leaves the kernel out
            if device_state(exc):
                raise
            continue
        if not (bool(out.isfinite().all()) and not bool(out[:, :, :_PROBE_HIDDEN].any())):
            continue
        if grads and not (all(bool(g.isfinite().all()) for g in grads)
                          and not bool(grads[0][:, :, :_PROBE_HIDDEN].any())
                          and max(_rel_l2(g, r) for g, r in zip(grads, ref, strict=True))
                          <= _PROBE_GRAD_TOL.get(str(dtype), 1e-3)):
            continue
        zeroing.append(name)
    return frozenset(zeroing)


def _probe_reference_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor,
                           go: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The gradients of Q, K and V (float32) of the probe's call (:func:`_zeroing_kernels`) under upstream gradient
    ``go``: the exact math (:func:`~attnforge.backends.exact.exact_attention`, float32) under the bool mask
    ``visible``, where a row that sees no key is zeros and passes no gradient on, as the adapter serves it when it
    does not leave it to the kernel."""
    import torch

    from attnforge.backends.exact import exact_attention

    qf, kf, vf = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    return torch.autograd.grad(exact_attention(qf, kf, vf, attn_mask=visible), (qf, kf, vf), go.float())


def _rel_l2(got: torch.Tensor, ref: torch.Tensor) -> float:
    """``||got - ref|| / ||ref||`` in float32 (``ref`` all zeros: ``||got||``)."""
    diff = float((got.float() - ref).norm())
    base = float(ref.norm())
    return diff / base if base else diff


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
    refuses goes there too, and so does every later call of its kind (:data:`_REFUSED`, :func:`_efficient_op`)."""
    mask = kwargs.get("attn_mask")
    if (q.device.type in _EFFICIENT_DEVICES and (mask is None or mask.dtype == q.dtype)
            and _EFFICIENT_KW.issuperset(kwargs)):
        kind = _efficient_kind(q, k, v, masked=mask is not None)
        if kind not in _REFUSED:
            out = _efficient_op(kind, q, k, v, None if mask is None else _efficient_bias(mask, q, k),
                                scale=kwargs.get("scale"), grad=records_grad(q, k, v, mask),
                                dropout_p=kwargs.get("dropout_p", 0.0))
            if out is not None:
                return out
    return sdpa(q, k, v, **kwargs)


def _efficient_kind(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, masked: bool) -> tuple[Any, ...]:
    """What the memory-efficient kernel's refusals are remembered by (:data:`_REFUSED`): dtype, head dims, masked
    or not, the alignment of the rows of q, k, v."""
    return (q.dtype, q.shape[-1], v.shape[-1], not masked, q.stride(-2) % 8, k.stride(-2) % 8, v.stride(-2) % 8)


def _efficient_op(kind: tuple[Any, ...] | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  bias: torch.Tensor | None, *, scale: float | None, grad: bool,
                  dropout_p: float = 0.0) -> torch.Tensor | None:
    """``aten::_scaled_dot_product_efficient_attention`` on ``[B, H, Sq, D]`` and a bias in the kernel's form
    (:func:`_decode_bias`, :func:`_efficient_bias`); None if the kernel refuses the inputs, and that ``kind`` (None:
    :func:`_efficient_kind` of these inputs) is refused from then on (:func:`_refuse`): a refusal is a C++
    exception, ~350 µs a call on an H200 (2026-11-28: Llama-3-8B's decode 0.84x its default while every call
    raised). Called through torch's own Python binding of the op (``torch._scaled_dot_product_efficient_attention``),
    not the ``torch.ops.aten`` packet, whose schema-driven argument parsing costs ~0.7 µs more a call (this
    repository's CPU machine, torch 2.13, 2026-11-28)."""
    import torch

    try:
        return torch._scaled_dot_product_efficient_attention(
            q, k, v, bias, grad, dropout_p, False, scale=scale)[0]
    except RuntimeError as exc:
        _refuse(kind if kind is not None else _efficient_kind(q, k, v, masked=bias is not None), exc, q, k, bias)
        return None


def _refuse(kind: tuple[Any, ...], exc: RuntimeError, q: torch.Tensor, k: torch.Tensor,
            mask: torch.Tensor | None) -> None:
    """Remember that a kernel refused this ``kind`` of decode call (:data:`_REFUSED`) and log it once. Raises
    ``exc`` itself when it is no refusal of the inputs but the device's state (out of memory, a CUDA error): that
    reaches the caller, and the kernel stays on for the next call."""
    import logging

    if device_state(exc):
        raise exc
    _REFUSED[kind] = str(exc).splitlines()[0][:300]
    name = {"flash": "FlashAttention-2", "varlen": "FlashAttention-2 varlen"}.get(kind[0], "SDPA's memory-efficient")
    logging.getLogger("attnforge").warning(
        "a decode kernel refused a decode call (%s; q %s %s, k %s %s, mask %s): %s; calls of this kind go to "
        "another kernel from now on", name,
        tuple(q.shape), q.stride(), tuple(k.shape), k.stride(),
        None if mask is None else (tuple(mask.shape), mask.stride()), _REFUSED[kind])


#: the devices whose memory-efficient kernel :func:`_memory_efficient` calls itself (the op is CUDA's; a test's fake
#: kernel is the seam that adds the CPU)
_EFFICIENT_DEVICES = frozenset({"cuda"})
#: the devices whose FlashAttention-2 op :func:`_flash_decode` calls (as :data:`_EFFICIENT_DEVICES`)
_FLASH_DEVICES = frozenset({"cuda"})
#: keys a memory-efficient thread block walks (:func:`_efficient_walk`) from which an unmasked decode call takes
#: FlashAttention-2's split-KV kernel (:func:`_flash_decode`): at ~1030 the memory-efficient kernel's 38 µs of device
#: time were under FlashAttention-2's ~58 µs host path (H200, 2026-11-28); twice that many keys, it is not
_FLASH_FROM_KEYS = 1536
#: the SDPA keywords the lean decode paths (:func:`_efficient_decode`, :func:`_flash_decode`) serve
_DECODE_KW = frozenset({"attn_mask", "dropout_p", "scale", "enable_gqa"})
#: the memory-efficient kernel's bias for a decode call's mask, kept per prepared mask object
#: (:func:`_efficient_decode`): a model's layers share one mask per step
_DECODE_BIASES: KeptPerMask[torch.Tensor] = KeptPerMask()
#: the SDPA keywords :func:`_memory_efficient` hands the kernel itself
_EFFICIENT_KW = frozenset({"attn_mask", "dropout_p", "scale"})
#: the decode kernels' refusals in this process: the kind of call (:func:`_efficient_kind`, or ``("flash", dtype,
#: head dim)``) -> the kernel's message; that kind goes to another kernel from then on
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


def _bottom_right_bound(seqlen_q: int, seqlen_k: int, kwargs: dict[str, Any]) -> Callable[..., torch.Tensor]:
    """A chunked prefill's plain route (bottom-right causal, ``DECODE_ROWS < Sq < Sk``): SDPA on the kept additive
    mask (:func:`_bottom_right_additive`; every row sees a key, so none is zeroed), what :meth:`SdpaAdapter.__call__`
    runs for it without its per-call branches (~6 µs of host time a call on this machine's CPU, 2026-11-30).
    Takes and returns ``[B, H, S, D]``."""
    sdpa: Callable[..., torch.Tensor] = original_sdpa()

    def chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        mask, _seen = _bottom_right_additive(seqlen_q, seqlen_k, q.dtype, q.device)
        return sdpa(q, k, v, attn_mask=mask, **kwargs)

    return chunk


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


def _aligned_additive(cond: torch.Tensor, dtype: torch.dtype, *, hide: bool) -> torch.Tensor:
    """A bool mask as an additive one in ``dtype``: -inf where ``cond`` is ``hide``, 0 elsewhere; one kernel, into
    rows whose stride is a multiple of :data:`_BIAS_ALIGNMENT` elements, so the memory-efficient kernel takes it as
    it is (SDPA pads an unaligned mask on every call; :func:`_efficient_bias` would once). Outside CUDA graph
    capture and tracing only (:func:`_additive_values`)."""
    import torch

    n = cond.shape[-1]
    out = torch.empty((*cond.shape[:-1], n + (-n) % _BIAS_ALIGNMENT), dtype=dtype, device=cond.device)[..., :n]
    inf, zero = _additive_values(dtype, cond.device)
    return torch.where(cond, inf, zero, out=out) if hide else torch.where(cond, zero, inf, out=out)


@functools.lru_cache(maxsize=16)
@made_for_autograd
def _additive_values(dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``-inf`` and ``0`` as 0-dim tensors of ``dtype`` on ``device``: an additive mask in one ``torch.where``."""
    import torch

    return (torch.full((), float("-inf"), dtype=dtype, device=device),
            torch.zeros((), dtype=dtype, device=device))


def _force(kernel: str) -> Any:
    """``sdpa_kernel([SDPBackend.<kernel>])``: only that SDPA kernel may run inside the context."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, kernel)])
