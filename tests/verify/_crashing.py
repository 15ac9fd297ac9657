"""Adapters that take their process down, for the isolation tests: a real SIGSEGV, a real abort, a real hang."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from tests.verify.adapters import SdpaMathAdapter, sdpa_math


@dataclass
class SegvAdapter(SdpaMathAdapter):
    """Right on float32; dies by SIGSEGV on bfloat16, like a bf16-only build called in the dtype it lacks."""

    name: str = "segv"

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
        if str(q.dtype) == "torch.bfloat16":
            os.kill(os.getpid(), signal.SIGSEGV)
        return sdpa_math(q, k, v, causal=causal, scale=scale)


@dataclass
class AbortAdapter(SdpaMathAdapter):
    """Aborts (SIGABRT) on its first call, like a failed C++ assertion."""

    name: str = "abort"

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
        os.abort()


@dataclass
class HangAdapter(SdpaMathAdapter):
    """Never returns, like a kernel spinning on a deadlocked barrier."""

    name: str = "hang"

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
        while True:
            time.sleep(1)


def adapters() -> dict[str, Any]:
    """A registry factory for ``Isolation(adapters_ref="tests.verify._crashing:adapters")``."""
    return {a.name: a for a in (SegvAdapter(), AbortAdapter(), HangAdapter(), SdpaMathAdapter())}


@dataclass
class PoisonAdapter(SdpaMathAdapter):
    """Right on float32; on bfloat16 fails the way a kernel that wrote out of bounds does."""

    name: str = "poison"

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
        if str(q.dtype) == "torch.bfloat16":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return sdpa_math(q, k, v, causal=causal, scale=scale)


@dataclass
class SoftcapBrokenAdapter(SdpaMathAdapter):
    """Right on plain calls; claims softcap and raises on it, like FlexAttention's dynamo error on GPU (issue 25:
    flex failed only its causal_top_left cases, and the child's verdict took the whole backend away)."""

    name: str = "softcap-broken"
    features: frozenset[str] = frozenset({"softcap"})

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None, **features: Any) -> Any:
        if features:
            raise RuntimeError("torch._dynamo.exc.Unsupported: softcap")
        return sdpa_math(q, k, v, causal=causal, scale=scale)


@dataclass
class UnbuildableAdapter(SdpaMathAdapter):
    """Pickles in the parent, raises when the child rebuilds it: a Python exception in the bench's own code in the
    child (as an UnboundLocalError of run_bench once did), not the backend's kernel crashing."""

    name: str = "unbuildable"

    def __setstate__(self, state: Any) -> None:
        raise ValueError("this adapter cannot be rebuilt in a child")
