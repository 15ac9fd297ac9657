"""FlexAttention adapter with attnforge's features, compiled once per call signature: no recompile storm.

``torch.compile`` keeps its cache on the Python code object it compiles and allows only
``torch._dynamo.config.recompile_limit`` (8) entries per object; past that it silently runs the unfused
eager path, which materialises the whole score matrix (the H200 probe in
``tests/fixtures/h200_bench_2026-11-21.json`` hit exactly that and measured 40x slower causal rows).
This adapter therefore gives every signature its own copy of the compiled function (a fresh code object), so
each copy is compiled once with ``dynamic=False`` and never recompiles. The signature holds what the compiled
copy specialises on: device, dtype, sizes, scale, grad mode, and the features with the scalars baked into the
trace (window bounds, alignment, softcap, lse, mask dtype and strides, sinks), so a new softcap compiles a new
copy instead of silently reusing another value.

Features follow :func:`attnforge.backends.exact.exact_attention` (the definition, docs/features.md):
    causal and window: one structural ``BlockMask`` (``create_block_mask``) per (Sq, Sk, device, offset,
        left, right), built once and reused, so its identity never invalidates a guard; causal is
        bottom-right (key ``j <= i + Sk - Sq``) unless ``causal_alignment="top_left"`` (offset 0).
    softcap and ``attn_mask``: a ``score_mod`` closure over the tensor given to each call (never a cached
        block mask, so a mask whose content changes between calls is always honoured): ``c * tanh(s / c)``
        on the scaled score, then ``-inf`` where a bool mask is False, or the additive mask added.
    lse: flex_attention's own (natural log, float32 ``[B, Hq, Sq]``).
    sinks: ``out * sigmoid(lse - sink)`` and ``logaddexp(lse, sink)``, which is exactly the softmax with
        ``exp(sink)`` in its denominator, and differentiable (flex's backward takes the lse's gradient).
    Rows that see no key come back as zeros with lse ``-inf`` (flex_attention's convention; tests check it).
On CPU, torch.compile's flex kernel returns no lse, so there the adapter declines lse and sinks
(:meth:`FlexAdapter.unsupported_reasons`); eager flex_attention (tests inject a non-compiling ``compiler``) has
them everywhere. flex_attention has no backward on CPU (the capability table says so).
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attnforge.backends._base import AdapterBase, four_dims, graph_capturing, made_for_autograd, narrowed, records_grad
from attnforge.backends.adapter import AttentionCall, required_features
from attnforge.backends.exact import visible_bounds

if TYPE_CHECKING:
    import torch

Compiler = Callable[[Callable[..., Any]], Callable[..., Any]]
Window = tuple[int | None, int | None] | None
#: features the CPU (inductor C++) flex kernel lacks: it returns no lse, and sinks are computed from the lse
CPU_COMPILED_LACKS = frozenset({"lse", "sinks"})
#: structural block masks kept per adapter (a windowed decode loop makes one per step; the oldest go first)
BLOCK_MASKS_KEPT = 256


def _default_compiler(fn: Callable[..., Any]) -> Callable[..., Any]:
    import torch

    from attnforge._system.compile_cache import ensure

    ensure()  # Inductor's cache under $ATTNFORGE_HOME, so a second process compiles nothing it compiled before

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

    def unsupported_reasons(self, call: AttentionCall) -> list[str]:
        """Its capabilities' reasons, plus: compiled for CPU (by torch.compile), no lse and hence no sinks."""
        reasons = self.caps.unsupported_reasons(call)
        lacking = sorted(required_features(call) & CPU_COMPILED_LACKS)
        if lacking and call.device_type == "cpu" and self.compiler is _default_compiler:
            reasons.append(f"{', '.join(lacking)}: flex_attention compiled for CPU returns no lse"
                           " (torch 2.13: 'torch.compile on CPU only supports inference and `return_lse` is not"
                           " supported yet')")
        return reasons

    @property
    def compiled_signatures(self) -> int:
        """How many signatures were compiled so far (each compiled exactly once)."""
        return len(self._compiled)

    @property
    def block_masks_built(self) -> int:
        """How many structural ``BlockMask`` objects are kept now (each built once per key while kept; at most
        :data:`BLOCK_MASKS_KEPT`)."""
        return len(self._masks)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None, attn_mask: torch.Tensor | None = None, window: Window = None,
                 softcap: float | None = None, sinks: torch.Tensor | None = None, return_lse: bool = False,
                 causal_alignment: str = "bottom_right") -> Any:
        """FlexAttention on ``[B, Hq, Sq, D]`` / ``[B, Hkv, Sk, D]`` / ``[B, Hkv, Sk, Dv]``.

        Features, with the semantics of :func:`attnforge.backends.exact.exact_attention`: ``attn_mask`` (bool or
        additive, broadcastable to ``[B, Hq, Sq, Sk]``), ``window``, ``softcap``, ``sinks`` (``[Hq]``),
        ``return_lse`` and ``causal_alignment``. Causal and window become a cached ``BlockMask``; softcap and
        the mask tensor a ``score_mod`` that reads the tensor given to this call.

        Returns:
            ``[B, Hq, Sq, Dv]`` in q's dtype; with ``return_lse`` also the float32 lse ``[B, Hq, Sq]``.
        """

        top_left = causal_alignment == "top_left"
        left = right = None
        if causal or window is not None:
            left, right = visible_bounds(causal=causal, window=window)
        mask = None if attn_mask is None else _as_4d(attn_mask, q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        sink = None if sinks is None else sinks.float()
        grad = records_grad(q, k, v, mask, sink)
        extra = None  # the features' part of the signature; None for a plain call (it runs on every call)
        if mask is not None or sink is not None or softcap is not None or return_lse or window is not None or top_left:
            extra = (left, right, top_left, softcap, return_lse, sink is not None,
                     None if mask is None else (mask.dtype, mask.stride()))
        # strides are left out (they cost a microsecond a call): another layout of the same sizes recompiles
        # within its copy, one of the recompile limit's 8 entries, and is still right
        signature = (q.shape, k.shape, v.shape, q.dtype, q.device, causal, scale, grad, extra)
        fn = self._compiled.get(signature)
        if fn is None:
            with self._lock:
                fn = self._compiled.get(signature)
                if fn is None:
                    fn = self.compiler(_fresh_copy(len(self._compiled)))
                    self._compiled[signature] = fn
        block_mask = None
        if left is not None or right is not None:
            offset = 0 if top_left else k.shape[2] - q.shape[2]
            block_mask = self._block_mask(q.shape[2], k.shape[2], q.device, offset=offset, left=left, right=right)
        return fn(q, k, v, mask, sink, block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1],
                  softcap=softcap, return_lse=return_lse)

    def _block_mask(self, seqlen_q: int, seqlen_k: int, device: Any, *, offset: int, left: int | None,
                    right: int | None) -> Any:
        """The ``BlockMask`` of keys ``i + offset - left .. i + offset + right``, built once per key and kept for
        the last :data:`BLOCK_MASKS_KEPT` keys (a decode loop makes a new key every step); one built inside CUDA
        graph capture is not kept (its kernels have not run until the graph replays: garbage for eager calls)."""
        key = (seqlen_q, seqlen_k, device, offset, left, right)
        mask = self._masks.get(key)
        if mask is None:
            if getattr(device, "type", device) != "cpu" and graph_capturing():
                return _build_block_mask(seqlen_q, seqlen_k, device, offset=offset, left=left, right=right)
            with self._lock:
                mask = self._masks.get(key)
                if mask is None:
                    mask = _build_block_mask(seqlen_q, seqlen_k, device, offset=offset, left=left, right=right)
                    if len(self._masks) >= BLOCK_MASKS_KEPT:
                        self._masks.pop(next(iter(self._masks)))  # the oldest
                    self._masks[key] = mask
        return mask


@made_for_autograd  # kept across calls: normal tensors, which a call recording gradients can use
def _build_block_mask(seqlen_q: int, seqlen_k: int, device: Any, *, offset: int, left: int | None,
                      right: int | None) -> Any:
    from torch.nn.attention.flex_attention import create_block_mask

    def left_only(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return kv_idx >= q_idx + (offset - lo)

    def right_only(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return kv_idx <= q_idx + (offset + hi)

    def both(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (kv_idx <= q_idx + (offset + hi)) & (kv_idx >= q_idx + (offset - lo))

    lo, hi = left or 0, right or 0
    visible = both if left is not None and right is not None else left_only if right is None else right_only
    return create_block_mask(visible, None, None, seqlen_q, seqlen_k, device=device)


def _as_4d(mask: torch.Tensor, batch: int, heads: int, seqlen_q: int, seqlen_k: int) -> torch.Tensor:
    """``mask`` as a ``[B, Hq, Sq, Sk]`` broadcast view (no copy; float64 becomes float32, the scores' dtype)."""
    import torch

    if mask.dtype == torch.float64:
        mask = narrowed(mask, torch.float32)
    return four_dims(mask).expand(batch, heads, seqlen_q, seqlen_k)


def _fresh_copy(index: int) -> Callable[..., Any]:
    """A copy of ``flex_template`` with its own code object, hence its own torch.compile cache."""
    from attnforge.backends import _flex_kernel

    template = _flex_kernel.flex_template
    code = template.__code__.replace(co_name=f"attnforge_flex_{index}")
    copy = types.FunctionType(code, template.__globals__, code.co_name)
    copy.__kwdefaults__ = template.__kwdefaults__
    return copy
