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

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnforge.backends._base import AdapterBase, expand_kv, first

if TYPE_CHECKING:
    import torch

    from attnforge.backends.adapter import AttentionCall

#: SageAttention versions whose ``sageattn`` the table below was read from
SAGE_DIRECT_VERSIONS = frozenset({"2.2.0"})
#: the kernel function ``sageattn`` picks per compute capability, and the keywords it adds: thu-ml/SageAttention
#: @d1a57a5 (2026-01-17, setup.py version 2.2.0) sageattention/core.py lines 143-157
SAGE_BY_ARCH: dict[tuple[int, int], tuple[str, dict[str, str]]] = {
    (8, 0): ("sageattn_qk_int8_pv_fp16_cuda", {"pv_accum_dtype": "fp32"}),
    (8, 6): ("sageattn_qk_int8_pv_fp16_triton", {}),
    (8, 9): ("sageattn_qk_int8_pv_fp8_cuda", {"pv_accum_dtype": "fp32+fp16"}),
    (9, 0): ("sageattn_qk_int8_pv_fp8_cuda_sm90", {"pv_accum_dtype": "fp32+fp32"}),
    (12, 0): ("sageattn_qk_int8_pv_fp8_cuda", {"qk_quant_gran": "per_warp", "pv_accum_dtype": "fp32+fp16"}),
    (12, 1): ("sageattn_qk_int8_pv_fp8_cuda", {"qk_quant_gran": "per_warp", "pv_accum_dtype": "fp32+fp16"}),
}


@dataclass(slots=True, kw_only=True)
class SageAdapter(AdapterBase):
    """SageAttention's ``sageattn`` (quantized; its capabilities limit causal to Sq == Sk and forbid grad)."""

    def bind(self, call: AttentionCall, *, scale: float | None, bshd: bool) -> Callable[..., Any] | None:
        """The plain call bound for a route: the kernel function ``sageattn`` would pick for this GPU, called
        directly with the keywords ``sageattn`` passes it (``sageattn`` reads every GPU's compute capability on
        each call to pick it; :data:`SAGE_BY_ARCH`); None (the generic call) for another version or arch.
        Takes ``[B, H, S, D]`` (``tensor_layout="HND"``) or ``[B, S, H, D]`` (``"NHD"``) as they are."""
        picked = SAGE_BY_ARCH.get(call.compute_capability) if call.compute_capability else None
        if picked is None or self.installed_version() not in SAGE_DIRECT_VERSIONS:
            return None
        name, extra = picked
        kernel = getattr(self.module(), name)
        keywords = {"tensor_layout": "NHD" if bshd else "HND", "is_causal": call.causal, "sm_scale": scale,
                    "return_lse": False, **extra}

        def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return first(kernel(q, k, v, **keywords))  # type: ignore[no-any-return]

        return run

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
