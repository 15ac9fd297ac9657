"""FlexAttention adapter, compiled once per call signature: no recompile storm.

``torch.compile`` keeps its cache on the Python code object it compiles and allows only
``torch._dynamo.config.recompile_limit`` (8) entries per object; past that it silently runs the unfused
eager path, which materialises the whole score matrix (the H200 probe in
``tests/fixtures/h200_bench_2026-11-21.json`` hit exactly that and measured 40x slower causal rows).
This adapter therefore gives every signature (device, dtype, sizes, causal, scale, GQA, grad mode) its own
copy of the compiled function (a fresh code object), so each copy is compiled once with ``dynamic=False``
and never recompiles. The causal ``BlockMask`` is built once per (Sq, Sk, device) and reused, so its
identity never invalidates a guard.

Causal is bottom-right: the mask keeps key ``j`` for query ``i`` when ``j <= i + Sk - Sq``; rows that see no
key come back as zeros (checked by a test on CPU).
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attnforge.backends._base import AdapterBase

if TYPE_CHECKING:
    import torch

Compiler = Callable[[Callable[..., Any]], Callable[..., Any]]


def _default_compiler(fn: Callable[..., Any]) -> Callable[..., Any]:
    import torch

    return torch.compile(fn, dynamic=False, fullgraph=True)


@dataclass(slots=True, kw_only=True)
class FlexAdapter(AdapterBase):
    """``torch.nn.attention.flex_attention`` behind a per-signature cache of compiled functions.

    Attributes:
        compiler: turns a function into its compiled form (``torch.compile(fn, dynamic=False,
            fullgraph=True)``; tests inject a counting stand-in).
    """

    compiler: Compiler = _default_compiler
    _compiled: dict[tuple[Any, ...], Callable[..., Any]] = field(default_factory=dict, repr=False)
    _masks: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def compiled_signatures(self) -> int:
        """How many signatures were compiled so far (each compiled exactly once)."""
        return len(self._compiled)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None) -> torch.Tensor:
        """FlexAttention on ``[B, Hq, Sq, D]`` / ``[B, Hkv, Sk, D]``; returns ``[B, Hq, Sq, D]``."""
        import torch

        signature = (q.device, q.dtype, tuple(q.shape), tuple(k.shape), causal, scale,
                     torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
        fn = self._compiled.get(signature)
        block_mask = self._block_mask(q.shape[2], k.shape[2], q.device) if causal else None
        if fn is None:
            with self._lock:
                fn = self._compiled.get(signature)
                if fn is None:
                    fn = self.compiler(_fresh_copy(len(self._compiled)))
                    self._compiled[signature] = fn
        return fn(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])  # type: ignore[no-any-return]

    def _block_mask(self, seqlen_q: int, seqlen_k: int, device: Any) -> Any:
        key = (seqlen_q, seqlen_k, device)
        mask = self._masks.get(key)
        if mask is None:
            from torch.nn.attention.flex_attention import create_block_mask

            offset = seqlen_k - seqlen_q

            def bottom_right(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
                return kv_idx <= q_idx + offset

            mask = create_block_mask(bottom_right, None, None, seqlen_q, seqlen_k, device=device)
            self._masks[key] = mask
        return mask


def _fresh_copy(index: int) -> Callable[..., Any]:
    """A copy of ``flex_template`` with its own code object, hence its own torch.compile cache."""
    from attnforge.backends import _flex_kernel

    template = _flex_kernel.flex_template
    code = template.__code__.replace(co_name=f"attnforge_flex_{index}")
    copy = types.FunctionType(code, template.__globals__, code.co_name)
    copy.__kwdefaults__ = template.__kwdefaults__
    return copy
