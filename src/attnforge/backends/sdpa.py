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

from attnforge.backends._base import AdapterBase, bottom_right_mask, expand_kv
from attnforge.backends.capabilities import GqaMode
from attnforge.backends.exact import visible_keys
from attnforge.backends.sdpa_original import original_sdpa

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
    """The last caller mask the adapter prepared for SDPA: the mask with the rows that see no key opened, and
    those rows (``[B or 1, H or 1, Sq, 1]`` bool). A model passes one mask object to every layer (transformers
    builds it once per forward), so the pass over all ``B x Sq x Sk`` entries runs once per forward, not once
    per layer. An entry is found only for the same mask object (a weak reference: a new mask never matches a
    dead one's entry, and the entry is dropped with the caller's mask), at the same version counter (an in-place
    change misses) and with the same preparation parameters; masks that require grad are never kept."""

    __slots__ = ("_entry",)

    def __init__(self) -> None:
        self._entry: tuple[Any, ...] | None = None

    def get(self, mask: torch.Tensor, params: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor] | None:
        entry = self._entry
        if entry is not None and entry[0]() is mask and entry[1] == mask._version and entry[2] == params:
            return entry[3]  # type: ignore[no-any-return]
        return None

    def put(self, mask: torch.Tensor, params: tuple[Any, ...], value: tuple[torch.Tensor, torch.Tensor]) -> None:
        self._entry = (weakref.ref(mask, self._drop), mask._version, params, value)

    def _drop(self, ref: weakref.ref[Any]) -> None:
        """The caller's mask is gone: free what was derived from it (unless a newer mask took the entry)."""
        entry = self._entry
        if entry is not None and entry[0] is ref:
            self._entry = None


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
                return sdpa(q, k, v, scale=scale)
            with _force(self.kernel):
                return sdpa(q, k, v, scale=scale)
        kwargs: dict[str, Any] = {}
        if q.shape[1] != k.shape[1]:
            if self.caps.gqa is GqaMode.NATIVE:
                kwargs["enable_gqa"] = True
            else:
                k, v = expand_kv(k, v, q.shape[1])
        empty = None
        if causal:
            if q.shape[2] == k.shape[2]:
                kwargs["is_causal"] = True
            else:
                kwargs["attn_mask"], empty = bottom_right_mask(q.shape[2], k.shape[2], q.device)
        if self.kernel is None:
            out = sdpa(q, k, v, scale=scale, **kwargs)
        else:
            with _force(self.kernel):
                out = sdpa(q, k, v, scale=scale, **kwargs)
        if empty is not None:
            out = out.masked_fill(empty, 0.0)
        return out


    def bind(self, call: AttentionCall, *, scale: float | None, bshd: bool) -> Callable[..., torch.Tensor] | None:
        """The plain call as SDPA itself, for a route (:func:`attnforge.backends.bound.bound_call`): a
        ``functools.partial`` of the unpatched SDPA taking ``(q, k, v)`` ``[B, H, S, D]``, so nothing of the
        adapter runs per call. Only unforced SDPA on bhsd tensors whose causal mask SDPA's ``is_causal`` gives
        (Sq == Sk) and whose heads need no repeat; None otherwise (``__call__`` serves)."""
        if self.kernel is not None or bshd or (call.causal and call.seqlen_q != call.seqlen_k):
            return None
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
        empty = None
        if attn_mask is None and window is None and causal and top_left:
            kwargs["is_causal"] = True  # SDPA's own top-left causal
        else:
            params = (sq, sk, causal, top_left, window, q.dtype, q.device)
            keep = (attn_mask is not None and not attn_mask.requires_grad and not torch.compiler.is_compiling()
                    and not (q.device.type == "cpu" and _safe_softmax_on_cpu()))
            opened = _OPENED.get(attn_mask, params) if keep else None
            if opened is None:
                mask, empty = self._sdpa_mask(attn_mask, q, sq=sq, sk=sk, causal=causal, top_left=top_left,
                                              window=window)
                if keep and empty is not None:
                    _OPENED.put(attn_mask, params, (mask, empty))
            else:
                mask, empty = opened
            kwargs["attn_mask"] = mask
        packed = pack_decode_gqa(q, k, kwargs) if kwargs.get("enable_gqa") else None
        if packed is not None:  # one query row per head: the group's rows share their K/V head (HF's pack_gqa)
            q = packed
        if self.kernel is None:
            out = sdpa(q, k, v, **kwargs)
        else:
            with _force(self.kernel):
                out = sdpa(q, k, v, **kwargs)
        if packed is not None:
            out = out.reshape(out.shape[0], -1, 1, out.shape[3])
        return out if empty is None else out.masked_fill(empty, 0.0)

    @staticmethod
    def _sdpa_mask(attn_mask: Any, q: torch.Tensor, *, sq: int, sk: int, causal: bool, top_left: bool,
                   window: Any) -> tuple[Any, Any]:
        """The one ``attn_mask`` SDPA gets for the caller's mask, causal alignment and window, and the rows that
        see no key (None where SDPA itself returns zeros for them: CPU since torch 2.5)."""
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
        empty = None
        if mask is not None and not (q.device.type == "cpu" and _safe_softmax_on_cpu()):
            # rows that see no key are opened to every key (no NaN in softmax or its gradient) and zeroed
            seen = mask if mask.dtype == torch.bool else mask > float("-inf")
            empty = ~seen.any(dim=-1, keepdim=True)
            mask = mask | empty if mask.dtype == torch.bool else mask.masked_fill(empty, 0.0)
        return mask, empty


def pack_decode_gqa(q: torch.Tensor, k: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor | None:
    """A one-row GQA call (decode: ``q [B, Hq, 1, D]``, ``k [B, Hkv, Sk, D]``) as ``q [B, Hkv, Hq/Hkv, D]``: each
    K/V head's query heads become its rows, so SDPA runs on Hkv heads with no ``enable_gqa`` and no repeated K/V.
    Exact: every row still sees the same keys (the ``attn_mask`` in ``kwargs``, whose query dimension is 1, is
    reshaped the same way when it has Hq heads; ``enable_gqa`` is dropped from ``kwargs``). None (``kwargs``
    untouched) when the call has more than one row or a causal flag.

    Why: transformers' SDPA function does the same for decode with a padding mask (``pack_gqa``,
    transformers/integrations/sdpa_attention.py, 5.23); SDPA's kernels take a mask with ``enable_gqa`` on another
    path, and a padded Llama-3-8B-shaped ``generate`` decoded 0.77x the default's tokens/s through it (H200,
    docs/benchmarks.md 2026-11-27)."""
    if q.shape[2] != 1 or kwargs.get("is_causal"):
        return None
    b, hq, _, d = q.shape
    hkv = k.shape[1]
    mask = kwargs.get("attn_mask")
    if mask is not None and mask.dim() >= 3 and mask.shape[-3] != 1:
        kwargs["attn_mask"] = mask.reshape(*mask.shape[:-3], hkv, hq // hkv, mask.shape[-1])
    del kwargs["enable_gqa"]
    return q.reshape(b, hkv, hq // hkv, d)


def _force(kernel: str) -> Any:
    """``sdpa_kernel([SDPBackend.<kernel>])``: only that SDPA kernel may run inside the context."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, kernel)])
