"""FlashAttention-2's native functions called directly: the route of a bound FA2 call without the public entry.

``flash_attn.flash_attn_func`` runs ``FlashAttnFunc.apply``, then (torch >= 2.4) the Python ``custom_op``
``flash_attn::_flash_attn_forward``, then ``flash_attn_2_cuda.fwd``. The bound route calls ``flash_attn_2_cuda.fwd``
positionally with the arguments ``FlashAttnFunc.forward`` passes (prepared once per bound signature), inside one
``torch.autograd.Function`` whose backward calls ``flash_attn_2_cuda.bwd`` positionally, or with no autograd at
all when no gradient is needed (TGI and vLLM call ``flash_attn_2_cuda`` / their FA2 ops the same way;
docs/research/levers-2026-11-26.md §1).

Mirrored: flash-attention v2.8.3 ``flash_attn/flash_attn_interface.py`` lines 76-106 (``_flash_attn_forward``:
``maybe_contiguous``, ``fwd(q, k, v, None, alibi_slopes, dropout_p, softmax_scale, causal, window_size_left,
window_size_right, softcap, return_softmax, None)`` -> ``(out, softmax_lse, S_dmask, rng_state)``), 237-286
(``_flash_attn_backward``: ``bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, alibi_slopes, dropout_p,
softmax_scale, causal, window_size_left, window_size_right, softcap, deterministic, None, rng_state)``), 807-890
(``FlashAttnFunc``: scale ``D ** -0.5``, head dims not a multiple of 8 padded, ``return_softmax`` only with
dropout, ``dq, dk, dv = empty_like``) and 1135 (``flash_attn_func``'s defaults). The file is identical in
v2.8.3.post1 (git) and the 2.8.3.post2 sdist on PyPI. Pinned to :data:`VERSIONS`; a head dim that FA2 would pad
(D % 8 != 0) keeps the public function too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from attnforge.backends.bound import differentiable, other_layout

#: the flash-attn versions whose ``flash_attn_interface.py`` the mapping below was read from
VERSIONS = frozenset({"2.8.3", "2.8.3.post1", "2.8.3.post2"})
#: the native module holding ``fwd`` and ``bwd``
NATIVE = "flash_attn_2_cuda"
#: ``FlashAttnFunc.forward`` pads head dims that are not a multiple of this (line 830)
HEAD_DIM_MULTIPLE = 8


def forward_tail(*, scale: float, causal: bool) -> tuple[Any, ...]:
    """The 10 positional arguments of ``fwd`` after ``q, k, v`` for ``flash_attn_func(q, k, v,
    softmax_scale=scale, causal=causal)`` (no dropout, window, softcap, ALiBi; ``return_softmax`` False)."""
    return (None, None, 0.0, scale, causal, -1, -1, 0.0, False, None)  # out, alibi, dropout ... , generator


def backward_tail(*, scale: float, causal: bool) -> tuple[Any, ...]:
    """The arguments of ``bwd`` between ``dv`` and ``rng_state``: ALiBi, dropout, scale, causal, window,
    softcap, ``deterministic=False``, generator."""
    return (None, 0.0, scale, causal, -1, -1, 0.0, False, None)


def _lastdim(t: torch.Tensor) -> torch.Tensor:
    """``maybe_contiguous`` (flash_attn_interface.py:19)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def bind(native: Any, *, scale: float, causal: bool, bshd: bool, needs_grad: bool) -> Callable[..., torch.Tensor]:
    """``fn(q, k, v)`` on the caller's tensors in their layout, calling ``flash_attn_2_cuda`` directly.

    Args:
        native: the imported ``flash_attn_2_cuda`` of a version in :data:`VERSIONS`.
        scale: the softmax scale (``D ** -0.5`` when the caller gave none).
        causal: bottom-right causal.
        bshd: the caller's tensors are ``[B, S, H, D]``; else ``[B, H, S, D]`` (``transpose(1, 2)`` views both
            ways).
        needs_grad: one autograd node around ``fwd`` and ``bwd`` (:func:`attnforge.backends.bound.differentiable`;
            else no autograd at all).

    Returns:
        The bound call on fp16/bf16 CUDA tensors with ``D % 8 == 0``; the output in q's dtype and layout.
    """
    tail = forward_tail(scale=scale, causal=causal)
    fwd = native.fwd
    if needs_grad:
        grad_tail = backward_tail(scale=scale, causal=causal)

        def forward(q: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
            q, k, v = _lastdim(q), _lastdim(k), _lastdim(v)
            out, lse, _, rng_state = fwd(q, k, v, *tail)
            return out, (q, k, v, out, lse, rng_state)

        def backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,  # noqa: PLR0917 - saved tensors
                     out: torch.Tensor, lse: torch.Tensor, rng_state: torch.Tensor) -> tuple[torch.Tensor, ...]:
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            native.bwd(_lastdim(dout), q, k, v, _lastdim(out), lse, dq, dk, dv, *grad_tail, rng_state)
            return dq, dk, dv

        return differentiable(forward, backward, bshd=bshd)

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return fwd(_lastdim(q), _lastdim(k), _lastdim(v), *tail)[0]  # type: ignore[no-any-return]
    return run if bshd else other_layout(run)
