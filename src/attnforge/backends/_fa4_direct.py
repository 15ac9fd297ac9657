"""FlashAttention-4's forward called without its autograd layer, as vLLM calls it, for calls that need no gradient.

``flash_attn.cute.flash_attn_func`` runs ``FlashAttnFunc.apply``, whose forward calls
``flash_attn.cute.interface._flash_attn_fwd`` (input checks, the compile key, the compiled-kernel cache, the
TVM-FFI call). When no gradient is needed the autograd node does nothing but cost host time, so the bound route
calls ``_flash_attn_fwd`` itself with exactly the keywords ``FlashAttnFunc.forward`` passes it (vLLM:
``vllm/vllm_flash_attn/flash_attn_interface.py`` imports ``_flash_attn_fwd`` from the CuTe interface and calls
it directly; shared/research/levers-2026-11-26.md §1). Calls that need a gradient keep the public function.

Not done here: calling the compiled TVM-FFI function out of ``_flash_attn_fwd.compile_cache`` with recorded
static arguments. On sm_100 ``_flash_attn_fwd`` allocates and zeroes per-call scheduler buffers
(``tile_count_semaphore``, ``num_splits_dynamic``) before the kernel, so replaying recorded arguments is not
faithful without reproducing that code; it stays inside ``_flash_attn_fwd``.

Mirrored: the flash-attn-4 4.0.0b36 wheel (PyPI), ``flash_attn/cute/interface.py`` lines 3780-3840
(``FlashAttnFunc.forward``: the keywords of its ``_flash_attn_fwd`` call at lines 3816-3837, and the MLA rewrite
``k is v and D == 512`` before it), line 678 (``_flash_attn_fwd``'s signature; it returns
``(out, lse, p, row_max, o_lo)``) and lines 4145-4210 (``flash_attn_func`` -> ``FlashAttnFunc.apply``). Pinned to
:data:`VERSIONS`; another installed version keeps the public function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: the flash-attn-4 versions whose ``interface.py`` the mapping below was read from
VERSIONS = frozenset({"4.0.0b36"})
#: the module that defines ``_flash_attn_fwd``
INTERFACE = "flash_attn.cute.interface"
#: FlashAttnFunc.forward treats ``k is v`` with this V head dim as MLA (line 3810): never bound directly
MLA_HEAD_DIM = 512


def forward_keywords(*, scale: float | None, causal: bool) -> dict[str, Any]:
    """The keywords ``FlashAttnFunc.forward`` passes ``_flash_attn_fwd`` for ``flash_attn_func(q, k, v,
    softmax_scale=scale, causal=causal)`` (interface.py:3816-3837 @4.0.0b36, every other argument at
    ``flash_attn_func``'s default; the scale stays None when None: ``_flash_attn_fwd`` defaults it)."""
    return {"qv": None, "softmax_scale": scale, "causal": causal, "window_size_left": None,
            "window_size_right": None, "learnable_sink": None, "softcap": 0.0, "num_splits": 1, "pack_gqa": None,
            "score_mod": None, "mask_mod": None, "aux_tensors": None, "aux_scalars": None,
            "block_sparse_tensors": None, "return_lse": False, "gather_kv_indices": None,
            "gather_bwd_recompute_p": False}


def bind(fwd: Callable[..., Any], *, scale: float | None, causal: bool, bshd: bool) -> Callable[..., Any]:
    """``fn(q, k, v)`` calling ``_flash_attn_fwd`` directly, for a call that needs no gradient.

    Args:
        fwd: ``flash_attn.cute.interface._flash_attn_fwd`` of a version in :data:`VERSIONS`.
        scale: softmax scale or None (``1/sqrt(D)``).
        causal: bottom-right causal.
        bshd: the caller's tensors are ``[B, S, H, D]``; else ``[B, H, S, D]``, handed over as
            ``transpose(1, 2)`` views, and the ``[B, Sq, Hq, Dv]`` output returned as a view the same way.

    Returns:
        The bound call; fp16/bf16 CUDA tensors in, the output in q's dtype and the caller's layout.
    """
    keywords = forward_keywords(scale=scale, causal=causal)
    if bshd:
        def forward_bshd(q: Any, k: Any, v: Any) -> Any:
            return fwd(q, k, v, **keywords)[0]

        return forward_bshd

    def forward_bhsd(q: Any, k: Any, v: Any) -> Any:
        return fwd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **keywords)[0].transpose(1, 2)

    return forward_bhsd
