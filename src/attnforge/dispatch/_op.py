"""``attnforge::attention`` (and ``attnforge::attention_features``) as ``torch.library`` custom ops, so
``torch.compile`` sees one opaque node.

The dispatcher (dict lookups, records, context variables, try/except fallback) is not traceable, and tracing
it would graph-break on every call. Under ``torch.compile``, :func:`attnforge.attention` therefore validates
its inputs in traced code and emits this op; the op's real implementation runs the dispatcher eagerly at run
time (where :func:`attnforge.use_backend` is honoured), and its fake implementation gives the output's shape.

``attnforge::attention_features`` does the same for a call with a mask, a window, a softcap or top-left causal
alignment (transformers' call of every layer: a mask and a scale): its real implementation runs
:func:`attnforge.dispatch.features.attention` eagerly, whether or not the call's class was decided. Traced instead,
that path decides a class nobody decided yet inside the trace (the records' lock and SQLite reads), which Dynamo
cannot follow: ``torch.compile(fullgraph=True)`` of a tiny Llama with ``attn_implementation="attnforge"`` failed on
its first layer ("Unsupported context manager"); for a decided class it read the CUDA device's name
(``torch.cuda.get_device_name``, "torch.* op returned non-Tensor", H200, 2026-12-01).

``attnforge::attention_varlen`` is the same for packed sequences (``cu_seqlens``), tagged
``torch.Tag.cudagraph_unsafe``: it reads the offsets on the host, so Inductor keeps it out of its CUDA graphs.

Each real implementation runs inside :func:`attnforge.backends._base.cudagraph_warmup`: in the warm-up of
``mode="reduce-overhead"``'s CUDA graphs it keeps nothing it made (the warm-up's memory pool admits outputs only).

``attnforge::refuse`` stands in for a call whose traced validation refused it: it raises that
:class:`~attnforge.errors.DispatchError` when the compiled code runs (raised during the trace, it was Dynamo's
``Unsupported`` under ``fullgraph=True``), and its fake gives the refused call's output shape.

Backward: the op's autograd formula calls ``attnforge::attention_backward``, which recomputes the forward
through the dispatcher with autograd on and differentiates it: correct for every backend, at the cost of one
extra forward per backward (like activation checkpointing). Eager calls do not use the op and differentiate
through the chosen backend directly.

No ``from __future__ import annotations`` here: ``torch.library`` reads the annotations to infer the schema,
which is positional by nature (PLR0917 is silenced for the op signatures).
"""

from collections.abc import Callable
from typing import Any

import torch

from attnforge.backends._base import cudagraph_warmup

_NAMESPACE = "attnforge"

#: The process-wide dispatcher's getter, handed in by :mod:`attnforge.dispatch.runtime` when it loads (it emits
#: these ops and imports this module; this module imports nothing of it).
_dispatcher: Callable[[], Any] | None = None


def serve_with(get_dispatcher: Callable[[], Any]) -> None:
    """Run the ops' real implementations on ``get_dispatcher()`` (a
    :class:`~attnforge.dispatch.dispatcher.Dispatcher`, looked up at each run so ``set_dispatcher`` applies)."""
    global _dispatcher  # noqa: PLW0603 - the one seam, set once by the runtime
    _dispatcher = get_dispatcher


def _current() -> Any:
    if _dispatcher is None:
        raise RuntimeError("attnforge::attention ran before attnforge.dispatch.runtime was loaded; "
                           "call attnforge.attention instead of the op")
    return _dispatcher()


@torch.library.custom_op(f"{_NAMESPACE}::attention", mutates_args=())
def attention_op(  # noqa: PLR0917 - op schema
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
                 backend: str | None, precision: str, needs_grad: bool) -> torch.Tensor:
    """Dispatch ``[B, Hq, Sq, D]`` / ``[B, Hkv, Sk, D]``; returns a contiguous ``[B, Hq, Sq, D]``."""
    with cudagraph_warmup(q):
        out: torch.Tensor = _current().run(q, k, v, causal=causal, scale=scale, backend=backend,
                                           precision=precision, needs_grad=needs_grad)
    return out.contiguous()


@attention_op.register_fake
def _attention_fake(  # noqa: PLR0917 - op schema
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
                    backend: str | None, precision: str, needs_grad: bool) -> torch.Tensor:
    return q.new_empty((*q.shape[:3], v.shape[3]))


@torch.library.custom_op(f"{_NAMESPACE}::refuse", mutates_args=())
def refuse_op(q: torch.Tensor, v: torch.Tensor, message: str, cause: str, hint: str) -> torch.Tensor:
    """A call that ``torch.compile`` traced and validation refused: raises its :class:`DispatchError` when the
    compiled code runs, where the caller can catch it (raised while Dynamo traces, it was Dynamo's ``Unsupported``
    under ``fullgraph=True``, the message lost). ``cause`` and ``hint``: "" for none."""
    from attnforge.errors import DispatchError

    raise DispatchError(message, cause=cause or None, hint=hint or None)


@refuse_op.register_fake
def _refuse_fake(q: torch.Tensor, v: torch.Tensor, message: str, cause: str, hint: str) -> torch.Tensor:
    # the output the call would have had (q's shape with v's head dim, either layout), so the model's code after the
    # call traces on to the end of the graph and the op raises when the graph runs
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


def refused(q: Any, v: Any, error: Any) -> Any:
    """Inside a ``torch.compile`` trace: the :class:`DispatchError` ``error`` that validating a call raised, as
    :func:`refuse_op` raising it at run time; re-raised where q or v is not a tensor with dimensions (nothing to
    shape an output by)."""
    if not (isinstance(q, torch.Tensor) and isinstance(v, torch.Tensor) and q.dim() and v.dim()):
        raise error
    return refuse_op(q.detach(), v.detach(), error.message, error.cause or "", error.hint or "")


@torch.library.custom_op(f"{_NAMESPACE}::attention_backward", mutates_args=())
def attention_backward_op(  # noqa: PLR0917 - op schema
    grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                          scale: float | None, backend: str | None,
                          precision: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`attention_op` for q, k, v by recomputing the forward with autograd on."""
    with _autograd_on(), torch.enable_grad(), cudagraph_warmup(q):
        qd, kd, vd = (t.detach().requires_grad_() for t in (q, k, v))
        out = _current().run(qd, kd, vd, causal=causal, scale=scale, backend=backend,
                             precision=precision, needs_grad=True)
        dq, dk, dv = torch.autograd.grad(out, (qd, kd, vd), grad)
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


@attention_backward_op.register_fake
def _attention_backward_fake(  # noqa: PLR0917 - op schema
    grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             causal: bool, scale: float | None, backend: str | None,
                             precision: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))  # type: ignore[return-value]


def _autograd_on() -> Any:
    """Re-admit autograd inside an op implementation, which runs with the autograd dispatch keys excluded.

    Uses the private ``torch._C._ForceDispatchKeyGuard`` (torch >= 2.4): the exclude set minus the autograd
    keys. ``tests/dispatch/test_compile.py`` checks the gradients eagerly and compiled, so a torch release
    that changes this fails there.
    """
    keys = torch._C.DispatchKey
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in (keys.AutogradFunctionality, keys.AutogradOther, keys.AutogradNestedTensor,
                keys.ADInplaceOrView):
        exclude = exclude.remove(key)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    q, k, v, causal, scale, backend, precision, _needs_grad = inputs
    ctx.save_for_backward(q, k, v)
    ctx.options = (causal, scale, backend, precision)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    q, k, v = ctx.saved_tensors
    dq, dk, dv = attention_backward_op(grad.contiguous(), q, k, v, *ctx.options)
    return dq, dk, dv, None, None, None, None, None


attention_op.register_autograd(_backward, setup_context=_setup_context)


def _features_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,  # noqa: PLR0917 - the ops' arguments
                   attn_mask: torch.Tensor | None, sinks: torch.Tensor | None, causal: bool, causal_alignment: str,
                   is_causal: bool | None, window: list[int] | None, softcap: float | None, scale: float | None,
                   backend: str | None, precision: str, cu_seqlens_q: torch.Tensor | None = None,
                   cu_seqlens_k: torch.Tensor | None = None, max_seqlen_q: int | None = None,
                   max_seqlen_k: int | None = None) -> torch.Tensor:
    """The feature path on ``[B, H, S, D]`` tensors (packed ``[total, H, D]`` ones with ``cu_seqlens_q/k``),
    eagerly, on the process-wide dispatcher. Every keyword is passed, in :func:`attnforge.attention`'s order, as
    that function passes them: a call's plan is kept under a signature of its keywords
    (:func:`attnforge.dispatch.features.signature`), so the op's calls and eager ones share plans."""
    from attnforge.dispatch import features
    from attnforge.dispatch.dispatcher import _FORCED

    with cudagraph_warmup(q):
        out: torch.Tensor = features.attention(
            q, k, v, dispatcher=_current(), layout="bhsd", backend=_FORCED.get() if backend is None else backend,
            precision=precision,
            scale=scale, attn_mask=attn_mask, dropout_p=0.0, causal=causal, causal_alignment=causal_alignment,
            enable_gqa=True, window=None if window is None else (window[0], window[1]), softcap=softcap,
            sinks=sinks, return_lse=False, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, is_causal=is_causal, block_table=None,
            seqused_k=None)
    return out


#: Inductor keeps an op with this tag out of its CUDA graphs (``mode="reduce-overhead"``): a packed call reads its
#: offsets on the host, which a capture forbids (torch >= 2.8 has the tag; without it nothing is marked)
_CUDAGRAPH_UNSAFE = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()


def _features_ops(name: str, tags: tuple[Any, ...]) -> Any:
    """The op ``attnforge::<name>`` serving a call with features (:func:`_features_call`) and its backward op
    ``attnforge::<name>_backward``, both with ``tags``; returns the forward op."""

    @torch.library.custom_op(f"{_NAMESPACE}::{name}", mutates_args=(), tags=tags)
    def forward_op(  # noqa: PLR0917 - op schema
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
            sinks: torch.Tensor | None, causal: bool, causal_alignment: str, is_causal: bool | None,
            window: list[int] | None, softcap: float | None, scale: float | None, backend: str | None,
            precision: str, cu_seqlens_q: torch.Tensor | None = None, cu_seqlens_k: torch.Tensor | None = None,
            max_seqlen_q: int | None = None, max_seqlen_k: int | None = None) -> torch.Tensor:
        return _features_call(q, k, v, attn_mask, sinks, causal, causal_alignment, is_causal, window, softcap, scale,
                              backend, precision, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k).contiguous()

    @forward_op.register_fake
    def _fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *options: Any, **named: Any) -> torch.Tensor:
        return q.new_empty((*q.shape[:-1], v.shape[-1]))  # the options as the op's schema has them

    @torch.library.custom_op(f"{_NAMESPACE}::{name}_backward", mutates_args=(), tags=tags)
    def backward_op(  # noqa: PLR0917 - op schema
        grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
            sinks: torch.Tensor | None, causal: bool, causal_alignment: str, is_causal: bool | None,
            window: list[int] | None, softcap: float | None, scale: float | None, backend: str | None,
            precision: str, cu_seqlens_q: torch.Tensor | None = None, cu_seqlens_k: torch.Tensor | None = None,
            max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        # q, k, v and the sinks' gradients (an empty tensor without sinks; never the mask's or the offsets') by
        # recomputing the forward
        with _autograd_on(), torch.enable_grad():
            qd, kd, vd = (t.detach().requires_grad_() for t in (q, k, v))
            sd = None if sinks is None else sinks.detach().requires_grad_()
            out = _features_call(qd, kd, vd, attn_mask, sd, causal, causal_alignment, is_causal, window, softcap,
                                 scale, backend, precision, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
            grads = torch.autograd.grad(out, (qd, kd, vd) if sd is None else (qd, kd, vd, sd), grad)
        ds = grads[3].contiguous() if sd is not None else q.new_empty(0)
        return grads[0].contiguous(), grads[1].contiguous(), grads[2].contiguous(), ds

    @backward_op.register_fake
    def _backward_fake(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,  # noqa: PLR0917 - op
                       attn_mask: torch.Tensor | None, sinks: torch.Tensor | None, *options: Any,
                       **named: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
        return dq, dk, dv, (q.new_empty(0) if sinks is None else torch.empty_like(sinks))

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        q, k, v, attn_mask, sinks, *options = inputs
        ctx.save_for_backward(q, k, v, attn_mask, sinks)
        ctx.options = tuple(options)

    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, attn_mask, sinks = ctx.saved_tensors
        dq, dk, dv, ds = backward_op(grad.contiguous(), q, k, v, attn_mask, sinks, *ctx.options)
        return (dq, dk, dv, None, None if sinks is None else ds) + (None,) * len(ctx.options)

    forward_op.register_autograd(backward, setup_context=setup_context)
    return forward_op


#: a call with features on ``[B, Hq, Sq, D]`` / ``[B, Hkv, Sk, D]``: a mask ``[B or 1, Hq or 1, Sq or 1, Sk]`` (bool or
#: additive float), sinks ``[Hq]``, window sides ``[left, right]`` (-1 unbounded), a softcap, top-left alignment;
#: returns a contiguous ``[B, Hq, Sq, Dv]``. Captured in Inductor's CUDA graphs like any op
attention_features_op = _features_ops("attention_features", ())
#: the same for packed ``[total_q, Hq, D]`` / ``[total_k, Hkv, D]`` sequences with int32 ``cu_seqlens_q/k`` ``[batch +
#: 1]`` (varlen), checked at run time (their last values read on the host): returns a contiguous ``[total_q, Hq,
#: Dv]``; kept out of CUDA graphs (:data:`_CUDAGRAPH_UNSAFE`)
attention_varlen_op = _features_ops("attention_varlen", _CUDAGRAPH_UNSAFE)
