"""Adapters of the kernels that come from their own packages: SageAttention and xFormers (FlashAttention 2/3/4:
:mod:`attnforge.backends.flash`).

Each adapter has two entries. ``__call__`` takes ``[B, H, S, D]`` tensors (the :mod:`attnforge.backends.adapter`
convention); ``call_bshd`` takes and returns ``[B, S, H, D]``, the layout these kernels take natively, so the
dispatcher hands ``layout="bshd"`` inputs straight to the kernel. ``__call__`` passes transposed *views* to
``call_bshd`` and transposes the output view back: no copy either way, and at most one conversion per call.
The packages are imported on first use only. Kernel signatures: runtime-anchors.md §5.1 (FA2), §5.2 (FA3),
§5.3 (FA4), §5.4 (SageAttention, ``tensor_layout="NHD"``), §4 (xFormers, BMHK).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnforge.backends._base import AdapterBase, expand_kv, first

if TYPE_CHECKING:
    import torch


@dataclass(slots=True, kw_only=True)
class SageAdapter(AdapterBase):
    """SageAttention's ``sageattn`` (quantized; its capabilities limit causal to Sq == Sk and forbid grad)."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None) -> torch.Tensor:
        """Run ``sageattn(tensor_layout="HND")`` on ``[B, Hq, S, D]``; returns ``[B, Hq, S, D]``."""
        out = self.module().sageattn(q, k, v, tensor_layout="HND", is_causal=causal, sm_scale=scale)
        return first(out)  # type: ignore[no-any-return]

    def call_bshd(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                  scale: float | None) -> torch.Tensor:
        """Run ``sageattn(tensor_layout="NHD")`` on ``[B, S, Hq, D]``; returns ``[B, S, Hq, D]``."""
        out = self.module().sageattn(q, k, v, tensor_layout="NHD", is_causal=causal, sm_scale=scale)
        return first(out)  # type: ignore[no-any-return]


@dataclass(slots=True, kw_only=True)
class XformersAdapter(AdapterBase):
    """xFormers ``memory_efficient_attention`` (BMHK).

    Causal uses ``LowerTriangularMask`` when Sq == Sk and ``LowerTriangularFromBottomRightMask`` otherwise;
    GQA repeats K/V heads (xFormers' own 5-D GQA form is forward-only).
    """

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None) -> torch.Tensor:
        """Run the kernel on ``[B, Hq, Sq, D]`` / ``[B, Hkv, Sk, D]``; returns ``[B, Hq, Sq, D]``."""
        out = self.call_bshd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal,
                             scale=scale)
        return out.transpose(1, 2)

    def call_bshd(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                  scale: float | None) -> torch.Tensor:
        """Run the kernel on ``[B, Sq, Hq, D]`` / ``[B, Sk, Hkv, D]``; returns ``[B, Sq, Hq, D]``."""
        xops = self.module()
        k, v = expand_kv(k, v, q.shape[2], dim=2)
        bias = None
        if causal:
            from xformers.ops.fmha import attn_bias

            if q.shape[1] == k.shape[1]:
                bias = attn_bias.LowerTriangularMask()
            else:
                bias = attn_bias.LowerTriangularFromBottomRightMask()
        return xops.memory_efficient_attention(q, k, v, attn_bias=bias, scale=scale)  # type: ignore[no-any-return]
