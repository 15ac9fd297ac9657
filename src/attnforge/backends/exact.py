"""The exact attention fallback: every feature of :func:`attnforge.attention`, in plain torch, in float32 or more.

One function, :func:`exact_attention`, answers "what is the right output" for every feature: it is the float64
reference of verify and the tests (``accum=torch.float64``) and the fallback that serves any call no verified
kernel supports (``accum`` float32, or float64 for float64 inputs). :class:`ExactAdapter` puts it behind the
adapter convention under the name ``"exact"``.

Semantics (those of :func:`attnforge.attention`), for query ``i`` and key ``j`` of one sequence:
    offset: ``Sk - Sq`` with ``causal_alignment="bottom_right"`` (FlashAttention), 0 with ``"top_left"`` (SDPA).
    causal: key ``j`` visible when ``j <= i + offset``.
    window ``(left, right)``: visible when ``i + offset - left <= j <= i + offset + right``; a negative or
        None side is unbounded (FlashAttention's ``window_size``, with -1 meaning infinite).
    softcap ``c``: logits become ``c * tanh(logits / c)`` after scaling, before masks.
    attn_mask: bool (True = visible) or additive float, broadcastable to ``[B, Hq, Sq, Sk]``.
    sinks ``[Hq]``: one extra logit per head in the softmax denominator with no value (GPT-OSS ``s_aux``).
    dropout_p: dropout on the normalised probabilities (scaled by ``1 / (1 - p)``), from torch's global RNG.
    Rows that see no key are zeros, and their log-sum-exp is ``-inf`` (the sink's logit with sinks).
    lse: ``log(sum_j exp(logit_j) [+ exp(sink)])`` per query row, float32, ``[B, Hq, Sq]``.
    varlen: packed ``[total, H, D]`` tensors with ``cu_seqlens_q/k`` (int32 offsets, ``len = batch + 1``);
        each sequence is attended on its own, masks aligned per sequence; lse is ``[Hq, total_q]``.
    paged KV: K/V in pages ``[num_blocks, page_size, Hkv, D]`` addressed by ``block_table [B, blocks]``, the
        first ``seqused_k[b]`` keys of each sequence used; the pages are gathered, then attended as dense.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnforge.backends._base import callers_own, device_state, kept_outside_capture, narrowed, records_grad
from attnforge.backends.adapter import FEATURES, AttentionCall

if TYPE_CHECKING:
    import torch

EXACT = "exact"


def exact_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, scale: float | None = None,
    attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, causal_alignment: str = "bottom_right",
    window: tuple[int | None, int | None] | None = None, softcap: float | None = None,
    sinks: torch.Tensor | None = None, return_lse: bool = False, cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None, max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
    block_table: torch.Tensor | None = None, seqused_k: torch.Tensor | None = None,
    accum: torch.dtype | None = None, out_dtype: torch.dtype | None = None,
) -> Any:
    """Attention in plain torch with every feature (see the module docstring).

    Args:
        q: ``[B, Hq, Sq, D]``, or packed ``[total_q, Hq, D]`` with ``cu_seqlens_q``.
        k: ``[B, Hkv, Sk, D]`` (or ``[total_k, Hkv, D]``), Hq a multiple of Hkv.
        v: ``[B, Hkv, Sk, Dv]`` (or ``[total_k, Hkv, Dv]``); Dv may differ from D.
        block_table: paged KV: ``[B, blocks]`` int indices into ``k``/``v`` given as paged caches
            ``[num_blocks, page_size, Hkv, D]``; sequence ``b`` is the pages ``block_table[b]`` in order, of which
            the first ``seqused_k[b]`` keys are used (all of them when ``seqused_k`` is None).
        accum: the dtype computed in (float32, or float64 for float64 inputs, when None).
        out_dtype: the output's dtype (q's when None).
        Others: as :func:`attnforge.attention`.

    Returns:
        The output (``[B, Hq, Sq, Dv]`` or ``[total_q, Hq, Dv]``), and with ``return_lse`` also the float32
        log-sum-exp (``[B, Hq, Sq]`` or ``[Hq, total_q]``). Differentiable.
    """
    import torch

    if accum is None:
        accum = torch.float64 if q.dtype == torch.float64 else torch.float32
    dtype = out_dtype or q.dtype
    opts: dict[str, Any] = {"causal": causal, "scale": scale, "dropout_p": dropout_p,
                            "top_left": causal_alignment == "top_left", "window": window,
                            "softcap": softcap, "sinks": sinks, "accum": accum, "lse": return_lse}
    if block_table is not None:
        if attn_mask is not None or cu_seqlens_q is not None:
            raise ValueError("paged attention takes no attn_mask and no cu_seqlens")
        pages = block_table.shape[1] * k.shape[1]
        used = seqused_k.tolist() if seqused_k is not None else [pages] * q.shape[0]
        outs, lses = [], []
        for b, blocks in enumerate(block_table.long()):
            kb, vb = (t[blocks].flatten(0, 1)[: used[b]].transpose(0, 1).unsqueeze(0) for t in (k, v))
            o, lse = _dense(q[b : b + 1], kb, vb, attn_mask=None, **opts)
            outs.append(o)
            lses.append(lse)
        out = torch.cat(outs).to(dtype) if outs else q.new_zeros((*q.shape[:3], v.shape[-1]))
        if not return_lse:
            return out
        return out, (torch.cat(lses) if lses else q.new_zeros(q.shape[:3])).float()
    if cu_seqlens_q is None:
        out, lse = _dense(q, k, v, attn_mask=attn_mask, **opts)
        out = out.to(dtype)
        return (out, lse.float()) if return_lse else out  # lse is None unless return_lse
    if cu_seqlens_k is None or attn_mask is not None:
        raise ValueError("varlen attention needs cu_seqlens_k too, and takes no attn_mask")
    outs, lses = [], []
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for (q0, q1), (k0, k1) in zip(itertools.pairwise(bounds_q), itertools.pairwise(bounds_k), strict=True):
        o, lse = _dense(q[q0:q1].transpose(0, 1).unsqueeze(0), k[k0:k1].transpose(0, 1).unsqueeze(0),
                        v[k0:k1].transpose(0, 1).unsqueeze(0), attn_mask=None, **opts)
        outs.append(o[0].transpose(0, 1))
        if return_lse:
            lses.append(lse[0])
    out = torch.cat(outs, dim=0).to(dtype) if outs else q.new_zeros((0, q.shape[1], v.shape[-1]))
    if not return_lse:
        return out
    lse_all = torch.cat(lses, dim=-1) if lses else q.new_zeros((q.shape[1], 0))
    return out, lse_all.float()


#: the most logits one step of the exact math holds (2**27 float32 = 512 MiB): longer queries go in row chunks
CHUNK_ELEMENTS = 1 << 27


def _dense(q: Any, k: Any, v: Any, *, causal: bool, scale: float | None, attn_mask: Any,
           dropout_p: float, top_left: bool, window: Any, softcap: float | None, sinks: Any,
           accum: Any, lse: bool = True) -> tuple[Any, Any]:
    """``[B, Hq, Sq, Dv]`` output and ``[B, Hq, Sq]`` lse (None unless ``lse``) of dense inputs, computed in
    ``accum``, in chunks of query rows so no step holds more than :data:`CHUNK_ELEMENTS` logits."""
    import torch

    # where nothing reads the lse or records a gradient (a decode step, inference): the in-place path of _rows, and
    # half-precision q and K go to the logits' matmul as they are (_logits: one kernel accumulating in float32, no
    # copy of the cache)
    no_grad = not lse and sinks is None and dropout_p == 0.0 and not records_grad(q, k, v, attn_mask)
    mixed = no_grad and _mixed_matmul(q, k, accum)
    qa, ka, va = (q, k, v.to(accum)) if mixed else (q.to(accum), k.to(accum), v.to(accum))
    hq = qa.shape[1]
    s = scale if scale is not None else 1.0 / math.sqrt(max(1, qa.shape[-1]))
    sq, sk = qa.shape[2], ka.shape[2]
    step = max(1, CHUNK_ELEMENTS // max(1, qa.shape[0] * hq * sk))
    if step >= sq:  # one chunk (a decode step): q and the mask as they are, no slicing views
        visible = visible_keys(sq, sk, causal=causal, top_left=top_left, window=window, device=qa.device)
        return _rows(qa, ka, va, scale=s, visible=visible, attn_mask=attn_mask, dropout_p=dropout_p,
                     softcap=softcap, sinks=sinks, accum=accum, lse=lse, no_grad=no_grad)
    parts = []
    for start in range(0, max(sq, 1), step):
        rows = slice(start, min(sq, start + step))
        mask = attn_mask
        if mask is not None and mask.dim() >= 2 and mask.shape[-2] > 1:
            mask = mask[..., rows, :]
        visible = visible_keys(sq, sk, causal=causal, top_left=top_left, window=window, device=qa.device,
                               rows=(rows.start, rows.stop))
        parts.append(_rows(qa[:, :, rows], ka, va, scale=s, visible=visible, attn_mask=mask, dropout_p=dropout_p,
                           softcap=softcap, sinks=sinks, accum=accum, lse=lse, no_grad=no_grad))
    if len(parts) == 1:
        return parts[0]
    out = torch.cat([o for o, _ in parts], dim=2)
    return out, (torch.cat([part for _, part in parts], dim=2) if lse else None)


def _rows(q: Any, k: Any, v: Any, *, scale: float, visible: Any, attn_mask: Any, dropout_p: float,
          softcap: float | None, sinks: Any, accum: Any, lse: bool, no_grad: bool) -> tuple[Any, Any]:
    """One chunk of query rows of :func:`_dense` (``q [B, Hq, rows, D]``, ``k/v [B, Hkv, Sk, D]``, all in
    ``accum``, or q and K in half precision for :func:`_logits`); the lse is None unless ``lse``; ``no_grad``:
    :func:`_dense`'s answer to whether nothing reads the lse or records a gradient.

    GQA reads K/V as they are: query head ``h`` reads K/V head ``h // (Hq / Hkv)``, so the ``Hq / Hkv`` query heads
    of one K/V head are folded into its rows (``[B, Hkv, g * rows, D]``) and the logits unfolded to
    ``[B, Hq, rows, Sk]``, the same dot products without a copy of K and V per query head (2026-11-28, H200:
    each such copy of a Gemma-2 decode step's cache took ~48 µs of device time)."""
    import torch

    b, hq, rows, _ = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    grouped = q.reshape(b, hkv, (hq // hkv) * rows, q.shape[-1])
    # where nothing reads the lse or records a gradient (a decode step, inference): the logits changed in place and
    # torch.softmax (which subtracts each row's maximum itself): 12 ops for Gemma-2's decode call against 18, each a
    # kernel launch of ~20 µs host time on the H200 host (scripts/gpu/decode_probe.py gemma_calls, 2026-11-28); 9
    # with a bool mask, 8 with an additive one, where q and K go to the logits' matmul as they are and it takes the
    # first multiply (_logits)
    inference = bool(sk) and no_grad
    # the first multiply (by scale / softcap, or the scale) goes into the logits' matmul where it can (inference)
    first = (scale / softcap if softcap else scale) if inference else 1.0
    raw, scaled = _logits(grouped, k, accum, alpha=first)
    logits, masked = _masked_logits(raw.view(b, hq, rows, sk), scale=scale, softcap=softcap, visible=visible,
                                    attn_mask=attn_mask, accum=accum, in_place=inference, scaled=scaled)
    if inference:
        probs = torch.softmax(logits, dim=-1)
        if masked:  # a row that hides every key is all -inf: softmax makes it NaN, zeros as the path below gives
            probs.nan_to_num_(nan=0.0)
        return _unfold_rows(probs, grouped, v), None
    peak = logits.amax(dim=-1, keepdim=True) if sk else logits.new_full((*logits.shape[:-1], 1), -math.inf)
    sink = None
    if sinks is not None:
        sink = sinks.to(accum).view(1, -1, 1, 1).expand(*peak.shape)
        peak = torch.maximum(peak, sink)
    peak = torch.nan_to_num(peak, nan=0.0, posinf=0.0, neginf=0.0).detach()  # a row's non-finite peak -> 0
    weights = torch.exp(logits - peak)
    denom = weights.sum(dim=-1, keepdim=True)
    if sink is not None:
        denom = denom + torch.exp(sink - peak)
    # a row that sees a key has denom >= 1 (its largest term is exp(0)), one that sees none 0 (all its weights are
    # 0): dividing by the denominator clamped to 1 is exact for the first and gives the second zeros, in one kernel.
    # Clamped to 1, not to the smallest float: 1 / tiny made the second's gradient inf x 0 = NaN where a float
    # mask hid every key (a bool mask's where() had kept it away)
    safe = denom.clamp_min(1.0)
    probs = weights / safe
    if dropout_p > 0.0:
        probs = torch.nn.functional.dropout(probs, p=dropout_p)
    out = _unfold_rows(probs, grouped, v)
    if not lse:  # the log-sum-exp's kernels only when a caller reads it (the fallback serves decode steps too)
        return out, None
    lse_rows = torch.where(denom == 0, torch.full_like(denom, -math.inf), torch.log(safe) + peak).squeeze(-1)
    return out, lse_rows


def _masked_logits(raw: Any, *, scale: float, softcap: float | None, visible: Any, attn_mask: Any, accum: Any,
                   in_place: bool, scaled: bool = False) -> tuple[Any, bool]:
    """``raw`` (``q k^T``, ``[B, Hq, rows, Sk]``, a fresh tensor) scaled, softcapped and masked (hidden keys
    ``-inf``), changed in place when ``in_place`` (nothing records a gradient); and whether any mask applies.
    ``scaled`` (with ``in_place`` only): ``raw`` already holds the first multiply (``scale / softcap``, or
    ``scale`` without softcap: :func:`_logits`)."""
    import torch

    additive = attn_mask is not None and attn_mask.dtype != torch.bool
    if in_place:
        # the last multiply (by the softcap, or the scale) and an additive mask in one kernel: torch.add(mask, x,
        # alpha=c) is mask + c * x, in float32 for a mask in any float dtype (type promotion: no cast of the mask)
        if softcap:
            last = softcap
            (raw if scaled else raw.mul_(scale / softcap)).tanh_()
        else:
            last = 1.0 if scaled else scale
        if additive:
            logits = torch.add(attn_mask, raw, alpha=last)
        else:
            logits = raw if last == 1.0 else raw.mul_(last)
        if logits.dtype != accum:  # a float64 mask with float32 logits
            logits = narrowed(logits, accum)
    else:
        logits = raw * scale
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        if additive:
            logits = logits + narrowed(attn_mask, accum)
    if attn_mask is not None and not additive:
        visible = attn_mask if visible is None else visible & attn_mask
    if visible is not None:
        logits = torch.where(visible, logits, float("-inf"))  # one kernel (a masked_fill needs ~visible first)
    return logits, visible is not None or attn_mask is not None


#: whether torch's matmul with an ``out_dtype`` (``aten::bmm.dtype``: half-precision inputs, a float32 output
#: accumulated in float32) serves a device type: absent = not tried yet; it has CUDA kernels only (torch 2.13's CPU
#: build raises NotImplementedError), and a device type where it raised once takes the casts from then on
_MIXED_MATMUL: dict[str, bool] = {}


def _mixed_matmul(q: Any, k: Any, accum: Any) -> bool:
    """Whether the logits' matmul may take ``q`` and ``k`` as they are (:func:`_logits`): float16/bfloat16 inputs of
    one dtype, float32 accumulation, on a device whose torch has the kernel."""
    import torch

    return (accum == torch.float32 and q.dtype == k.dtype and q.dtype in (torch.float16, torch.bfloat16)
            and _MIXED_MATMUL.get(q.device.type, q.device.type == "cuda"))


def _logits(grouped: Any, k: Any, accum: Any, *, alpha: float = 1.0) -> tuple[Any, bool]:
    """``grouped @ k^T`` (``[B, Hkv, g x rows, D]`` by ``[B, Hkv, Sk, D]``) in ``accum``, and whether it is already
    multiplied by ``alpha`` (a fresh tensor either way). Inputs in ``accum`` by ``torch.matmul``; half-precision
    inputs by one ``torch.bmm(..., out_dtype=accum)`` (their products are exact in float32, summed in float32: the
    values of the cast inputs' matmul, without two cast kernels and a float32 copy of the cache; 2026-11-28,
    Gemma-2's decode call on the exact math), as ``torch.baddbmm(..., beta=0, alpha=alpha, out_dtype=accum)`` where
    ``alpha`` is not 1 (the multiply in the matmul's epilogue, in float32: one kernel fewer), or by those casts
    where that kernel raised."""
    import torch

    if grouped.dtype == accum:
        return torch.matmul(grouped, k.transpose(-1, -2)), False
    b, h, r, d = grouped.shape
    sk = k.shape[2]
    a, bt = grouped.reshape(b * h, r, d), k.reshape(b * h, sk, d).transpose(1, 2)
    device = grouped.device.type
    # not while torch.compile traces: its fake tensors lack aten::baddbmm.dtype's keywords (torch 2.13)
    if alpha != 1.0 and _SCALED_MATMUL.get(device, True) and not torch.compiler.is_compiling():
        try:
            out = torch.baddbmm(_zeros(accum, grouped.device).expand(b * h, r, sk), a, bt, beta=0.0, alpha=alpha,
                                out_dtype=accum)
        except (NotImplementedError, RuntimeError, TypeError) as exc:  # no such kernel here: the plain one below
            if device_state(exc) or callers_own(exc):
                raise  # the device's state (or a checkpoint's error), not a missing kernel: the kernel stays on
            _SCALED_MATMUL[device] = False
        else:
            _SCALED_MATMUL[device] = _MIXED_MATMUL[device] = True
            return out.view(b, h, r, sk), True
    try:
        out = torch.bmm(a, bt, out_dtype=accum)
    except (NotImplementedError, RuntimeError, TypeError) as exc:  # no such kernel on this device or torch
        if device_state(exc) or callers_own(exc):
            raise  # the device's state (or a checkpoint's error), not a missing kernel: the kernel stays on
        _MIXED_MATMUL[device] = False
        return torch.matmul(grouped.to(accum), k.to(accum).transpose(-1, -2)), False
    _MIXED_MATMUL[device] = True
    return out.view(b, h, r, sk), False


#: whether ``torch.baddbmm(..., out_dtype=...)`` (``aten::baddbmm.dtype``) serves a device type (absent: not tried
#: yet); where it raised once, :func:`_logits` multiplies after ``bmm`` as before
_SCALED_MATMUL: dict[str, bool] = {}


@kept_outside_capture(16)
def _zeros(dtype: Any, device: Any) -> Any:
    """A zero scalar tensor (``baddbmm``'s ignored input with ``beta=0``), one per dtype and device (made anew
    inside CUDA graph capture, as every kept device tensor is)."""
    import torch

    return torch.zeros((), dtype=dtype, device=device)


def _unfold_rows(probs: Any, grouped: Any, v: Any) -> Any:
    """``probs @ v`` with the query heads of each K/V head folded into its rows (``grouped``'s layout, as
    :func:`_rows` made the logits), unfolded to ``[B, Hq, rows, Dv]``."""
    import torch

    b, hq, rows, sk = probs.shape
    return torch.matmul(probs.reshape(*grouped.shape[:3], sk), v).view(b, hq, rows, v.shape[-1])


def visible_bounds(*, causal: bool, window: tuple[int | None, int | None] | None) -> tuple[int | None, int | None]:
    """``(left, right)``: query ``i`` (aligned, ``i' = i + offset``) sees keys ``i' - left .. i' + right``; None
    is unbounded. Folds causal (``right <= 0``) into the window and reads None or a negative side as unbounded."""
    left, right = window if window is not None else (None, None)
    left = None if left is None or left < 0 else left
    right = None if right is None or right < 0 else right
    if causal:
        right = 0 if right is None else min(right, 0)
    return left, right


def hides_keys(seqlen_q: int, seqlen_k: int, *, causal: bool, top_left: bool,
               window: tuple[int | None, int | None] | None, rows: tuple[int, int] | None = None) -> bool:
    """Whether causal and window hide any key from any query row (``rows``: only rows ``start..stop``), from the
    shapes alone: a bottom-right causal call of one query row (a decode step) or a window wider than the keys hides
    none, and needs no mask (with one, SDPA on an H100/H200 picks cuDNN, which builds a graph per sequence length:
    docs/dispatch-overhead.md)."""
    left, right = visible_bounds(causal=causal, window=window)
    if left is None and right is None:
        return False
    start, stop = rows if rows is not None else (0, seqlen_q)
    if stop <= start or seqlen_k == 0:
        return False
    offset = 0 if top_left else seqlen_k - seqlen_q
    # row i sees keys i' - left .. i' + right (i' = i + offset): the first row hides the most on the right, the
    # last the most on the left
    return (right is not None and start + offset + right < seqlen_k - 1) or (
        left is not None and stop - 1 + offset - left > 0)


def visible_keys(seqlen_q: int, seqlen_k: int, *, causal: bool, top_left: bool,
                 window: tuple[int | None, int | None] | None, device: Any,
                 rows: tuple[int, int] | None = None) -> Any:
    """The ``[Sq, Sk]`` bool mask of keys each query sees under causal and window, or None for all
    (``rows``: only query rows ``start..stop`` of the ``seqlen_q``)."""
    import torch

    if not hides_keys(seqlen_q, seqlen_k, causal=causal, top_left=top_left, window=window, rows=rows):
        return None
    left, right = visible_bounds(causal=causal, window=window)
    offset = 0 if top_left else seqlen_k - seqlen_q
    start, stop = rows if rows is not None else (0, seqlen_q)
    i = torch.arange(start, stop, device=device).unsqueeze(1) + offset
    j = torch.arange(seqlen_k, device=device).unsqueeze(0)
    visible = torch.ones(stop - start, seqlen_k, dtype=torch.bool, device=device)
    if right is not None:
        visible &= j <= i + right
    if left is not None:
        visible &= j >= i - left
    return visible


@dataclass(slots=True, kw_only=True)
class ExactAdapter:
    """:func:`exact_attention` behind the adapter convention: serves every call, float32 accumulation."""

    name: str = EXACT
    features: frozenset[str] = frozenset(FEATURES)

    def load_error(self) -> str | None:
        return None

    def unsupported_reasons(self, call: AttentionCall) -> list[str]:
        return []

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None, **features: Any) -> Any:
        return exact_attention(q, k, v, causal=causal, scale=scale, **features)


def reference_attention(q: Any, k: Any, v: Any, *, causal: bool = False, scale: float | None = None,
                        **features: Any) -> Any:
    """Attention in float64 on q's device: the ground truth for verify and tests.

    Takes every feature of :func:`attnforge.attention` as keywords (see
    :func:`attnforge.backends.exact.exact_attention`); rows that see no key are zeros.

    Returns:
        ``[B, Hq, Sq, Dv]`` in float64 (and the lse when ``return_lse=True``).
    """
    import torch

    return exact_attention(q, k, v, causal=causal, scale=scale, accum=torch.float64, out_dtype=torch.float64,
                           **features)
