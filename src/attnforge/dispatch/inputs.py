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
    from attnforge.dispatch.features import refuse_nested_or_packed

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
