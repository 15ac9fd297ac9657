"""What a backend that raised on an accepted call is skipped for (issue 31: one unusual call must not poison its
shape class for the process).

The rule (docs/features.md, "When a backend raises"): an unforced backend that raises on a call is skipped for
that call's exact *signature* (:func:`failure_signature`) for the rest of the process, and the next backend of
the route serves it; other calls of the same shape class keep it. Only once it raised on :data:`CLASS_AFTER`
distinct signatures of one shape class is it skipped for the whole class (a kernel that fails on everything
there would otherwise be tried, and raise, once per new signature). At most :data:`DEMOTED_MAX` signatures are
remembered per backend, the oldest forgotten first (then tried again once). Thread-safe.

A call made inside something the signature does not describe (:func:`unrecorded_context` lists what) is served
by the next backend as well, but nothing is remembered: SDPA raising on ``torch.func.jvp`` (no forward-AD formula
for its CPU kernel, torch 2.13), or inside ``sdpa_kernel`` with none of the allowed kernels able to serve, must not
hand every later plain call of that signature to the exact math.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from attnforge.backends.adapter import AttentionCall
from attnforge.dispatch.features import one_line
from attnforge.dispatch.policy import Decision, Rejection, class_of_call

#: a backend that raised on this many distinct call signatures of one shape class is skipped for the whole class
CLASS_AFTER = 3
#: most call signatures a backend is remembered to have raised on
DEMOTED_MAX = 256


def failure_signature(call: AttentionCall | None, scale: float | None,
                      opts: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """The exact signature a backend that raised on a call is skipped for: the call's description (sizes,
    dtype, device, causal, grad, precision, features, Dv, alignment), the scale, and each feature keyword, a
    tensor by its shape, dtype, strides and device (a mask's shape, not its values), anything else by value
    (window sides, softcap, dropout_p)."""
    parts: list[Any] = [call, scale]
    given = opts or {}
    for name in sorted(given):
        value = given[name]
        shape = getattr(value, "shape", None)
        if shape is not None:
            value = (tuple(shape), str(value.dtype), tuple(value.stride()), str(value.device))
        parts.append((name, value))
    return tuple(parts)


def unrecorded_context(q: Any, k: Any, v: Any) -> str | None:
    """What a failing call ran inside that its signature (:func:`failure_signature`) does not hold, or None.

    A backend's failure there says nothing about the same signature outside it, so it is not remembered:
    ``torch.func`` transforms (``vmap``, ``grad``, ``jvp``: functorch's interpreter stack), forward-mode AD
    (``torch.autograd.forward_ad.dual_level``), a Python dispatch mode (``FakeTensorMode``, ``FlopCounterMode``,
    a user's ``TorchDispatchMode``), an ``sdpa_kernel`` context that leaves out some of SDPA's kernels (SDPA
    raises "No viable backend" there; outside it SDPA serves), a CUDA graph capture (a kernel that synchronises
    raises only there) and tensor subclasses (``DTensor``, a fake tensor) as q, k or v. Runs only after a backend
    raised (never on the hot path)."""
    import torch
    from torch.autograd import forward_ad
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    from attnforge.backends._base import graph_capturing
    from attnforge.backends.sdpa_original import kernels_restricted

    if torch._C._are_functorch_transforms_active():
        return "a torch.func transform (vmap, grad, jvp)"
    if forward_ad._current_level >= 0:
        return "forward-mode AD (torch.autograd.forward_ad.dual_level)"
    mode = _get_current_dispatch_mode()
    if mode is not None:
        return f"a Python dispatch mode ({type(mode).__name__})"
    if kernels_restricted():
        return "an sdpa_kernel context (SDPA's kernels restricted)"
    if graph_capturing():
        return "a CUDA graph capture"
    for t in (q, k, v):
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            return f"a tensor subclass ({type(t).__name__})"
    return None


def class_key(call: AttentionCall | None) -> str:
    """The shape class a backend is skipped for after :data:`CLASS_AFTER` signatures of it: the bench class,
    features included (a backend that raises on windowed calls keeps the plain calls of the same sizes);
    ``"empty"`` for a zero-sized call."""
    return "empty" if call is None else str(class_of_call(call))


class FailureMemory:
    """The backends that raised at run time in this process: per signature, and per shape class past
    :data:`CLASS_AFTER` signatures of it.

    Attributes:
        demoted: name -> {signature: (shape class, the error's first line)}, oldest first.
        broken: name -> {shape class: the error's first line}: skipped for the whole class.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.demoted: dict[str, OrderedDict[tuple[Any, ...], tuple[str, str]]] = {}
        self.broken: dict[str, dict[str, str]] = {}

    def skipped(self, signature: tuple[Any, ...]) -> dict[str, str]:
        """The backends that raised on ``signature`` before, with the error's first line."""
        if not self.demoted:
            return {}
        with self._lock:
            return {name: seen[signature][1] for name, seen in self.demoted.items() if signature in seen}

    def broken_in(self, cls: str) -> dict[str, str]:
        """The backends skipped for the whole shape class ``cls``, with the error's first line."""
        with self._lock:
            return {name: by_class[cls] for name, by_class in self.broken.items() if cls in by_class}

    def demote(self, name: str, exc: Exception, call: AttentionCall | None, scale: float | None,
               opts: Mapping[str, Any] | None, *, context: str | None = None) -> str | None:
        """Remember that ``name`` raised ``exc`` on a call (``call``, ``scale`` and feature keywords ``opts``,
        as a route holds them) and warn once, in one line naming what it is skipped for. Returns what
        :meth:`record` returns. ``context``: what the call ran inside that its signature does not hold
        (:func:`unrecorded_context`); then nothing is remembered, the warning says so, and None is returned."""
        error, cls = one_line(exc), class_key(call)
        if context is not None:
            warnings.warn(f"attnforge: attention backend {name!r} raised {error}; the call ran inside {context}, so"
                          f" the next backend serves it and nothing is remembered (calls outside it keep {name!r})",
                          RuntimeWarning, stacklevel=5)
            return None
        outcome = self.record(name, error, failure_signature(call, scale, opts), cls)
        if outcome == "class":
            what = (f"it raised on {CLASS_AFTER} different call signatures of shape class {cls}, so it is skipped"
                    " for that class")
        elif outcome == "signature":
            what = f"it is skipped for this call signature ({describe_signature(call)})"
        else:
            return None
        warnings.warn(f"attnforge: attention backend {name!r} raised {error}; {what} for the rest of this process"
                      " and the next backend serves the call", RuntimeWarning, stacklevel=5)
        return outcome

    def record(self, name: str, error: str, signature: tuple[Any, ...], cls: str) -> str | None:
        """Remember that ``name`` raised ``error`` on ``signature`` (of shape class ``cls``). Returns
        ``"signature"`` (skipped for it now), ``"class"`` (skipped for the class now) or None (known already)."""
        with self._lock:
            seen = self.demoted.setdefault(name, OrderedDict())
            if signature in seen:
                return None
            seen[signature] = (cls, error)
            while len(seen) > DEMOTED_MAX:
                seen.popitem(last=False)
            if sum(1 for c, _ in seen.values() if c == cls) < CLASS_AFTER:
                return "signature"
            by_class = self.broken.setdefault(name, {})
            if cls in by_class:
                return None
            by_class[cls] = error
            return "class"


def describe_signature(call: AttentionCall | None) -> str:
    """``B x Hq x Sq x D dtype +features``: a call signature in a warning line."""
    if call is None:
        return "empty"
    feats = f" +{','.join(sorted(call.features))}" if call.features else ""
    return f"{call.batch}x{call.heads_q}x{call.seqlen_q}x{call.head_dim} {call.dtype}{feats}"


def without_skipped(decision: Decision, skipped: Mapping[str, str], last_resort: str | None
                    ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[Rejection, ...], tuple[str, ...]]:
    """A decision's order, basis and rejected backends less the ``skipped`` ones (they join the rejected with
    their error), ``last_resort`` ending an order left empty (as the route does), and a note per skipped backend
    for :class:`~attnforge.dispatch.explanation.Explanation` ("flash-attn-3 raised on this signature: ...;
    served by sdpa")."""
    kept = [(n, b) for n, b in zip(decision.order, decision.basis, strict=True) if n not in skipped]
    if not kept and last_resort is not None:
        kept.append((last_resort, "last resort: the exact math (float32 in torch) serves what every backend"
                                  " before it raised on"))
    dropped = [n for n in decision.order if n in skipped]
    served = kept[0][0] if kept else "none"
    notes = tuple(f"{n} raised on this signature: {skipped[n]}; served by {served}" for n in dropped)
    rejected = (*decision.rejected, *(Rejection(backend=n, reasons=(
        f"raised on this call signature in this process: {skipped[n]}",)) for n in dropped))
    return tuple(n for n, _ in kept), tuple(b for _, b in kept), rejected, notes
