"""The inputs of :func:`attnforge.attention`: the checks every call runs (kept cheap: they run on the hot path
the first time a signature is seen) and the error that names what is wrong.

Every argument is checked here, before any backend sees it (issue 31): an accepted call must never fail inside
a kernel, and a refused one raises :class:`~attnforge.errors.DispatchError` with a hint. Numbers may be Python or
numpy scalars (``numbers.Real`` / ``numbers.Integral``), never strings, bools or tensors; flags are bools.
"""

from __future__ import annotations

import math
import numbers
import operator
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from attnforge.backends._base import KeptPerMask, host_to_device, made_here
from attnforge.errors import DispatchError
from attnforge.types.floats import FLOAT32_MAX, normal_float32

#: the dtypes attention takes (docs/features.md); FlashAttention-3's float8 goes through its own backend only
FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


def check_layout_and_precision(layout: Any, precision: Any) -> None:
    """Refuse a ``layout`` other than ``"bhsd"``/``"bshd"`` and a ``precision`` other than ``"exact"``/
    ``"allow_quantized"`` (every call: :func:`validate` for dense and paged ones, the varlen path for packed ones,
    where the layout is moot but a wrong word is still a caller's mistake)."""
    if layout != "bhsd" and layout != "bshd":  # noqa: PLR1714 - a list is not hashable: `in` on a set would raise
        raise DispatchError(f"unknown layout {layout!r}", hint="use layout='bhsd' ([B, H, S, D]) or 'bshd'")
    if precision != "exact" and precision != "allow_quantized":  # noqa: PLR1714
        raise DispatchError(f"unknown precision {precision!r}", hint="use 'exact' or 'allow_quantized'")


def validate(q: Any, k: Any, v: Any, *, layout: str, precision: str,
             scale: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, k, v)`` as ``[B, H, S, D]`` views, or a :class:`DispatchError` naming the problem.

    Kept to integer and identity comparisons: it runs on every call (docs/dispatch-overhead.md).
    """
    if layout == "bshd":
        try:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        except (AttributeError, IndexError, RuntimeError, TypeError, ValueError):
            raise_for_input(q, k, v, layout)
    elif layout != "bhsd":
        check_layout_and_precision(layout, precision)
    if precision != "exact" and precision != "allow_quantized":  # noqa: PLR1714 - fast path
        check_layout_and_precision(layout, precision)
    try:
        b, hq, _, d = q.shape
        kb, hkv, sk, kd = k.shape
        vb, vh, vs, _ = v.shape
        dtype = q.dtype
        ok = (b == kb == vb and d == kd and hkv == vh and sk == vs and hkv > 0 and hq % hkv == 0
              and dtype is k.dtype and dtype is v.dtype and q.device == k.device and q.device == v.device
              and dtype in FLOATS and (scale is None or (isinstance(scale, float) and 0.0 < scale <= FLOAT32_MAX))
              and not (q.is_nested or k.is_nested or v.is_nested))  # a jagged one's shape unpacks (a nested int)
    except (AttributeError, RuntimeError, TypeError, ValueError):  # RuntimeError: a strided nested tensor's shape
        ok = False
    if not ok:
        raise_for_input(q, k, v, layout, scale)
    return q, k, v


def memory_layout(k: Any) -> str:
    """How a ``[B, H, S, D]`` tensor (or view) lies in memory: ``"bshd"`` when its sequence stride exceeds its head
    stride (a ``[B, S, H, D]`` tensor, or the ``transpose(1, 2)`` view of one that transformers' attention layers
    pass), else ``"bhsd"``; ``"bhsd"`` where the two cannot differ (one head or one position). Measurements are
    kept per layout (:class:`attnforge.records.BenchRecord`): a kernel reads the two at different speeds."""
    _, h, s, _ = k.shape
    return "bshd" if h > 1 and s > 1 and k.stride(2) > k.stride(1) else "bhsd"


def raise_for_input(q: Any, k: Any, v: Any, layout: str, scale: Any = None) -> None:
    """The slow path of :func:`validate`: find what is wrong with the inputs and say it (returns only when
    nothing is: a numpy or int scale that passes :func:`check_scale`)."""
    refuse_nested_or_packed(q, k, v, packed=isinstance(q, torch.Tensor))
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise DispatchError(f"{name} is a {type(t).__name__}, not a torch.Tensor",
                                hint="pass torch tensors: torch.as_tensor(x) (numpy arrays and lists are not"
                                     " converted, to keep copies and devices explicit)")
        if t.dim() != 4:
            raise DispatchError(f"{name} has {t.dim()} dimensions, expected 4",
                                hint=f"layout={layout!r} means [{', '.join(layout.upper())}]")
    where = f" (as [B, H, S, D]; layout={layout!r})"
    if k.shape[:3] != v.shape[:3]:
        raise DispatchError(f"k and v differ in shape: {tuple(k.shape)} vs {tuple(v.shape)}{where}",
                            hint="k and v need the same batch, heads and length (v's head dim may differ)")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise DispatchError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch or head dim{where}",
                            hint="q and k need the same batch and head dim D; check the layout argument")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise DispatchError(f"query heads Hq={q.shape[1]} is not a multiple of key/value heads"
                            f" Hkv={k.shape[1]}{where}", hint="GQA needs Hq % Hkv == 0")
    check_dtypes(q, k, v)
    if q.device != k.device or q.device != v.device:
        raise DispatchError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}",
                            hint="move them to one device: k.to(q.device), v.to(q.device)")
    check_scale(scale)


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


def refuse_non_strided(tensors: Mapping[str, Any]) -> None:
    """Raise the helpful error for a sparse (COO, CSR, ...) or MKL-DNN tensor among ``tensors`` (argument name ->
    value; anything else is passed over). Such a tensor passes :func:`validate` (its shape, dtype and device are a
    dense one's) and fails inside a kernel (``reshape is not implemented for sparse tensors``), so the dispatcher
    asks this only after a backend raised (:meth:`attnforge.dispatch.dispatcher.Dispatcher.serve`), never on the
    hot path. Nested tensors (``torch.jagged``) have their own error (:func:`refuse_nested_or_packed`)."""
    for name, t in tensors.items():
        layout = getattr(t, "layout", torch.strided)
        if layout is not torch.strided and isinstance(layout, torch.layout) and not getattr(t, "is_nested", False):
            raise DispatchError(f"{name} is a {str(layout).removeprefix('torch.')} tensor; attention() takes dense"
                                " (strided) tensors", hint=f"pass {name}.to_dense()")


def check_dtypes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Refuse q, k, v of different dtypes or of a dtype attention does not take (:data:`FLOATS`)."""
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise DispatchError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}",
                            hint="cast them to one dtype: k.to(q.dtype), v.to(q.dtype)")
    if q.dtype not in FLOATS:
        raise DispatchError(f"attention needs floating-point tensors (float16, bfloat16, float32, float64),"
                            f" got {q.dtype}",
                            hint="cast the inputs, e.g. q.float(); int8/fp8 kernels are chosen with"
                                 " precision='allow_quantized' on float16/bfloat16 inputs")


def _real(value: Any) -> float | None:
    """``value`` as a float when it is a Python or numpy real number (not a bool, a string or a tensor)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except OverflowError:  # an int past float's range (10**400): infinite, which every check refuses
        return math.inf if value > 0 else -math.inf  # type: ignore[operator] # an int, here


def _got(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:120]


def check_scale(scale: Any) -> float | None:
    """The softmax scale as a finite positive float, None for ``1/sqrt(D)``.

    Refuses inf and nan (they turn every output into NaN), a scale past float32's largest value (infinite in the
    float32 math of the kernels and of the exact fallback: every output NaN, silently, until a CPU fuzz found it on
    2026-12-03; :func:`check_softcap` has the same bound), zero and negative scales (no backend is verified for
    them), and what is not a number.
    """
    if scale is None:
        return None
    value = _real(scale)
    if value is None or not 0.0 < value <= FLOAT32_MAX:
        raise DispatchError(f"scale must be positive and finite in float32, got {_got(scale)}",
                            hint="pass a float such as 1 / math.sqrt(D), or None for 1/sqrt(D)")
    return value


def check_flag(name: str, value: Any) -> bool:
    """``value`` as a bool: a Python or numpy bool, nothing else (a string ``'False'`` is not False)."""
    if value is True or value is False:
        return value
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.bool_):
        return bool(value)
    raise DispatchError(f"{name} must be True or False, got {_got(value)}",
                        hint=f"pass {name}=True or {name}=False")


def check_dropout(dropout_p: Any) -> float:
    """``dropout_p`` as a float in [0, 1)."""
    p = _real(dropout_p)
    if p is None or not 0.0 <= p < 1.0:
        raise DispatchError(f"dropout_p must be a number in [0, 1), got {_got(dropout_p)}",
                            hint="pass a float in [0, 1), 0.0 in eval")
    return p


def check_softcap(softcap: Any) -> float | None:
    """``softcap`` as a positive float within float32's normal range, None when off (None or 0)."""
    if softcap is None:
        return None
    value = _real(softcap)
    if value is None or not (value == 0.0 or normal_float32(value)):
        raise DispatchError("softcap must be positive and a normal float32 number (1.2e-38 to 3.4e38; 0 or None: "
                            f"off), got {_got(softcap)}",
                            hint="pass a float such as 50.0 (Gemma 2), or None (or 0) to turn it off")
    return value or None


def check_softcap_scale(softcap: float | None, scale: float | None) -> None:
    """Refuse a softcap and a scale whose quotient ``scale / softcap`` is past float32's largest: every kernel (and
    the exact math without a gradient) multiplies the logits by that one factor in float32, where it is infinite and
    a logit of 0 became ``inf * 0 = NaN`` (whole rows NaN, silently: CPU fuzz, 2026-12-03). ``scale`` None is
    ``1/sqrt(D) <= 1``, which no checked softcap can push past it. Both as :func:`check_softcap` and
    :func:`check_scale` return them."""
    if softcap and scale is not None and scale / softcap > FLOAT32_MAX:
        raise DispatchError(f"scale / softcap = {scale / softcap:.3g} is past float32's largest (3.4e38): the kernels "
                            "multiply the logits by it in float32",
                            hint="a smaller scale or a larger softcap (Gemma 2: scale 1/sqrt(D), softcap 50.0)")


def check_window(window: Any) -> tuple[int | None, int | None]:
    """``window`` as ``(left, right)``, None for an unbounded side (None or -1 given).

    Sides are ints (numpy ints too) >= -1; a side larger than the sequences is made unbounded by
    :func:`bound_window` once the lengths are known (exact: it then hides no key).
    """
    hint = "None or -1 leaves a side unbounded: (128, 0) is a causal 128-token window"
    try:
        left, right = window
    except (TypeError, ValueError):
        raise DispatchError(f"window must be (left, right) with ints or None, got {window!r}"[:200],
                            hint=hint) from None
    sides: list[int | None] = []
    for side in (left, right):
        if side is None:
            sides.append(None)
            continue
        try:
            if isinstance(side, bool):
                raise TypeError
            n = operator.index(side)
        except TypeError:
            raise DispatchError(f"window must be (left, right) with ints or None, got {window!r}"[:200],
                                hint=hint) from None
        if n < -1:
            raise DispatchError(f"window sides must be >= -1, got {window!r}"[:200], hint=hint)
        sides.append(None if n == -1 else n)
    return sides[0], sides[1]


def bound_window(window: tuple[int | None, int | None], seqlen_q: int, seqlen_k: int) -> tuple[int | None, int | None]:
    """``window`` with each side of at least ``max(Sq, Sk)`` made unbounded (None).

    Exact under either alignment: query ``i`` is aligned to ``i'`` in ``[min(0, Sk - Sq), max(Sq, Sk) - 1]``, so a
    left side >= max(Sq, Sk) reaches below key 0 and a right side >= max(Sq, Sk) past key Sk - 1. Keeps
    ``window=(10**30, 0)`` from reaching a kernel's int32 (issue 31).
    """
    bound = max(seqlen_q, seqlen_k)
    left, right = (None if s is None or s >= bound else s for s in window)
    return left, right


def check_heads(hq: int, hkv: int, enable_gqa: bool) -> None:
    """Refuse Hq != Hkv when the caller turned GQA off (SDPA's ``enable_gqa=False``)."""
    if hq != hkv and not enable_gqa:
        raise DispatchError(f"Hq={hq} != Hkv={hkv} with enable_gqa=False",
                            hint="pass enable_gqa=True (the default) for grouped-query attention")


def check_mask(mask: Any, q: Any, k: Any) -> torch.Tensor:
    """The mask SDPA can take: bool/float, broadcastable to ``[B, Hq, Sq, Sk]`` on q's device.

    Returns :func:`mask_view` of it.
    """
    if getattr(mask, "is_nested", False):
        raise DispatchError("attn_mask is a nested tensor; attention() takes a dense mask",
                            hint="pad it (torch.nested.to_padded_tensor(mask, 0.0)) to [B or 1, Hq or 1, Sq or 1, Sk],"
                                 " or pass packed inputs with cu_seqlens instead of a mask")
    if not isinstance(mask, torch.Tensor) or not (mask.dtype == torch.bool or mask.dtype in FLOATS):
        # float8 too: no type promotion takes it (the exact math's mask + logits raised "Promotion for Float8 Types
        # is not supported" past validation, CPU fuzz 2026-12-03)
        raise DispatchError("attn_mask must be a bool or floating-point tensor (float16, bfloat16, float32 or "
                            "float64)",
                            cause=f"got {getattr(mask, 'dtype', type(mask).__name__)}",
                            hint="True = attend (bool) or an additive float mask (0 / -inf): mask.bool(), or "
                                 "mask.to(q.dtype)")
    full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    dims = tuple(mask.shape)
    fits = len(dims) <= 4 and all(m in (1, f) for m, f in zip(dims[::-1], full[::-1], strict=False))
    if not fits or mask.device != q.device:
        raise DispatchError(f"attn_mask {tuple(mask.shape)} on {mask.device} does not broadcast to"
                            f" [B, Hq, Sq, Sk] = {list(full)} on {q.device}",
                            hint="masks are [B or 1, Hq or 1, Sq or 1, Sk], in either layout")
    return mask_view(mask)


def mask_view(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` as backends get it: itself, or a view of at least two dimensions for a ``[Sk]`` or scalar mask
    (SDPA's kernels index the mask's ``-2`` dimension and raise on fewer, torch 2.13; the view broadcasts the same).
    """
    dims = mask.dim()
    return mask if dims >= 2 else mask.reshape((1,) * (2 - dims) + tuple(mask.shape))


def check_sinks(sinks: Any, q: Any) -> Any:
    """The ``[Hq]`` float sinks on q's device, or the error that says what they must be."""
    if (not isinstance(sinks, torch.Tensor) or sinks.is_nested or not sinks.is_floating_point()
            or tuple(sinks.shape) != (q.shape[1],)):
        raise DispatchError(f"sinks must be a float tensor of shape [Hq] = [{q.shape[1]}]",
                            cause="got a nested tensor" if getattr(sinks, "is_nested", False)
                            else f"got {getattr(sinks, 'shape', type(sinks).__name__)}",
                            hint="one logit per query head, e.g. torch.zeros(Hq)")
    if sinks.device != q.device:
        raise DispatchError(f"sinks are on {sinks.device}, q on {q.device}", hint="sinks.to(q.device)")
    return sinks


def check_index_tensor(name: str, t: Any, *, dims: int, device: Any, shape: str) -> torch.Tensor:
    """An int32 index tensor (offsets, page table, used lengths) of ``dims`` dimensions on ``device``."""
    if not isinstance(t, torch.Tensor) or t.dim() != dims or t.dtype != torch.int32:
        tensor = isinstance(t, torch.Tensor)
        got = f"{t.dtype} {tuple(t.shape)}" if tensor else type(t).__name__
        hint = (f"pass a {dims}-D tensor {shape}" if tensor and t.dtype == torch.int32
                else f"build it with dtype=torch.int32, or pass {name}.int()")
        raise DispatchError(f"{name} must be a {dims}-D int32 tensor {shape}", cause=f"got {got}", hint=hint)
    if t.device != device:
        raise DispatchError(f"{name} is on {t.device}, q on {device}", hint=f"{name}.to(q.device)")
    if t.layout is not torch.strided:  # read by the host before any kernel runs: refused here, not after a raise
        refuse_non_strided({name: t})
    return t


#: the checked facts of the last few self-attention offsets tensors (``cu_seqlens_q is cu_seqlens_k``), per tensor
#: object and version counter: a model passes one offsets tensor to every layer of a forward
_OFFSETS: KeptPerMask[tuple[Any, Any, int, int]] = KeptPerMask()


def check_offsets(cu_q: Any, cu_k: Any, *, rows_q: int, rows_k: int, device: Any) -> tuple[Any, Any, int, int]:
    """Check varlen offsets: int32 ``[batch + 1]`` each, on q's device, starting at 0, never decreasing, ending
    at the packed rows of q and k. Returns the per-sequence lengths and the longest of each (one device sync).

    Where one tensor is both offsets (self-attention), its facts are kept per tensor object and version counter
    (:class:`~attnforge.backends._base.KeptPerMask`: an in-place change or a new tensor is read again), so a model
    that passes one ``cu_seqlens`` to each of its layers syncs once per forward, not once per layer: each sync
    stops the host from running ahead of the device. Nothing is kept while ``torch.compile`` traces.
    """
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        check_index_tensor(name, cu, dims=1, device=device, shape="of offsets [batch + 1]")
    keep = cu_q is cu_k and not torch.compiler.is_compiling()
    params = (rows_q, rows_k)
    if keep:
        kept = _OFFSETS.get(cu_q, params)
        if kept is not None:
            return kept
    facts = _read_offsets(cu_q, cu_k, rows_q=rows_q, rows_k=rows_k)
    if keep:
        _OFFSETS.put(cu_q, params, facts)
    return facts


def keep_offsets(cu: Any, *, rows: int, longest: int) -> None:
    """Keep the facts of self-attention offsets ``cu`` (int32 ``[n + 1]`` on the device, over ``rows`` packed rows,
    its longest sequence ``longest``) that attnforge made from values the host holds (``cu`` is marked its own:
    :func:`~attnforge.backends._base.made_here`, kept under ``torch.inference_mode`` too), as :func:`check_offsets`
    keeps what it reads: its first call with ``cu`` as both offsets then reads nothing back (no device sync).
    Nothing is kept while ``torch.compile`` traces."""
    if torch.compiler.is_compiling():
        return
    lens = cu[1:] - cu[:-1]
    _OFFSETS.put(made_here(cu), (rows, rows), (lens, lens, longest, longest))


def _read_offsets(cu_q: Any, cu_k: Any, *, rows_q: int, rows_k: int) -> tuple[Any, Any, int, int]:
    """:func:`check_offsets`'s reading of the values (the one device sync)."""
    if cu_q.numel() != cu_k.numel() or cu_q.numel() < 1:
        raise DispatchError("cu_seqlens_q and cu_seqlens_k must have the same length batch + 1",
                            cause=f"got {cu_q.numel()} and {cu_k.numel()}",
                            hint="one offset per sequence start plus the end: [0, len_0, len_0 + len_1, ...]")
    lens_q, lens_k = (cu[1:] - cu[:-1] for cu in (cu_q, cu_k))
    parts = [cu_q[0], cu_q[-1], cu_k[0], cu_k[-1]]
    if lens_q.numel():
        parts += [lens_q.min(), lens_k.min(), lens_q.max(), lens_k.max()]
    facts = torch.stack(parts).tolist()
    first_q, last_q, first_k, last_k = facts[:4]
    min_q, min_k, max_q, max_k = facts[4:] or (0, 0, 0, 0)
    if (first_q, first_k, last_q, last_k) != (0, 0, rows_q, rows_k) or min_q < 0 or min_k < 0:
        raise DispatchError("cu_seqlens do not describe the packed tensors",
                            cause=f"q has {rows_q} rows, k {rows_k}; offsets run {first_q}..{last_q} and"
                                  f" {first_k}..{last_k}{'' if min(min_q, min_k) >= 0 else ', and decrease'}",
                            hint="offsets start at 0, never decrease and end at the packed length")
    return lens_q, lens_k, max_q, max_k


def check_max_seqlen(name: str, given: Any, longest: int, rows: int) -> int:
    """``max_seqlen_*``: None (the longest sequence), or an int at least the longest sequence; a value past the
    packed rows is lowered to them (exact: no sequence is longer, and no kernel sees a value past int32)."""
    if given is None:
        return longest
    try:
        if isinstance(given, bool):
            raise TypeError
        n = operator.index(given)
    except TypeError:
        raise DispatchError(f"{name} must be an int, got {_got(given)}",
                            hint=f"pass None to let attnforge compute it, or int({name})") from None
    if n < longest:
        raise DispatchError(f"{name}={n} is less than the longest sequence ({longest})",
                            hint=f"pass None to let attnforge compute it, or the true maximum of the lengths"
                                 f" in cu_seqlens{name.removeprefix('max_seqlen')}")
    return min(n, rows)


@dataclass(frozen=True, slots=True)
class PrefillSequences:
    """A left-padded batch's ``[B, S]`` tokens as varlen sequences: each row's run of real tokens, and the run of
    padding before it, is one sequence (``cu_seqlens``, int32 ``[n + 1]`` on the device, over the ``B * S`` rows of
    ``[B, S, H, D]`` tensors). Under the causal mask a left padding's query rows see no key (every key before them
    is padding); here the padding run attends to itself only, and its rows are zeroed after the call (``hidden``,
    ``[B, S, 1, 1]`` bool, None where no row is padded; ``hidden_rows``, int64 ``[n]`` on the device: the same rows'
    indices among the ``B * S``, for zeroing them alone in place), as the exact math gives a row that sees no key.
    Right padding is not taken: its padding rows see the row's real keys under the causal mask, which no sequence of
    contiguous keys gives."""

    cu_seqlens: Any
    longest: int
    longest_real: int
    hidden: Any
    hidden_rows: Any


def prefill_sequences(padding: Any) -> PrefillSequences | None:
    """The varlen sequences of a ``[B, S]`` bool padding mask (True: a real token; :class:`PrefillSequences`), or None
    where a row's real tokens are not one run that ends the row (left padding, or none). One copy of the mask to the
    host (the one sync); the offsets and the padding rows go up in one copy queued without a sync
    (:func:`~attnforge.backends._base.host_to_device`), and the offsets' facts are kept (:func:`keep_offsets`), so
    the varlen call reads nothing back. The one rule for the transformers integration's padded prefill and for
    ``attnforge warmup``, which calls that varlen route ahead of time."""
    import numpy as np
    import torch

    rows = padding.detach().cpu().numpy()
    b, s = rows.shape
    if b * s >= 2**31:
        return None
    counts = rows.sum(axis=1)
    first = rows.argmax(axis=1)
    last = s - 1 - rows[:, ::-1].argmax(axis=1)
    real = counts > 0
    if np.any(real & ((last - first + 1 != counts) | (last != s - 1))):
        return None
    starts = np.arange(b) * s
    bounds = np.unique(np.concatenate([starts, starts[real] + first[real], [b * s]]))
    padded = not bool(counts.min() == s)
    hidden_at = np.flatnonzero(~rows.reshape(-1).astype(bool)) if padded else np.zeros(0, dtype=np.int64)
    # the offsets and the padding rows' indices in one copy up, queued without a sync (host_to_device)
    both = host_to_device(np.concatenate([bounds, hidden_at]).astype(np.int64), padding.device)
    cu = both[: len(bounds)].to(torch.int32)
    longest = int(np.diff(bounds).max())
    keep_offsets(cu, rows=b * s, longest=longest)  # what check_offsets would read back: known here
    hidden = hidden_rows = None
    if padded:
        hidden = (~padding)[:, :, None, None]
        hidden_rows = both[len(bounds):]
    return PrefillSequences(cu_seqlens=cu, longest=longest, longest_real=int(counts.max()),
                            hidden=hidden, hidden_rows=hidden_rows)
