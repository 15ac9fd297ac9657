"""FlashAttention-4 without its Python layers: the forward's recorded compiled call, and for calls that need a
gradient one lean ``autograd.Function`` around it and ``_flash_attn_bwd``.

``flash_attn.cute.flash_attn_func`` runs ``FlashAttnFunc.apply``, whose forward calls
``flash_attn.cute.interface._flash_attn_fwd`` (input checks, the compile key, the compiled-kernel cache, the
TVM-FFI call). When no gradient is needed the autograd node does nothing but cost host time, so the bound route
calls ``_flash_attn_fwd`` itself with exactly the keywords ``FlashAttnFunc.forward`` passes it (vLLM:
``vllm/vllm_flash_attn/flash_attn_interface.py`` imports ``_flash_attn_fwd`` from the CuTe interface and calls
it directly; docs/research/levers-2026-11-26.md §1). Calls that need a gradient: below.

Replay (:class:`Replayer`): ``_flash_attn_fwd`` itself spends most of FA4's host time (input checks, a
~60-element compile key, the ``call_args`` list) before it calls the compiled TVM-FFI function it finds in
``_flash_attn_fwd.compile_cache``. For a plain call that needs no gradient that function receives
``(q, k, v, out, lse=None, softmax_scale, ...)`` where everything after ``out`` is fixed by the bound signature
(shapes, dtype, device, causal, scale; interface.py:1887-1936), ``out`` is a fresh contiguous ``torch.empty`` (line
873), and nothing runs after the kernel (no split-KV combine, no scheduler metadata: lines 1938-1967). So the second
call of a bound signature (the first, for the varlen lanes) runs ``_flash_attn_fwd`` with its cache wrapped to
record the one compiled call; later calls allocate ``out`` and call the recorded function with the recorded
arguments, as long as q, k and v keep the strides and 16-byte alignment of the recorded call (else
``maybe_contiguous`` and the compile key could differ, and ``_flash_attn_fwd`` serves). The replay is checked bit
for bit against ``_flash_attn_fwd``'s output once per bound signature before it is used; a call that does not fit
(another tensor argument, more than one compiled call, keywords) is never replayed, and nothing is recorded while a
CUDA graph captures.

Varlen replay: a varlen call (:func:`varlen_keywords`: a padded batch's decode step as
:mod:`attnforge.backends._padded_decode` gives it) hands the compiled call three more tensors that change per call,
``cu_seqlens_q``, ``cu_seqlens_k`` and ``seqused_k`` (slots 6, 7 and 9 on an sm90 device, lines 1887-1900; no
``lse``, no scheduler metadata below 257 sequences, line 1336). They are passed to :class:`Replayer` by name: the
recording finds the slots that hold them (the same tensor objects' memory) and a replay puts each call's there. The
call's other per-call keyword, ``max_seqlen_k``, is no argument of the compiled call (lines 1887-1936: tensors, the
scale, the window sizes, the sink, the block-sparse tuple, ``AuxData``, and on sm100 ``max_seqlen_q``), so a replay
keeps no stale length. Measured on an H200 (2026-11-28, docs/benchmarks.md "ninth session",
``decode_probe.py fa4_varlen_decode``, Gemma-2-9B's padded decode call): the replay matched ``_flash_attn_fwd``
bit for bit, 19.4 µs of host time a call against 184.6 through ``_flash_attn_fwd``; no compile over 64 lengths.

Calls that need a gradient (:func:`bind` with ``bwd``): one lean ``autograd.Function``
(:func:`attnforge.backends.bound.differentiable`) in place of ``FlashAttnFunc``. Its forward is the same replay,
recorded with the ``lse`` that ``_flash_attn_fwd`` allocates when an input requires grad (interface.py:886-891) as a
second per-call output: the recorded call's slot that held the returned lse gets a fresh ``torch.empty`` of its shape
each call, and the check compares out and lse bit for bit. Its backward calls ``_flash_attn_bwd`` with exactly what
``FlashAttnFunc.backward`` passes for a plain call (lines 3856-3915: q, k, v, out, dout, lse, the scale, causal,
softcap 0.0, no window, not deterministic, no score/mask mods, aux or block-sparse tensors, no dlse, no sink). What
it saves is the forward's Python work: without grad, ``flash_attn_func`` cost 83-116 µs of host time a call on an
H200 and the replay 14-16 µs (``overhead.py``, docs/benchmarks.md "twenty-third session"; with grad not yet
measured). The backward's own Python work (139-205 µs against 42-78 µs for its compiled calls,
``scripts/gpu/fa4_bwd_probe.py``) stays: its dQ accumulates with bulk reduce-adds
(``flash_bwd_sm90.py``), so a replay could not be checked bit for bit.

Mirrored: the flash-attn-4 4.0.0b36 wheel (PyPI), ``flash_attn/cute/interface.py`` lines 3780-3840
(``FlashAttnFunc.forward``: the keywords of its ``_flash_attn_fwd`` call at lines 3816-3837, and the MLA rewrite
``k is v and D == 512`` before it), line 678 (``_flash_attn_fwd``'s signature; it returns
``(out, lse, p, row_max, o_lo)``) and lines 4145-4210 (``flash_attn_func`` -> ``FlashAttnFunc.apply``). Pinned to
:data:`VERSIONS`; another installed version keeps the public function.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from attnforge.backends._base import graph_capturing
from attnforge.backends.bound import differentiable, other_layout

#: the flash-attn-4 versions whose ``interface.py`` the mapping below was read from
VERSIONS = frozenset({"4.0.0b36"})
#: the module that defines ``_flash_attn_fwd``
INTERFACE = "flash_attn.cute.interface"
#: FlashAttnFunc.forward treats ``k is v`` with this V head dim as MLA (line 3810): never bound directly
MLA_HEAD_DIM = 512


def varlen_keywords(*, scale: float | None, softcap: float | None) -> dict[str, Any]:
    """The fixed keywords of the varlen decode call (:class:`Replayer` with per-call ``cu_seqlens_q``,
    ``cu_seqlens_k``, ``seqused_k`` and ``max_seqlen_k``): one query row per sequence, not causal (one row at the end
    of its keys sees every key), softcap when asked (``_flash_attn_fwd`` takes ``0.0``/None as off, line 848)."""
    return {"max_seqlen_q": 1, "softmax_scale": scale, "causal": False, "softcap": softcap or None}


def forward_keywords(*, scale: float | None, causal: bool) -> dict[str, Any]:
    """The keywords ``FlashAttnFunc.forward`` passes ``_flash_attn_fwd`` for ``flash_attn_func(q, k, v,
    softmax_scale=scale, causal=causal)`` (interface.py:3816-3837 @4.0.0b36, every other argument at
    ``flash_attn_func``'s default; the scale stays None when None: ``_flash_attn_fwd`` defaults it)."""
    return {"qv": None, "softmax_scale": scale, "causal": causal, "window_size_left": None,
            "window_size_right": None, "learnable_sink": None, "softcap": 0.0, "num_splits": 1, "pack_gqa": None,
            "score_mod": None, "mask_mod": None, "aux_tensors": None, "aux_scalars": None,
            "block_sparse_tensors": None, "return_lse": False, "gather_kv_indices": None,
            "gather_bwd_recompute_p": False}


def backward_keywords(*, scale: float | None, causal: bool) -> dict[str, Any]:
    """The keywords ``FlashAttnFunc.backward`` passes ``_flash_attn_bwd`` after ``(q, k, v, out, dout, lse)`` for a
    call that :func:`forward_keywords` describes (interface.py:3888-3909 @4.0.0b36: ``ctx.softmax_scale``,
    ``ctx.causal``, ``ctx.softcap`` positionally, here by name; the window ``(None, None)``; ``dlse`` None, as
    ``return_lse`` is False)."""
    return {"softmax_scale": scale, "causal": causal, "softcap": 0.0, "window_size_left": None,
            "window_size_right": None, "deterministic": False, "score_mod": None, "score_mod_bwd": None,
            "mask_mod": None, "aux_tensors": None, "aux_scalars": None, "block_sparse_tensors": None, "dlse": None,
            "learnable_sink": None}


#: the alignment ``maybe_contiguous`` demands of q, k, v before it would copy them (cute_dsl_utils.py:87-99)
ALIGN_BYTES = 16
#: recording swaps ``_flash_attn_fwd.compile_cache`` for a moment: one recording at a time
_RECORDING = threading.Lock()


@dataclass(frozen=True, slots=True, kw_only=True)
class Replay:
    """The compiled call recorded for one bound signature.

    Attributes:
        kernel: the compiled TVM-FFI function out of ``_flash_attn_fwd.compile_cache``.
        args: its positional arguments; slots 0-3 (q, k, v, out) and the ``named`` ones are None here, filled per
            call (the recording's tensors are not kept alive).
        strides: the strides of the recorded q, k, v (``[B, S, H, D]``, or the varlen ``[N, H, D]``).
        out_shape, out_dtype: the output ``torch.empty`` allocates.
        named: ``(slot, keyword)`` of each per-call tensor the call was given by name (varlen: ``cu_seqlens_q``,
            ``cu_seqlens_k``, ``seqused_k``); empty for a plain call.
        lse_slot, lse_shape, lse_dtype: the returned lse's slot and its ``torch.empty`` (:class:`Replayer` with
            ``lse=True``).
    """

    kernel: Callable[..., Any]
    args: tuple[Any, ...]
    strides: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
    out_shape: tuple[int, ...]
    out_dtype: Any
    named: tuple[tuple[int, str], ...] = ()
    #: the slot of the lse the call allocates and returns (a call that needs a gradient), with its shape and dtype;
    #: None when the call has none
    lse_slot: int | None = None
    lse_shape: tuple[int, ...] = ()
    lse_dtype: Any = None


class Replayer:
    """``fn(q, k, v, **per_call)`` on ``[B, S, H, D]`` tensors (or varlen ``[N, H, D]`` ones with their per-call
    keywords, :func:`varlen_keywords`): the recorded compiled call when it fits, else ``_flash_attn_fwd`` (see the
    module docstring).

    ``record_at``: the call that records (1: the first; a lane that exists because its signature repeats). A plain
    route's binding records at its second call (:func:`bind`): recording runs the kernel twice (the call, then the
    replay checked against it) and synchronises, which a binding that serves one call only (a route bound per call,
    a shape met once) would pay on every call. Measured on an H200 (2026-11-29, docs/benchmarks.md "fifteenth
    session"): Wan-2.1's self-attention through diffusers, bound per call, ran FlashAttention-4's kernel twice a
    call, the step 0.74x diffusers' default."""

    __slots__ = ("calls", "fwd", "keywords", "lse", "record_at", "replay", "tried")

    def __init__(self, fwd: Callable[..., Any], keywords: dict[str, Any], *, record_at: int = 1,
                 lse: bool = False) -> None:
        self.fwd, self.keywords, self.record_at = fwd, keywords, record_at
        #: return ``(out, lse)``: the call needs a gradient, so ``_flash_attn_fwd`` allocates and returns the lse
        self.lse = lse
        self.replay: Replay | None = None
        self.tried = False
        self.calls = 0

    def __call__(self, q: Any, k: Any, v: Any, **per_call: Any) -> Any:
        replay = self.replay
        if replay is not None and (q.stride(), k.stride(), v.stride()) == replay.strides and not (
                q.data_ptr() % ALIGN_BYTES or k.data_ptr() % ALIGN_BYTES or v.data_ptr() % ALIGN_BYTES):
            return _run(replay, q, k, v, per_call)
        if not self.tried:
            self.calls += 1
            if self.calls >= self.record_at:
                return self._record(q, k, v, per_call)
        return self._served(self.fwd(q, k, v, **per_call, **self.keywords))

    def _served(self, result: Any) -> Any:
        """What the caller gets of ``_flash_attn_fwd``'s ``(out, lse, p, row_max, o_lo)``."""
        return (result[0], result[1]) if self.lse else result[0]

    def _record(self, q: Any, k: Any, v: Any, per_call: dict[str, Any]) -> Any:
        """Run ``_flash_attn_fwd`` with its compile cache recording, and keep the replay if it reproduces the
        output (and lse) bit for bit (one synchronisation, so never while a CUDA graph captures)."""
        if graph_capturing():
            return self._served(self.fwd(q, k, v, **per_call, **self.keywords))  # record on a later call
        seen: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
        with _RECORDING:
            if self.tried:  # another thread recorded meanwhile
                return self(q, k, v, **per_call)
            self.tried = True
            cache = getattr(self.fwd, "compile_cache", None)
            if cache is not None:
                self.fwd.compile_cache = _Recorder(cache, seen)  # type: ignore[attr-defined]
            try:
                result = self.fwd(q, k, v, **per_call, **self.keywords)
            finally:
                if cache is not None:
                    self.fwd.compile_cache = cache  # type: ignore[attr-defined]
        out, lse = result[0], (result[1] if self.lse else None)
        named = {n: t for n, t in per_call.items() if isinstance(t, torch.Tensor)}
        replay = _replay_of(seen, (q, k, v), out, named, lse=lse)
        if replay is not None:
            try:
                got = _run(replay, q, k, v, per_call)
                same = (bool(torch.equal(got[0], out) and torch.equal(got[1], lse)) if lse is not None
                        else bool(torch.equal(got, out)))
            except Exception:  # a replay that raises is not used; _flash_attn_fwd serves
                same = False
            self.replay = replay if same else None
        return self._served(result)


def _run(replay: Replay, q: Any, k: Any, v: Any, per_call: dict[str, Any] | None = None) -> Any:
    """The recorded compiled call on new q, k, v (and the per-call tensors in their slots), into a fresh output (as
    ``_flash_attn_fwd`` allocates it); ``(out, lse)`` when the call returns an lse (:attr:`Replay.lse_slot`)."""
    out = torch.empty(replay.out_shape, dtype=replay.out_dtype, device=q.device)
    if not replay.named and replay.lse_slot is None:
        replay.kernel(q.detach(), k.detach(), v.detach(), out, *replay.args[4:])
        return out
    args = [q.detach(), k.detach(), v.detach(), out, *replay.args[4:]]
    for slot, name in replay.named:
        args[slot] = per_call[name]  # type: ignore[index]
    if replay.lse_slot is None:
        replay.kernel(*args)
        return out
    lse = args[replay.lse_slot] = torch.empty(replay.lse_shape, dtype=replay.lse_dtype, device=q.device)
    replay.kernel(*args)
    return out, lse


class _Recorder:
    """Stands in for ``_flash_attn_fwd.compile_cache`` during one call: every compiled function handed out is
    wrapped to record its arguments."""

    def __init__(self, cache: Any, seen: list[tuple[Any, tuple[Any, ...], dict[str, Any]]]) -> None:
        self.cache, self.seen = cache, seen

    def __contains__(self, key: Any) -> bool:
        return key in self.cache

    def __setitem__(self, key: Any, fn: Any) -> None:
        self.cache[key] = fn

    def __getitem__(self, key: Any) -> Any:
        fn = self.cache[key]

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.seen.append((fn, args, kwargs))
            return fn(*args, **kwargs)

        return recorded


def _replay_of(seen: list[tuple[Any, tuple[Any, ...], dict[str, Any]]], qkv: tuple[Any, Any, Any],
               out: Any, named: dict[str, Any] | None = None, *, lse: Any = None) -> Replay | None:
    """The recorded call as a :class:`Replay`, or None when it cannot be replayed faithfully: not exactly one
    compiled call, keywords, slots 0-3 not the caller's q, k, v (uncopied) and the returned out, or any other
    tensor among the arguments than the ``named`` per-call ones, each found once, as given, and the returned
    ``lse`` (when given) once (an lse nobody returned, scheduler buffers, a copied cu_seqlens: per-call state the
    replay would not renew)."""
    named = named or {}

    if len(seen) != 1:
        return None
    kernel, args, kwargs = seen[0]
    if kwargs or len(args) < 5:
        return None
    for got, want in zip(args[:4], (*qkv, out), strict=True):
        if not (isinstance(got, torch.Tensor) and _same_tensor(got, want)):
            return None
    if not out.is_contiguous():
        return None
    slots: list[tuple[int, str]] = []
    lse_slot = None
    for slot, arg in enumerate(args[4:], start=4):
        if not isinstance(arg, torch.Tensor):
            continue
        if lse is not None and lse_slot is None and _same_tensor(arg, lse):
            lse_slot = slot
            continue
        name = next((n for n, t in named.items() if _same_tensor(arg, t)), None)
        if name is None or any(n == name for _, n in slots):
            return None
        slots.append((slot, name))
    if len(slots) != len(named) or (lse is not None and (lse_slot is None or not lse.is_contiguous())):
        return None  # a per-call tensor the call did not hand over as it was (copied): its slot is unknown
    q, k, v = qkv
    kept = list(args)
    for slot in (0, 1, 2, 3, *(s for s, _ in slots), *(() if lse_slot is None else (lse_slot,))):
        kept[slot] = None  # filled per call: the recording's tensors (a K/V cache's storage) are not kept alive
    return Replay(kernel=kernel, args=tuple(kept), strides=(q.stride(), k.stride(), v.stride()),
                  out_shape=tuple(out.shape), out_dtype=out.dtype, named=tuple(slots), lse_slot=lse_slot,
                  lse_shape=() if lse is None else tuple(lse.shape), lse_dtype=None if lse is None else lse.dtype)


def _same_tensor(got: Any, want: Any) -> bool:
    """Whether the compiled call received ``want`` as it was given (the same memory, shape, strides and dtype: not
    a copy ``_flash_attn_fwd`` made)."""
    return bool(got.data_ptr() == want.data_ptr() and got.shape == want.shape and got.stride() == want.stride()
                and got.dtype == want.dtype)


def bind(fwd: Callable[..., Any], *, scale: float | None, causal: bool, bshd: bool,
         bwd: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """``fn(q, k, v)``: the recorded compiled call (:class:`Replayer`), else ``_flash_attn_fwd`` called directly;
    with ``bwd``, inside one autograd node (:func:`attnforge.backends.bound.differentiable`; a call that needs a
    gradient).

    Args:
        fwd: ``flash_attn.cute.interface._flash_attn_fwd`` of a version in :data:`VERSIONS`.
        scale: softmax scale or None (``1/sqrt(D)``).
        causal: bottom-right causal.
        bshd: the caller's tensors are ``[B, S, H, D]``; else ``[B, H, S, D]``, handed over as
            ``transpose(1, 2)`` views, and the ``[B, Sq, Hq, Dv]`` output returned as a view the same way.
        bwd: ``flash_attn.cute.interface._flash_attn_bwd`` of the same version, for a route that needs a gradient;
            None for one that needs none.

    Returns:
        The bound call; fp16/bf16 CUDA tensors in, the output in q's dtype and the caller's layout (with ``bwd``,
        differentiable in q, k and v; its ``replayer`` attribute is the forward's :class:`Replayer`). Its second
        call per binding records and checks the replay (one device synchronisation; the first runs
        ``_flash_attn_fwd``); later calls allocate only the output (and the lse) and never synchronise.
    """
    if bwd is None:
        run = Replayer(fwd, forward_keywords(scale=scale, causal=causal), record_at=2)
        return run if bshd else other_layout(run)
    train = Replayer(fwd, forward_keywords(scale=scale, causal=causal), record_at=2, lse=True)
    keywords = backward_keywords(scale=scale, causal=causal)

    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        out, lse = train(q, k, v)
        return out, (q, k, v, out, lse)

    def backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,  # noqa: PLR0917 - saved tensors
                 lse: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return bwd(q, k, v, out, dout, lse, **keywords)[:3]  # type: ignore[no-any-return]

    trained = differentiable(forward, backward, bshd=bshd)
    trained.replayer = train  # type: ignore[attr-defined]
    return trained
