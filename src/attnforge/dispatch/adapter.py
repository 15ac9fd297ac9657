"""The contract every attention backend adapter fulfils, and the float64 reference they are checked against.

Conventions for every adapter call (they are the ones of :func:`attnforge.attention`):
    q: ``[B, Hq, Sq, D]``, k and v: ``[B, Hkv, Sk, D]`` (layout "bhsd"), Hq a multiple of Hkv (GQA).
    causal: when Sq != Sk the mask is aligned to the bottom-right (query i sees keys j <= i + Sk - Sq), as in
    FlashAttention >= 2.1; adapters of top-left backends convert.
    scale: softmax scale; None means 1/sqrt(D).
    Returns ``[B, Hq, Sq, D]`` in q's dtype.

Optional: an adapter whose kernel takes ``[B, S, H, D]`` natively (FlashAttention, xFormers, SageAttention
with ``tensor_layout="NHD"``) also defines ``call_bshd(q, k, v, *, causal, scale)``, which takes
``[B, Sq, Hq, D]`` / ``[B, Sk, Hkv, D]`` and returns ``[B, Sq, Hq, D]``. The dispatcher gives it
``layout="bshd"`` inputs as they are, so neither side transposes; adapters without it get ``[B, H, S, D]``
views and the dispatcher transposes the output back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionCall:
    """The properties of one call that decide which backends can serve it (no tensors: hashable, cacheable).

    Attributes:
        device_type: ``"cuda"`` or ``"cpu"``.
        compute_capability: the GPU's ``(9, 0)``; None on CPU.
        dtype: ``"float16"``, ``"bfloat16"``, ``"float32"``, ``"float64"``.
        batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim: sizes (``B, Hq, Hkv, Sq, Sk, D``).
        causal: causal masking, bottom-right aligned.
        needs_grad: any input requires grad.
        precision: ``"exact"`` or ``"allow_quantized"``.
    """

    device_type: str
    compute_capability: tuple[int, int] | None
    dtype: str
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool
    needs_grad: bool
    precision: str = "exact"


class BackendAdapter(Protocol):
    """One attention backend behind the common call convention (see the module docstring)."""

    #: catalog id, e.g. "flash-attn", "sdpa-cudnn"
    name: str

    def load_error(self) -> str | None:
        """None if the backend's package imports here, else why not (cheap after the first call)."""
        ...

    def unsupported_reasons(self, call: AttentionCall) -> list[str]:
        """Pure: every reason this backend cannot serve ``call`` (empty list = supported)."""
        ...

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None) -> torch.Tensor:
        """Run attention; see the module docstring for shapes and the causal alignment rule."""
        ...


def reference_attention(q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
    """Plain-math attention in float64 on q's device: the ground truth for verify and tests.

    Shapes as in the module docstring; GQA by repeating K/V heads; causal bottom-right aligned. Rows that
    see no key (possible when Sq > Sk with causal) are defined as zeros, matching FlashAttention.

    Returns:
        ``[B, Hq, Sq, D]`` in float64.
    """
    import torch

    qd, kd, vd = q.double(), k.double(), v.double()
    hq, hkv = qd.shape[1], kd.shape[1]
    if hq != hkv:
        kd = kd.repeat_interleave(hq // hkv, dim=1)
        vd = vd.repeat_interleave(hq // hkv, dim=1)
    s = scale if scale is not None else 1.0 / math.sqrt(qd.shape[-1])
    scores = torch.matmul(qd, kd.transpose(-1, -2)) * s
    if causal:
        sq, sk = qd.shape[2], kd.shape[2]
        i = torch.arange(sq, device=qd.device).unsqueeze(1)
        j = torch.arange(sk, device=qd.device).unsqueeze(0)
        allowed = j <= i + (sk - sq)
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        probs = torch.nan_to_num(probs, nan=0.0)
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, vd)
