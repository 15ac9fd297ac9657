"""How a backend runs one call signature: the adapter bound to the call, on the caller's tensors, in their layout.

One answer for everything that runs or times a backend: the dispatcher's routes (:mod:`attnforge.dispatch`),
measure-on-first-use (:mod:`attnforge.dispatch.autotune`), ``attnforge bench`` and the GPU check all call
:func:`bound_call`, so what is timed is exactly what serves the call (issue 22: bench's figures disagreed with
the kernels called directly because bench timed the adapters' generic path while the dispatcher ran another).

A bound call takes ``(q, k, v)`` and returns the output in the same layout:

- an adapter with ``bind(call, scale=..., bshd=...)`` may return a callable specialised for the signature (SDPA
  as a ``functools.partial`` of the kernel function; FlashAttention's function on ``transpose(1, 2)`` views of
  bhsd tensors), so nothing of the adapter runs per call;
- otherwise bhsd runs the adapter as it is, and bshd its ``call_bshd`` when the kernel takes that layout
  natively, else transposed views (and back). Views only: no layout copy is made here.

Feature keywords (``softcap``, ``window``, ``attn_mask`` ...) bind to the adapter's ``__call__`` as they are; the
feature path hands bhsd views (or packed tensors for varlen), so it never needs ``call_bshd``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from attnforge.backends.adapter import AttentionCall, BackendAdapter

#: ``fn(q, k, v)`` on the caller's tensors, in the caller's layout
Bound = Callable[..., Any]


def bound_call(adapter: BackendAdapter, call: AttentionCall | None, *, causal: bool, scale: float | None,
               bshd: bool = False, opts: Mapping[str, Any] | None = None) -> Bound:
    """``adapter`` bound to one call signature (see the module docstring).

    Args:
        adapter: the backend.
        call: the call's description (None: no specialisation, e.g. the exact math of an empty call).
        causal: causal masking, bottom-right aligned unless ``opts`` says ``causal_alignment="top_left"``.
        scale: softmax scale; None is ``1/sqrt(D)``.
        bshd: the caller's tensors are ``[B, S, H, D]`` (else ``[B, H, S, D]``).
        opts: the feature keywords the call uses (empty for a plain call).

    A ``bind`` that raises leaves the generic call, whose error at run time is handled where a raising backend
    is (the dispatcher marks it broken for the shape class).
    """
    if opts:
        return functools.partial(adapter, causal=causal, scale=scale, **opts)
    bind = getattr(adapter, "bind", None)
    if bind is not None and call is not None:
        try:
            bound = bind(call, scale=scale, bshd=bshd)
        except Exception:  # the generic call below raises it again, where a raising backend is handled
            bound = None
        if bound is not None:
            return bound  # type: ignore[no-any-return]
    if not bshd:
        return functools.partial(adapter, causal=causal, scale=scale)
    native: Callable[..., torch.Tensor] | None = getattr(adapter, "call_bshd", None)
    if native is not None:
        return functools.partial(native, causal=causal, scale=scale)

    return other_layout(functools.partial(adapter, causal=causal, scale=scale), contiguous=True)


@functools.cache
def _direct_function() -> Any:
    """The one ``torch.autograd.Function`` of the direct kernel entries (made on first use: this module imports no
    torch at load)."""
    import torch

    class _DirectFunction(torch.autograd.Function):
        """One autograd node around a kernel entry's own forward and backward: no Python ``custom_op``, no public
        wrapper's ``autograd.Function`` in between (:func:`differentiable`)."""

        @staticmethod
        def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,  # noqa: PLR0917 - autograd
                    forward: Callable[..., Any], backward: Callable[..., Any], swap: bool) -> torch.Tensor:
            if swap:  # bhsd inputs: the kernel's bshd views made here, where autograd records nothing
                q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            out, saved = forward(q, k, v)
            ctx.save_for_backward(*saved)
            ctx.backward, ctx.swap = backward, swap
            return out  # type: ignore[no-any-return]

        @staticmethod
        def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
            dq, dk, dv = ctx.backward(dout, *ctx.saved_tensors)
            if ctx.swap:
                dq, dk, dv = dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
            return dq, dk, dv, None, None, None

    return _DirectFunction


def _lean_apply(function: Any) -> Callable[..., Any]:
    """``function.apply`` (a ``torch.autograd.Function`` without ``setup_context``) without its Python layer where
    that layer does nothing but cost: torch's C++ ``_FunctionBase.apply`` on the arguments, dead functorch
    wrappers unwrapped first as ``Function.apply`` does (torch/autograd/function.py, 2.11-2.13). Under a
    ``torch.func`` transform (``Function.apply`` raises there: no ``setup_context``) and while ``torch.compile``
    traces (Dynamo follows ``Function.apply`` itself), ``function.apply`` serves. 2.9 against 4.1 µs a call around a
    ``clone`` on this project's 2-core CPU machine (2026-12-01); a torch without the C++ method takes
    ``function.apply`` always."""
    import torch

    raw = getattr(torch._C, "_FunctionBase", object).__dict__.get("apply")
    functorch = getattr(torch._C, "_functorch", None)
    unwrap = getattr(functorch, "unwrap_if_dead", None)
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    if raw is None or unwrap is None or active is None:
        return function.apply  # type: ignore[no-any-return]
    raw_apply = raw.__get__(None, function)
    slow = function.apply
    compiling = torch.compiler.is_compiling

    def apply(q: Any, k: Any, v: Any, *rest: Any) -> Any:
        if active() or compiling():
            return slow(q, k, v, *rest)
        return raw_apply(unwrap(q), unwrap(k), unwrap(v), *rest)

    return apply


def differentiable(forward: Callable[..., Any], backward: Callable[..., Any], *,
                   bshd: bool) -> Callable[..., torch.Tensor]:
    """``fn(q, k, v)`` in the caller's layout, differentiable in q, k and v through one autograd node around a
    kernel's forward and backward (the FlashAttention-2/3/4 direct entries' calls that need a gradient).

    Args:
        forward: ``(q, k, v) -> (out, saved)`` on ``[B, S, H, D]`` tensors: the output ``[B, Sq, Hq, Dv]`` and the
            tensors the backward needs (saved for it by autograd).
        backward: ``(dout, *saved) -> (dq, dk, dv)``, each in its input's shape.
        bshd: the caller's tensors are ``[B, S, H, D]``; else ``[B, H, S, D]``, handed over as ``transpose(1, 2)``
            views, and the output returned as a view the same way.
    """
    apply = _lean_apply(_direct_function())
    if bshd:
        def train_bshd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return apply(q, k, v, forward, backward, False)  # type: ignore[no-any-return]

        return train_bshd

    # the inputs' transposes inside the node (three autograd nodes fewer: 52 against 59 us of host time a fwd+bwd of
    # a no-op kernel on this project's CPU machine, 2026-11-30; bshd's 37), the output's outside it: autograd treats
    # a view returned by a custom Function's forward apart from a plain one
    def train_bhsd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return apply(q, k, v, forward, backward, True).transpose(1, 2)  # type: ignore[no-any-return]

    return train_bhsd


def other_layout(fn: Callable[..., torch.Tensor], *, contiguous: bool = False) -> Callable[..., torch.Tensor]:
    """``fn`` (``(q, k, v)`` in one layout, the output in the same) for a caller of the other layout: ``[B, S, H, D]``
    tensors for a bhsd ``fn``, or ``[B, H, S, D]`` for a bshd one. Dimensions 1 and 2 swap on the way in and back
    on the way out: views, no copy. ``contiguous`` (a bshd caller's, flash-attn's convention: ``out.view(B, S, -1)``
    follows): the output made contiguous, a no-op where ``fn`` wrote it bshd already (SDPA's flash and cuDNN
    kernels on the views), a copy where it wrote bhsd (the math for ``Dv != D``, the exact math)."""

    if contiguous:
        def call_contiguous(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2).contiguous()

        return call_contiguous

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)

    return call
