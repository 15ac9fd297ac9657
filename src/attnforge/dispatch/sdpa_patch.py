"""``patch_sdpa()``: route ``torch.nn.functional.scaled_dot_product_attention`` calls through the dispatcher.

The pattern people use today to force SageAttention into code they do not own, made safe: only calls the
dispatcher can serve exactly are routed; every other call reaches the original function untouched.

A call is routed when it has 4-D ``[B, H, S, D]`` floating-point tensors of one dtype and device, no
``attn_mask``, ``dropout_p == 0``, equal K/V shapes and head dims, heads that match (or are a GQA multiple
with ``enable_gqa=True``), and ``is_causal`` only with Sq == Sk (SDPA's ``is_causal`` is top-left aligned,
attnforge's bottom-right: they agree only for square masks). Code that bound the function before patching
(``from torch.nn.functional import scaled_dot_product_attention``) keeps the original.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

_LOCK = threading.Lock()
_TRUE_ORIGINAL: Callable[..., Any] | None = None


def original_sdpa() -> Callable[..., Any]:
    """The unpatched SDPA function (what attnforge's own SDPA adapters call, so routing never recurses)."""
    if _TRUE_ORIGINAL is not None:
        return _TRUE_ORIGINAL
    import torch.nn.functional as F  # noqa: N812 - the name everyone uses

    return F.scaled_dot_product_attention


def _servable(query: Any, key: Any, value: Any, *, attn_mask: Any, dropout_p: float, is_causal: bool,
              enable_gqa: bool) -> bool:
    import torch

    if attn_mask is not None or dropout_p != 0.0:
        return False
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (query, key, value)):
        return False
    if key.shape != value.shape or query.shape[0] != key.shape[0] or query.shape[3] != key.shape[3]:
        return False
    if not query.is_floating_point() or not query.dtype == key.dtype == value.dtype:
        return False
    if not query.device == key.device == value.device:
        return False
    hq, hkv = query.shape[1], key.shape[1]
    if hq != hkv and not (enable_gqa and hkv > 0 and hq % hkv == 0):
        return False
    return not (is_causal and query.shape[2] != key.shape[2])


def _routed(  # noqa: PLR0917 - the signature of F.scaled_dot_product_attention
    query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
            is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
    if _servable(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                 enable_gqa=enable_gqa):
        from attnforge.dispatch.runtime import attention

        return attention(query, key, value, causal=is_causal, scale=scale)
    return original_sdpa()(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                           scale=scale, enable_gqa=enable_gqa)


class SdpaPatch:
    """An installed patch; :meth:`restore` (or leaving the ``with`` block) puts back what it replaced."""

    def __init__(self, replaced: Callable[..., Any]) -> None:
        self.replaced = replaced
        self.active = True

    def restore(self) -> None:
        """Put back the function this patch replaced (idempotent)."""
        global _TRUE_ORIGINAL  # noqa: PLW0603 - the patch is process-wide by nature
        import torch.nn.functional as F  # noqa: N812 - the name everyone uses

        with _LOCK:
            if not self.active:
                return
            F.scaled_dot_product_attention = self.replaced
            self.active = False
            if self.replaced is _TRUE_ORIGINAL:
                _TRUE_ORIGINAL = None

    def __enter__(self) -> SdpaPatch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.restore()


def patch_sdpa() -> SdpaPatch:
    """Route servable ``F.scaled_dot_product_attention`` calls through :func:`attnforge.attention`.

    Use as a function (``p = patch_sdpa()`` ... ``p.restore()``) or a context manager
    (``with patch_sdpa(): model(x)``). Patches nest; restore them in reverse order. Process-wide, not per
    thread: every thread sees the patched function while it is installed.

    Returns:
        The installed :class:`SdpaPatch`.
    """
    global _TRUE_ORIGINAL  # noqa: PLW0603 - see SdpaPatch.restore
    import torch.nn.functional as F  # noqa: N812 - the name everyone uses

    with _LOCK:
        current = F.scaled_dot_product_attention
        if _TRUE_ORIGINAL is None:
            _TRUE_ORIGINAL = current
        F.scaled_dot_product_attention = _routed
    return SdpaPatch(current)
