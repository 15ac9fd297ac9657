"""Small adapters for tests: a real SDPA-math path on CPU and deliberately broken ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn import functional
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnforge.backends.adapter import AttentionCall


def sdpa_math(q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
    """PyTorch SDPA, math backend, with the bottom-right causal rule of attnforge."""
    sq, sk = q.shape[2], k.shape[2]
    mask = None
    if causal and sq != sk:
        i = torch.arange(sq, device=q.device).unsqueeze(1)
        j = torch.arange(sk, device=q.device).unsqueeze(0)
        mask = j <= i + (sk - sq)
    with sdpa_kernel(SDPBackend.MATH):
        return functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and sq == sk,
                                                       scale=scale, enable_gqa=q.shape[1] != k.shape[1])


@dataclass
class SdpaMathAdapter:
    """The SDPA math path; supports every dtype on CPU."""

    name: str = "sdpa-math"
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16", "float64")
    calls: list[AttentionCall] = field(default_factory=list)

    def load_error(self) -> str | None:
        return None

    def unsupported_reasons(self, call: AttentionCall) -> list[str]:
        self.calls.append(call)
        return [] if call.dtype in self.dtypes else [f"dtype {call.dtype} not supported"]

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
        return sdpa_math(q, k, v, causal=causal, scale=scale)


@dataclass
class WrongAdapter(SdpaMathAdapter):
    """Ignores the causal flag: right for full attention, wrong for causal."""

    name: str = "wrong"

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
        return sdpa_math(q, k, v, causal=False, scale=scale)


@dataclass
class NanAdapter(SdpaMathAdapter):
    """Leaves the last query row unwritten (NaN)."""

    name: str = "nan"

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
        out = sdpa_math(q, k, v, causal=causal, scale=scale).clone()
        out[:, :, -1, :] = float("nan")
        return out


@dataclass
class RaisingAdapter(SdpaMathAdapter):
    """Raises like a kernel with a missing symbol."""

    name: str = "raising"

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device")


@dataclass
class NotInstalledAdapter(SdpaMathAdapter):
    name: str = "missing"

    def load_error(self) -> str | None:
        return "No module named 'missing_attn'"


@dataclass
class ScaledAdapter(SdpaMathAdapter):
    """Right up to a constant factor: a stand-in for a kernel with a small systematic error."""

    name: str = "scaled"
    factor: float = 1.0

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
        return sdpa_math(q, k, v, causal=causal, scale=scale) * self.factor
