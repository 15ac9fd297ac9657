"""``patch_sdpa()``: route ``torch.nn.functional.scaled_dot_product_attention`` calls through the dispatcher.

The pattern people use today to force SageAttention into code they do not own, made safe: every call is served
with SDPA's exact semantics (``attn_mask``, ``dropout_p``, top-left ``is_causal``, ``scale``, ``enable_gqa``,
which :func:`attnforge.attention` all speaks), and these reach the original function untouched:

- calls inside a ``torch.nn.attention.sdpa_kernel([...])`` context that leaves out any SDPA kernel (the
  user chose the kernel; attnforge does not override that choice);
- calls that are not 4-D ``[B, H, S, D]`` floating-point tensors of one dtype and device, that SDPA itself
  would refuse (``attn_mask`` with ``is_causal``, Hq != Hkv without ``enable_gqa``), or nested tensors.

Code that bound the function before patching (``from torch.nn.functional import
scaled_dot_product_attention``) keeps the original.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from attnforge.backends import sdpa_original
from attnforge.backends.sdpa_original import original_sdpa

_LOCK = threading.Lock()

__all__ = ["SdpaPatch", "original_sdpa", "patch_sdpa"]


def _servable(query: Any, key: Any, value: Any, *, attn_mask: Any, is_causal: bool, enable_gqa: bool,
              scale: Any = None, dropout_p: Any = 0.0) -> bool:
    import torch

    from attnforge.dispatch.inputs import FLOATS, check_dropout, check_flag, check_scale
    from attnforge.errors import DispatchError

    if attn_mask is not None and is_causal:
        return False  # SDPA raises for this; let it
    try:  # arguments SDPA takes and attention() refuses (a scale <= 0 or inf, dropout_p=1): SDPA's own answer
        check_scale(scale)
        check_dropout(dropout_p)
        check_flag("is_causal", is_causal)
    except DispatchError:
        return False
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 and not t.is_nested for t in (query, key, value)):
        return False
    if key.shape[:3] != value.shape[:3] or query.shape[0] != key.shape[0] or query.shape[3] != key.shape[3]:
        return False
    if query.dtype not in FLOATS or not query.dtype == key.dtype == value.dtype:
        return False
    if not query.device == key.device == value.device:
        return False
    hq, hkv = query.shape[1], key.shape[1]
    return hq == hkv or (enable_gqa and hkv > 0 and hq % hkv == 0)


def _routed(  # noqa: PLR0917 - the signature of F.scaled_dot_product_attention
    query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
            is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
    if not sdpa_original.kernels_restricted() and _servable(query, key, value, attn_mask=attn_mask,
                                                            is_causal=is_causal, enable_gqa=enable_gqa,
                                                            scale=scale, dropout_p=dropout_p):
        from attnforge.dispatch.runtime import attention

        if attn_mask is None and not dropout_p and (not is_causal or query.shape[2] == key.shape[2]):
            return attention(query, key, value, causal=is_causal, scale=scale)  # the fast path
        return attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, causal=is_causal,
                         causal_alignment="top_left", scale=scale)
    return original_sdpa()(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                           scale=scale, enable_gqa=enable_gqa)


class SdpaPatch:
    """An installed patch; :meth:`restore` (or leaving the ``with`` block) ends it (see :func:`patch_sdpa`)."""

    def __init__(self, replaced: Callable[..., Any]) -> None:
        self.replaced = replaced
        self.active = True

    def restore(self) -> None:
        """End this patch (idempotent). The last active patch to end puts back the original function; a patch
        ended while later ones are active leaves the routing in place for them, whatever the order the patches
        end in (two threads' ``with patch_sdpa():`` blocks overlap in any order). Restored in reverse order, a
        patch also puts back a function another library installed over an earlier patch."""
        import torch.nn.functional as F  # noqa: N812 - the name everyone uses

        with _LOCK:
            if not self.active:
                return
            self.active = False
            last = bool(_ACTIVE) and _ACTIVE[-1] is self
            _ACTIVE.remove(self)
            current = F.scaled_dot_product_attention
            if not _ACTIVE:
                original = original_sdpa()
                if current is _routed:
                    F.scaled_dot_product_attention = original
                    sdpa_original.release(original)
                # else another library installed its function over ours (and may call it): the original stays
                # held, so the routing it reaches ends in the original, never back in itself
            elif last and current is _routed and self.replaced is not _routed:
                F.scaled_dot_product_attention = self.replaced  # another library's function, over an earlier patch

    def __enter__(self) -> SdpaPatch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.restore()


#: the patches installed and not yet restored, oldest first (under ``_LOCK``)
_ACTIVE: list[SdpaPatch] = []


def patch_sdpa() -> SdpaPatch:
    """Route servable ``F.scaled_dot_product_attention`` calls through :func:`attnforge.attention`.

    Use as a function (``p = patch_sdpa()`` ... ``p.restore()``) or a context manager
    (``with patch_sdpa(): model(x)``). Process-wide, not per thread: every thread sees the patched function while
    any patch is installed. Patches nest and may end in any order (two threads' blocks overlapping): SDPA is
    routed while one is active, and the original is back once the last one ends.

    Returns:
        The installed :class:`SdpaPatch`.
    """
    import torch.nn.functional as F  # noqa: N812 - the name everyone uses

    with _LOCK:
        current = F.scaled_dot_product_attention
        if not _ACTIVE and current is not _routed:
            sdpa_original.hold(current)
        F.scaled_dot_product_attention = _routed
        patch = SdpaPatch(current)
        _ACTIVE.append(patch)
    return patch
