"""``attnforge warmup`` as a library call: compile and measure a model's shape classes ahead of time, as a deploy
step, so that serving never pays a first use (issue 30).

Per shape (:mod:`attnforge.bench.models` reads a ``config.json`` into shapes, :mod:`attnforge.bench.grid` the
``--shapes`` sets; the same readers as ``attnforge bench``), one call of :func:`attnforge.attention` on random
tensors (:func:`attnforge.bench.run.random_inputs`) inside ``autotune(background=False)``: the class is measured
by first-use measurement itself (:func:`attnforge.dispatch.autotune.tune`: the one timing harness,
:mod:`attnforge.bench.timing`, and the records the dispatcher reads), every candidate's first call compiles it
into the persistent compile caches (:mod:`attnforge._system.compile_cache`), and the route then chosen serves
the call (and its backward for fwd+bwd shapes). A model with a sliding window or a logit softcap is warmed with
those features too (the window on causal shapes: Gemma 2 alternates windowed and global layers).

Each shape is called in its own layout (``AttentionShape.layout``: ``[B, H, S, D]``, or ``[B, S, H, D]`` with
``layout="bshd"``, as diffusers' and flash-attn-style callers pass it): a kernel's first call at other strides
may build again what it built for the other layout. Measured on an H200 (2026-11-28, docs/benchmarks.md "twelfth
session"): after a warm-up in ``[B, H, S, D]``, SDPA's first fwd+bwd call on ``[B, S, H, D]`` inputs took 126-154
ms, against 3 ms in the warmed layout. Each layout is also measured on its own (``autotune(layouts=True)``): the
dispatcher keeps and reads measurements per memory layout, and a kernel's rank can differ between them (H200,
2026-11-29: FA3 0.960x SDPA on MHA 1k fwd+bwd in ``[B, H, S, D]``, 1.080x in ``[B, S, H, D]``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from attnforge._system import compile_cache
from attnforge.dispatch import autotune
from attnforge.dispatch.features import one_line
from attnforge.types.shapes import AttentionShape, Layout, Mode


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmedClass:
    """One warmed call.

    Attributes:
        shape: its shape; features: the feature keywords it used (``window``, ``softcap``).
        shape_class: the class the dispatcher decides on (records are kept per class).
        chosen: the backend that serves the class now (None when the call raised).
        basis: why (:class:`attnforge.dispatch.explanation.Explanation`'s first basis).
        duration_s: wall time of the warm-up of this call, compiles and measurement included.
        error: the error's first line when the call raised ("" otherwise).
        timed_again: its first rounds left the class contested, and every candidate was timed in up to
            :data:`~attnforge.dispatch.autotune.CONTESTED_ROUNDS` further rounds (within another twice the budget)
            before it was decided.
    """

    shape: AttentionShape
    features: tuple[str, ...]
    shape_class: str
    chosen: str | None
    basis: str
    duration_s: float
    error: str = ""
    timed_again: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmupReport:
    """The result of :func:`warmup`.

    Attributes:
        classes: one entry per warmed call.
        measuring: False when ``ATTNFORGE_AUTOTUNE=0`` turned measurement off (nothing was measured then).
        caches: the compile cache settings (:func:`attnforge._system.compile_cache.ensure`).
        compiled_files: files the compile caches gained during the warm-up (0 in a second run: nothing compiled).
    """

    classes: tuple[WarmedClass, ...]
    measuring: bool
    caches: compile_cache.CompileCaches
    compiled_files: int


def warmup(shapes: Sequence[AttentionShape], *, device: str, window: int | None = None,
           softcap: float | None = None, budget_s: float = 1.0, rounds: int = 5,
           progress: Callable[[AttentionShape], None] | None = None,
           padded_prefill_from: int | None = None, precision: str = "exact") -> WarmupReport:
    """Compile and measure every shape's class now (module docstring).

    Args:
        shapes: ``[B, H, S, D]`` sizes, dtype, causal and mode of each call (:class:`AttentionShape`).
        device: ``"cuda"`` or ``"cpu"`` (a torch device string).
        window: a model's sliding window (keys per query), also warmed on causal shapes; None: none.
        softcap: a model's logit softcap, used on every call; None: none.
        budget_s, rounds: as :func:`attnforge.autotune`.
        progress: called before each shape (the CLI's status line).
        padded_prefill_from: the shortest prefill a framework integration serves as varlen sequences when its batch
            is left-padded (the transformers integration's ``PREFILL_VARLEN_MIN``); a causal forward shape with
            ``Sq == Sk`` at least that long is also warmed as such a varlen call (:func:`_padded_prefill`), so the
            first padded prompt compiles nothing (FlashAttention-4 compiles its varlen kernel on its first call:
            seconds). None: not warmed.
        precision: the ``precision`` the model's calls pass to :func:`attnforge.attention`: ``"allow_quantized"``
            warms the classes SageAttention's int8/fp8 kernels may serve (their candidates timed beside the exact
            ones, their kernels compiled). After an exact warm-up alone, a quantized class's first call took 0.96-1.81 s
            on an H200 (2026-12-03, docs/benchmarks.md "forty-fourth session": its first use timed SageAttention,
            whose kernels compile on their first calls, while the call waited), and 8 ms once those were built.

    Returns:
        The report; a call that raises is an entry with its error, not an exception.
    """
    import torch

    from attnforge.bench.run import random_inputs
    from attnforge.dispatch import runtime

    # its own tensors, with autograd for fwd+bwd shapes, even where the caller warms up inside torch.inference_mode
    # (a server's start-up may): there a backward recorded nothing and every fwd+bwd class failed
    with torch.inference_mode(False), torch.enable_grad():
        return _warmup(shapes, device=device, window=window, softcap=softcap, budget_s=budget_s, rounds=rounds,
                       progress=progress, padded_prefill_from=padded_prefill_from, inputs=random_inputs,
                       runtime=runtime, precision=precision)


def _warmup(shapes: Sequence[AttentionShape], *, device: str, window: int | None, softcap: float | None,
            budget_s: float, rounds: int, progress: Callable[[AttentionShape], None] | None,
            padded_prefill_from: int | None, inputs: Any, runtime: Any, precision: str = "exact") -> WarmupReport:
    """:func:`warmup`'s body, in the grad mode it sets."""
    caches = compile_cache.ensure()
    before = compile_cache.count_artifacts(caches.folders)
    out: list[WarmedClass] = []
    packed_seen: set[tuple[Any, ...]] = set()
    with runtime.autotune(budget_s=budget_s, rounds=rounds, background=False, compiling=True, layouts=True,
                          contested_rounds=autotune.CONTESTED_ROUNDS):
        measuring = autotune.active(device.split(":", maxsplit=1)[0]) is not None
        for shape in shapes:
            if progress is not None:
                progress(shape)
            variants: list[dict[str, Any]] = [{"softcap": softcap} if softcap else {}]
            if window and shape.causal and shape.seqlen_k > window:
                variants.append({**variants[0], "window": (window - 1, 0)})
            packed = (shape.batch, shape.heads_q, shape.heads_kv, shape.seqlen_q, shape.head_dim, shape.dtype)
            if (padded_prefill_from is not None and shape.causal and shape.mode is Mode.FWD
                    and shape.seqlen_q == shape.seqlen_k >= padded_prefill_from and packed not in packed_seen):
                packed_seen.add(packed)  # packed calls have no layout: one per shape, whatever layouts are warmed
                variants.append({**variants[0], "varlen": True})
            for kw in variants:
                out.append(_warm(shape, kw, device=device, inputs=inputs, runtime=runtime, precision=precision))
    _ask_mask_kernels(shapes, device)
    return WarmupReport(classes=tuple(out), measuring=measuring, caches=caches,
                        compiled_files=compile_cache.count_artifacts(caches.folders) - before)


def _ask_mask_kernels(shapes: Sequence[AttentionShape], device: str) -> None:
    """The SDPA adapter's question whether SDPA's kernels zero a masked call's rows that see no key
    (:func:`attnforge.backends.sdpa.ask_mask_kernels`), asked for each dtype and head dims of ``shapes``: a padded
    batch's first masked call would otherwise ask it (three probe calls, a cuDNN graph build among them), and for
    a forward-and-backward shape the same with gradients (a padded training batch's first call). A device that fails
    here leaves the question to that call."""
    import torch

    from attnforge.backends.sdpa import ask_mask_kernels

    for dtype, head_dim, head_dim_v, grad in sorted({(s.dtype, s.head_dim, s.dv, s.mode is Mode.FWD_BWD)
                                                     for s in shapes}):
        try:
            ask_mask_kernels(device, getattr(torch, dtype), head_dim, head_dim_v, grad=grad)
        except RuntimeError:
            return


def _warm(shape: AttentionShape, kw: dict[str, Any], *, device: str, inputs: Any, runtime: Any,
          precision: str = "exact") -> WarmedClass:
    start = time.perf_counter()
    names = tuple(sorted(kw))
    if precision != "exact":
        kw = {**kw, "precision": precision}
    before = autotune.timed_again(runtime.get_dispatcher())
    try:
        q, k, v, dout = inputs(shape, 1, device)[0]
        if kw.get("varlen"):
            q, k, v, kw = _padded_prefill(q, k, v, {key: val for key, val in kw.items() if key != "varlen"})
        elif shape.layout is Layout.BSHD:  # the same values laid out [B, S, H, D], contiguous, as such callers pass
            q, k, v = (t.detach().transpose(1, 2).contiguous().requires_grad_(t.requires_grad) for t in (q, k, v))
            dout = None if dout is None else dout.transpose(1, 2).contiguous()
            kw = {**kw, "layout": "bshd"}
        result = runtime.attention(q, k, v, causal=shape.causal, **kw)
        if shape.mode is Mode.FWD_BWD:
            result.backward(dout)
        explained = runtime.explain(q, k, v, causal=shape.causal, **kw)
    except Exception as exc:  # a shape this machine cannot run (out of memory): reported, the rest goes on
        return WarmedClass(shape=shape, features=names, shape_class=str(shape.shape_class), chosen=None, basis="",
                           duration_s=time.perf_counter() - start, error=one_line(exc))
    after = autotune.timed_again(runtime.get_dispatcher())
    # this call's class only: the worker thread may time another class again meanwhile (ATTNFORGE_AUTOTUNE=background)
    again = any(n > before.get(key, 0) and key[1] == explained.shape_class for key, n in after.items())
    return WarmedClass(shape=shape, features=names, shape_class=explained.shape_class, chosen=explained.chosen,
                       basis=explained.basis[0] if explained.basis else "", duration_s=time.perf_counter() - start,
                       timed_again=again)


def _padded_prefill(q: Any, k: Any, v: Any, kw: dict[str, Any]) -> tuple[Any, Any, Any, dict[str, Any]]:
    """``q [B, Hq, S, D]``, ``k``, ``v`` as a left-padded prefill's varlen call (the transformers integration's
    ``_padded_prefill``): packed ``[B * S, H, D]``, each row one run of padding (an eighth of it) and one of real
    tokens, causal, with the ``cu_seqlens`` and longest run the integration's rule gives
    (:func:`attnforge.dispatch.inputs.prefill_sequences`); ``kw`` gains those keywords."""
    import torch

    from attnforge.dispatch.inputs import prefill_sequences

    b, _, s, _ = q.shape
    padding = torch.ones(b, s, dtype=torch.bool, device=q.device)
    padding[:, :s // 8] = False
    seqs = prefill_sequences(padding)
    if seqs is None:  # the rule takes every left padding; a row of b * s >= 2**31 tokens it does not
        raise ValueError(f"no varlen sequences for a [{b}, {s}] left-padded prompt")
    packed = [t.detach().transpose(1, 2).reshape(b * s, t.shape[1], t.shape[3]) for t in (q, k, v)]
    return (*packed, {**kw, "cu_seqlens_q": seqs.cu_seqlens, "cu_seqlens_k": seqs.cu_seqlens,
                      "max_seqlen_q": seqs.longest, "max_seqlen_k": seqs.longest})
