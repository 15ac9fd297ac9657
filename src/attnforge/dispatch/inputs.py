"""The inputs of :func:`attnforge.attention`: the checks every call runs (kept cheap: they run on the hot path
the first time a signature is seen) and the error that names what is wrong."""

from __future__ import annotations

from typing import Any

import torch

from attnforge.errors import DispatchError


def validate(q: Any, k: Any, v: Any, *, layout: str, precision: str,
              scale: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, k, v)`` as ``[B, H, S, D]`` views, or a :class:`DispatchError` naming the problem.

    Kept to integer and identity comparisons: it runs on every call (docs/dispatch-overhead.md).
    """
    if layout == "bshd":
        try:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        except (AttributeError, IndexError, RuntimeError, TypeError):
            raise_for_input(q, k, v, layout)
    elif layout != "bhsd":
        raise DispatchError(f"unknown layout {layout!r}", hint="use layout='bhsd' ([B, H, S, D]) or 'bshd'")
    if precision != "exact" and precision != "allow_quantized":  # noqa: PLR1714 - fast path
        raise DispatchError(f"unknown precision {precision!r}", hint="use 'exact' or 'allow_quantized'")
    try:
        b, hq, _, d = q.shape
        kb, hkv, sk, kd = k.shape
        vb, vh, vs, _ = v.shape
        dtype = q.dtype
        ok = (b == kb == vb and d == kd and hkv == vh and sk == vs and hkv > 0 and hq % hkv == 0
              and dtype is k.dtype and dtype is v.dtype and q.device == k.device and q.device == v.device
              and (scale is None or scale > 0))
    except (AttributeError, TypeError, ValueError):
        ok = False
    if not ok:
        raise_for_input(q, k, v, layout, scale)
    return q, k, v


def raise_for_input(q: Any, k: Any, v: Any, layout: str, scale: float | None = None) -> None:
    """The slow path of :func:`validate`: find what is wrong with the inputs and say it."""
    refuse_nested_or_packed(q, k, v, packed=isinstance(q, torch.Tensor))
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise DispatchError(f"{name} is a {type(t).__name__}, not a torch.Tensor")
        if t.dim() != 4:
            raise DispatchError(f"{name} has {t.dim()} dimensions, expected 4",
                                hint=f"layout={layout!r} means [{', '.join(layout.upper())}]")
    where = f" (as [B, H, S, D]; layout={layout!r})"
    if k.shape[:3] != v.shape[:3]:
        raise DispatchError(f"k and v differ in shape: {tuple(k.shape)} vs {tuple(v.shape)}{where}",
                            hint="k and v need the same batch, heads and length (v's head dim may differ)")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise DispatchError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch or head dim{where}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise DispatchError(f"query heads Hq={q.shape[1]} is not a multiple of key/value heads"
                            f" Hkv={k.shape[1]}{where}", hint="GQA needs Hq % Hkv == 0")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise DispatchError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if q.device != k.device or q.device != v.device:
        raise DispatchError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}")
    raise DispatchError(f"scale must be positive, got {scale!r}")


def refuse_nested_or_packed(q: Any, k: Any, v: Any, *, packed: bool) -> None:
    """Raise the helpful error for nested tensors, and (``packed``) for 3-D inputs without ``cu_seqlens``."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if getattr(t, "is_nested", False):
            raise DispatchError(f"{name} is a nested tensor; attention() takes dense or packed tensors",
                                hint="pass the packed values with cu_seqlens: q.values() ([total, H, D]) and"
                                     " cu_seqlens_q=q.offsets().int(), or pad with"
                                     " torch.nested.to_padded_tensor and pass an attn_mask")
    if packed and getattr(q, "dim", None) is not None and q.dim() == 3:
        raise DispatchError(f"q has 3 dimensions {tuple(q.shape)}: packed [total, H, D] inputs need"
                            " cu_seqlens_q and cu_seqlens_k (varlen)",
                            hint="pass cu_seqlens_q/cu_seqlens_k, or add the batch dimension: q.unsqueeze(0)"
                                 " (then layout='bshd')")


def check_window(window: Any) -> tuple[int | None, int | None]:
    """``window`` as ``(left, right)``, None for an unbounded side (None or negative given)."""
    try:
        left, right = window
        sides = tuple(None if s is None or int(s) < 0 else int(s) for s in (left, right))
    except (TypeError, ValueError):
        raise DispatchError(f"window must be (left, right) with ints or None, got {window!r}",
                            hint="None or -1 leaves a side unbounded: (128, 0) is a causal 128-token window"
                            ) from None
    return sides[0], sides[1]


def check_heads(hq: int, hkv: int, enable_gqa: bool) -> None:
    """Refuse Hq != Hkv when the caller turned GQA off (SDPA's ``enable_gqa=False``)."""
    if hq != hkv and not enable_gqa:
        raise DispatchError(f"Hq={hq} != Hkv={hkv} with enable_gqa=False",
                            hint="pass enable_gqa=True (the default) for grouped-query attention")


def check_mask(mask: Any, q: Any, k: Any) -> None:
    """Refuse a mask that is not bool/float or does not broadcast to ``[B, Hq, Sq, Sk]`` on q's device."""
    if not isinstance(mask, torch.Tensor) or not (mask.dtype == torch.bool or mask.is_floating_point()):
        raise DispatchError("attn_mask must be a bool or floating-point tensor",
                            cause=f"got {getattr(mask, 'dtype', type(mask).__name__)}")
    full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    dims = tuple(mask.shape)
    fits = len(dims) <= 4 and all(m in (1, f) for m, f in zip(dims[::-1], full[::-1], strict=False))
    if not fits or mask.device != q.device:
        raise DispatchError(f"attn_mask {tuple(mask.shape)} on {mask.device} does not broadcast to"
                            f" [B, Hq, Sq, Sk] = {list(full)} on {q.device}",
                            hint="masks are [B or 1, Hq or 1, Sq or 1, Sk], in either layout")


def check_sinks(sinks: Any, q: Any) -> Any:
    """The ``[Hq]`` float sinks on q's device, or the error that says what they must be."""
    if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point() or tuple(sinks.shape) != (q.shape[1],):
        raise DispatchError(f"sinks must be a float tensor of shape [Hq] = [{q.shape[1]}]",
                            cause=f"got {getattr(sinks, 'shape', type(sinks).__name__)}")
    if sinks.device != q.device:
        raise DispatchError(f"sinks are on {sinks.device}, q on {q.device}")
    return sinks
