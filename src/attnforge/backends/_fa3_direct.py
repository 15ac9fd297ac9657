"""FlashAttention-3's registered ops called directly: the route of a bound FA3 call without the public entry.

The public ``flash_attn_interface.flash_attn_func`` makes four hops per call (``FlashAttnFunc.apply``, the
Python ``custom_op`` ``flash_attn_3::_flash_attn_forward``, ``maybe_contiguous`` on 14 arguments, the op, then
two ``torch.tensor([])`` allocations): ~97 us of host time per call on an H100 against ~31 us for the op called
positionally (docs/research/h100-host-cost-2026-11-26.md). This module calls ``torch.ops.flash_attn_3.fwd``
positionally with an argument tail prepared once per bound signature, inside one lean
``torch.autograd.Function`` whose backward calls ``torch.ops.flash_attn_3.bwd`` positionally, or with no
autograd at all when the call needs no gradient (as vLLM and SGLang call their FA3 ops).

Mirrored upstream (github.com/Dao-AILab/flash-attention @0251105a, 2026-08-15):

- the op schemas: ``hopper/flash_api_stable.cpp`` lines 1893-1950 (``STABLE_TORCH_LIBRARY(flash_attn_3, m)``,
  ``fwd`` and ``bwd``; ``hopper/flash_api.cpp`` lines 1674-1730 holds the same text for torch < 2.9);
- the arguments the public entry passes: ``hopper/flash_attn_interface.py`` lines 552-608
  (``FlashAttnFunc.forward``: the scale defaults to ``D ** -0.5``, ``num_splits=1``, ``pack_gqa=None``,
  ``sm_margin=0``, ``attention_chunk=0``), lines 59-150 (``_flash_attn_forward``: ``rotary_interleaved=True``,
  ``maybe_contiguous``, V made contiguous only when neither its last nor its third-last stride is 1; the op
  returns ``(out, softmax_lse, out_accum, softmax_lse_accum)``), lines 610-639 (``FlashAttnFunc.backward``:
  ``dq, dk, dv = empty_like``, ``deterministic=False``) and lines 258-309 (``_flash_attn_backward``).

Pinned: :func:`find_ops` hands out the ops only when their registered schemas are exactly the mirrored ones
(another FA3 build, older or newer, keeps the public function); tests/dispatch/test_direct_entries.py registers
the mirrored schemas in a test namespace on CPU and checks the mapping against the public path.

The lean entry: ``torch.ops`` parses every one of ``fwd``'s 34 arguments against the schema on each call (a CPU-only
34-argument op with an empty kernel costs 9.6 µs a call that way, an 8-argument pybind11 function 2.0 µs:
docs/benchmarks.md "2026-11-30 (twenty-ninth session)"). A build made with ``--abi torch`` carries the catalog's
``[[recipes.flash-attn-3.per_torch.also]]`` edits: ``flash_attn_3._C`` becomes a pybind11 module whose
``attnforge_fwd(q, k, v, scale, causal, left, right, softcap) -> (out, lse)`` and ``attnforge_bwd(dout, q, k, v, out,
lse, dq, dk, dv, scale, causal, left, right, softcap)`` call ``mha_fwd`` / ``mha_bwd`` with the other arguments at
what :func:`forward_tail` and :func:`backward_tail` pass. Since ``attnforge_entry`` 2 ``attnforge_fwd`` takes
``num_splits`` last (0 for a call that needs no gradient: :func:`forward_tail`), and the module also has
``attnforge_attn(q, k, v, scale, causal, left, right, softcap, bhsd) -> out``, the train route as one C++ autograd
node (``torch::autograd::Function``) around the same two calls, with :func:`bind`'s own mapping (``maybe_contiguous``,
V's rule, ``dq, dk, dv = empty_like``, bhsd inputs transposed inside the node and the output outside it): a Python
``autograd.Function`` costs ~8 µs of host time a call more (H200, docs/benchmarks.md "2026-11-30 (twenty-ninth
session)"). :func:`bind` calls the entry where the module's ``attnforge_entry`` is in :data:`ENTRY_VERSIONS` (and the
ops' schemas are the mirrored ones); else the ops.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from attnforge.backends.bound import differentiable

#: ``m.def("fwd(...")``, hopper/flash_api_stable.cpp:1893-1927 @0251105a, verbatim
FWD_SCHEMA = (
    "fwd(Tensor q, Tensor k, Tensor v, Tensor(k_new!)? k_new = None, Tensor(v_new!)? v_new = None,"
    " Tensor? q_v = None, Tensor(out!)? out = None, Tensor? cu_seqlens_q = None, Tensor? cu_seqlens_k = None,"
    " Tensor? cu_seqlens_k_new = None, Tensor? seqused_q = None, Tensor? seqused_k = None,"
    " int? max_seqlen_q = None, int? max_seqlen_k = None, Tensor? page_table = None,"
    " Tensor? kv_batch_idx = None, Tensor? leftpad_k = None, Tensor? rotary_cos = None,"
    " Tensor? rotary_sin = None, Tensor? seqlens_rotary = None, Tensor? q_descale = None,"
    " Tensor? k_descale = None, Tensor? v_descale = None, float? softmax_scale = None, bool is_causal = False,"
    " int window_size_left = -1, int window_size_right = -1, int attention_chunk = 0, float softcap = 0.0,"
    " bool is_rotary_interleaved = False, Tensor? scheduler_metadata = None, int num_splits = 0,"
    " bool? pack_gqa = None, int sm_margin = 0) -> (Tensor(out!), Tensor, Tensor, Tensor)"
)
#: ``m.def("bwd(...")``, hopper/flash_api_stable.cpp:1928-1950 @0251105a, verbatim
BWD_SCHEMA = (
    "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, Tensor(dq!)? dq = None,"
    " Tensor(dk!)? dk = None, Tensor(dv!)? dv = None, Tensor? cu_seqlens_q = None, Tensor? cu_seqlens_k = None,"
    " Tensor? seqused_q = None, Tensor? seqused_k = None, int? max_seqlen_q = None, int? max_seqlen_k = None,"
    " float? softmax_scale = None, bool is_causal = False, int window_size_left = -1,"
    " int window_size_right = -1, float softcap = 0.0, bool deterministic = False,"
    " int sm_margin = 0) -> (Tensor, Tensor, Tensor, Tensor, Tensor)"
)
#: the namespace ``flash_attn_3._C`` registers its ops under (``STABLE_TORCH_LIBRARY(flash_attn_3, m)``)
NAMESPACE = "flash_attn_3"
#: the module that holds the lean entry in a build with the catalog's per-torch edits
ENTRY_MODULE = "flash_attn_3._C"
#: ``attnforge_entry`` the catalog's edit sets now: ``attnforge_fwd``, ``attnforge_bwd`` and ``attnforge_attn``
ENTRY_VERSION = 2
#: the lean entries :func:`bind` calls: 1 has ``attnforge_fwd`` / ``attnforge_bwd`` (builds of 2026-11-30 before the
#: C++ train node; its train route is the Python node), 2 adds ``attnforge_attn``
ENTRY_VERSIONS = (1, 2)


@dataclass(frozen=True, slots=True, kw_only=True)
class Fa3Ops:
    """The two registered ops (``OpOverload``s: ``.default``, no overload resolution per call), and the build's
    lean entry (the module with ``attnforge_fwd`` / ``attnforge_bwd``; None: the ops serve)."""

    fwd: Callable[..., Any]
    bwd: Callable[..., Any]
    entry: Any = None

    @property
    def entry_version(self) -> int:
        """The lean entry's ``attnforge_entry`` (0 without one)."""
        return int(getattr(self.entry, "attnforge_entry", 0)) if self.entry is not None else 0

    @property
    def train(self) -> Callable[..., Any] | None:
        """The lean entry's C++ train node (``attnforge_attn``, entry 2); None: a Python node serves a call that
        needs a gradient (no entry, entry 1, or a module that says 2 without the node: a hand-edited build)."""
        return getattr(self.entry, "attnforge_attn", None) if self.entry_version >= 2 else None


def find_ops(namespace: str = NAMESPACE, entry_module: str | None = ENTRY_MODULE) -> Fa3Ops | None:
    """FA3's ``fwd`` and ``bwd`` ops when their registered schemas are the mirrored ones, else None; with the lean
    entry of ``entry_module`` (imported already) where its ``attnforge_entry`` is one of :data:`ENTRY_VERSIONS`.

    Call after importing the package that registers them (``flash_attn_interface`` imports
    ``flash_attn_3._C``). A schema that differs in any argument, default or return (another FA3 version) gives
    None, and the adapter keeps the public function.
    """
    try:
        ns = getattr(torch.ops, namespace)
        fwd, bwd = ns.fwd.default, ns.bwd.default
    except (AttributeError, RuntimeError):  # not registered (or no such overload)
        return None
    for op, mirrored in ((fwd, FWD_SCHEMA), (bwd, BWD_SCHEMA)):
        if str(op._schema) != str(torch._C.parse_schema(f"{namespace}::{mirrored}")):
            return None
    module = sys.modules.get(entry_module) if entry_module else None
    version = getattr(module, "attnforge_entry", None)
    return Fa3Ops(fwd=fwd, bwd=bwd, entry=module if version in ENTRY_VERSIONS else None)


def forward_tail(*, scale: float, causal: bool, window: tuple[int, int] = (-1, -1),
                 softcap: float = 0.0, num_splits: int = 1) -> tuple[Any, ...]:
    """The 31 positional arguments of ``fwd`` after ``q, k, v``, as ``FlashAttnFunc.forward`` passes them
    through ``_flash_attn_forward`` (hopper/flash_attn_interface.py:576-598 and 107-142 @0251105a).

    Args:
        scale: the softmax scale, already defaulted to ``D ** -0.5`` (``FlashAttnFunc.forward`` line 574).
        causal: bottom-right causal.
        window: ``(left, right)``, -1 = unbounded.
        softcap: 0.0 = off.
        num_splits: how many chunks of the keys one query block's work is split into: 1 (the public
            ``flash_attn_func``'s default, kept for a call that needs a gradient) or 0 (FA3's own heuristic,
            ``num_splits_heuristic`` in hopper/heuristics.h: more than 1 only where the grid would leave SMs idle,
            e.g. a decode step; ``flash_attn_with_kvcache``'s default, flash_attn_interface.py line 969). A build
            without the split kernels (``FLASH_ATTENTION_DISABLE_SPLIT``) takes 0 as 1 (flash_api.cpp
            ``get_num_splits``).
    """
    return (None, None, None, None,  # k_new, v_new, q_v, out
            None, None, None, None, None,  # cu_seqlens_q/k/k_new, seqused_q/k
            None, None,  # max_seqlen_q/k
            None, None, None,  # page_table, kv_batch_idx, leftpad_k
            None, None, None,  # rotary_cos/sin, seqlens_rotary
            None, None, None,  # q/k/v_descale
            scale, causal, window[0], window[1],
            0,  # attention_chunk
            softcap,
            True,  # rotary_interleaved: _flash_attn_forward's default (line 90), not the op's
            None,  # scheduler_metadata
            num_splits,  # FlashAttnFunc.forward's default is 1 (line 567)
            None,  # pack_gqa
            0)  # sm_margin


def backward_tail(*, scale: float, causal: bool, window: tuple[int, int] = (-1, -1),
                  softcap: float = 0.0) -> tuple[Any, ...]:
    """The 13 positional arguments of ``bwd`` after ``dout, q, k, v, out, lse, dq, dk, dv``, as
    ``FlashAttnFunc.backward`` passes them (hopper/flash_attn_interface.py:615-635 @0251105a)."""
    return (None, None, None, None, None, None,  # cu_seqlens_q/k, seqused_q/k, max_seqlen_q/k
            scale, causal, window[0], window[1], softcap,
            False,  # deterministic
            0)  # sm_margin


def _lastdim(t: torch.Tensor) -> torch.Tensor:
    """``maybe_contiguous`` (hopper/flash_attn_interface.py:30)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _values(v: torch.Tensor) -> torch.Tensor:
    """V's rule in ``_flash_attn_forward`` (line 97): FP8 V may come with its third-last dim contiguous."""
    return v.contiguous() if v.stride(-1) != 1 and v.stride(-3) != 1 else v


def bind(ops: Fa3Ops, *, scale: float, causal: bool, bshd: bool, needs_grad: bool,
         window: tuple[int, int] = (-1, -1), softcap: float = 0.0) -> Callable[..., torch.Tensor]:
    """``fn(q, k, v)`` on the caller's tensors in their layout, calling the ops directly.

    Args:
        ops: from :func:`find_ops`.
        scale: the softmax scale (``D ** -0.5`` when the caller gave none, as the public entry defaults it).
        causal: bottom-right causal.
        bshd: the caller's tensors are ``[B, S, H, D]``; else ``[B, H, S, D]``, handed to the op as
            ``transpose(1, 2)`` views, and the output ``[B, Sq, Hq, Dv]`` comes back as a view the same way.
        needs_grad: one autograd node around the two calls (the lean entry's C++ ``attnforge_attn`` where the build
            has it, else :func:`attnforge.backends.bound.differentiable`); else no autograd at all.
        window, softcap: as :func:`forward_tail`.

    Returns:
        The bound call: ``[B, Sq, Hq, D]`` / ``[B, Sk, Hkv, D]`` fp16/bf16 CUDA tensors in (or bhsd), the output
        in q's dtype and the same layout. It allocates only the op's own outputs and never synchronises, so it
        can be captured in a CUDA graph.
    """
    splits = 1 if needs_grad else 0  # a forward-only call: FA3's split heuristic (forward_tail)
    if ops.entry is not None:  # the lean entry: the same tensors first, then (scale, causal, left, right, softcap)
        fwd, bwd = ops.entry.attnforge_fwd, ops.entry.attnforge_bwd
        grad_tail: tuple[Any, ...] = (float(scale), bool(causal), int(window[0]), int(window[1]), float(softcap))
        # entry 2's attnforge_fwd takes num_splits last (entry 1's passes 1)
        tail = (*grad_tail, splits) if ops.entry_version >= 2 else grad_tail
    else:
        fwd, bwd = ops.fwd, ops.bwd
        tail = forward_tail(scale=scale, causal=causal, window=window, softcap=softcap, num_splits=splits)
        grad_tail = backward_tail(scale=scale, causal=causal, window=window, softcap=softcap)
    if needs_grad and ops.train is not None:
        train, swap = ops.train, not bshd

        def train_route(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return train(q, k, v, *grad_tail, swap)  # type: ignore[no-any-return]

        return train_route
    if not needs_grad:
        if bshd:
            def forward_bshd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                return fwd(_lastdim(q), _lastdim(k), _values(v), *tail)[0]  # type: ignore[no-any-return]

            return forward_bshd

        def forward_bhsd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = fwd(_lastdim(q.transpose(1, 2)), _lastdim(k.transpose(1, 2)), _values(v.transpose(1, 2)), *tail)
            return out[0].transpose(1, 2)  # type: ignore[no-any-return]

        return forward_bhsd

    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        q, k, v = _lastdim(q), _lastdim(k), _values(v)
        res = fwd(q, k, v, *tail)  # the ops: (out, lse, out_accum, lse_accum); the lean entry: (out, lse)
        out, lse = res[0], res[1]
        return out, (q, k, v, out, lse)

    def backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,  # noqa: PLR0917 - saved tensors
                 lse: torch.Tensor) -> tuple[torch.Tensor, ...]:
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        bwd(_lastdim(dout), _lastdim(q), _lastdim(k), _lastdim(v), _lastdim(out), lse, dq, dk, dv, *grad_tail)
        return dq, dk, dv

    return differentiable(forward, backward, bshd=bshd)
