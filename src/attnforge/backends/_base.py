"""What every concrete adapter shares: its capabilities, a lazy import check, and small tensor helpers.

Nothing here imports torch or a backend package at import time; :meth:`AdapterBase.load_error` imports the
backend on first use and remembers the answer, after pointing the JIT compile caches into ``$ATTNFORGE_HOME``
(:mod:`attnforge._system.compile_cache`: FA4 reads them at import).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from attnforge._system.compile_cache import ensure as ensure_compile_caches
from attnforge._system.compile_cache import keep_fa4_folders
from attnforge.backends.adapter import AttentionCall
from attnforge.backends.capabilities import Capabilities

if TYPE_CHECKING:
    import torch

T = TypeVar("T")
_V = TypeVar("_V")


@dataclass(frozen=True, slots=True, kw_only=True)
class Requirement:
    """What must import (and at which distribution version) for a backend to be usable.

    Attributes:
        modules: modules to import, in order (the backend's package, then native modules its package would
            otherwise hide, like ``xformers._C``).
        distributions: PyPI distributions that may provide the package (the first one installed is checked).
        version_spec: the versions of that distribution this backend id covers ("" = any).
    """

    modules: tuple[str, ...]
    distributions: tuple[str, ...] = ()
    version_spec: str = ""


@dataclass(slots=True, kw_only=True)
class AdapterBase:
    """Capabilities plus a remembered import check; subclasses implement ``__call__``."""

    name: str
    caps: Capabilities
    requirement: Requirement
    _load_error: list[str | None] = field(default_factory=list, repr=False)
    _modules: dict[int, Any] = field(default_factory=dict, repr=False)

    def load_error(self) -> str | None:
        """None when the backend's package imports here, else why not (computed once)."""
        if not self._load_error:
            self._load_error.append(_check_requirement(self.requirement))
        return self._load_error[0]

    def unsupported_reasons(self, call: AttentionCall) -> list[str]:
        """Pure: every reason this backend cannot serve ``call`` (from its declared capabilities)."""
        return self.caps.unsupported_reasons(call)

    def serving_notes(self, call: AttentionCall) -> tuple[str, ...]:
        """Pure: how this backend serves ``call`` where it differs from what its name says (``explain()``'s notes;
        SDPA's decode steps, for one); none by default."""
        return ()

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None) -> torch.Tensor:
        """Run the kernel (see :mod:`attnforge.backends.adapter` for shapes and the causal rule)."""
        raise NotImplementedError

    def settle_repeated(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> bool:
        """Told that plain calls (no feature; ``causal`` as given) of exactly these tensors' shapes repeat (``[B,
        H, S, D]``, as ``__call__`` receives them; the in-situ check saw nothing else in its sample): serve them
        from now on as a long run of them is served, where that differs from a first meeting; True when it does
        (the next call may then build what a repeated shape reuses). None differs by default."""
        return False

    def installed_version(self) -> str | None:
        """The version of the first installed distribution of ``requirement.distributions`` (package metadata,
        no import); None when none is installed. The direct kernel entries are pinned by it."""
        from attnforge.probe.backends import installed_versions  # the one reader of installed versions

        return next((version for _, version in installed_versions(self.requirement.distributions)), None)

    def module(self, index: int = 0) -> Any:
        """The imported module ``requirement.modules[index]``, imported once per adapter and then held
        (``importlib.import_module`` costs about a microsecond per call; this runs on every call)."""
        found = self._modules.get(index)
        if found is None:
            ensure_compile_caches()  # FA4 reads its cache variables at import
            found = self._modules[index] = importlib.import_module(self.requirement.modules[index])
            keep_fa4_folders()  # FA4's caches make a removed folder again (compile_cache.keep_fa4_folders)
        return found


def _check_requirement(req: Requirement) -> str | None:
    from attnforge.probe.backends import installed_versions  # the one reader of installed versions

    ensure_compile_caches()  # before the first import: FA4 reads its cache variables then
    for name in req.modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # ImportError, OSError (ABI), RuntimeError: any of them means "not usable"
            return f"{name} does not import: {type(exc).__name__}: {exc}"
    keep_fa4_folders()  # after the imports: FA4's caches make a removed folder again
    if req.version_spec and req.distributions:
        spec = SpecifierSet(req.version_spec)
        for dist, text in installed_versions(req.distributions):  # the first one installed is checked
            try:
                version = Version(text)
            except InvalidVersion:
                return f"{dist} has an unreadable version {text!r}"
            if version not in spec:
                return f"{dist} {version} is installed; this backend needs {dist}{spec}"
            return None
        return f"none of {', '.join(req.distributions)} is installed"
    return None


def expand_kv(k: torch.Tensor, v: torch.Tensor, heads_q: int, *,
              dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Repeat K/V heads so Hkv == Hq (GQA for kernels that need equal heads): ``[B, Hkv, S, D]`` in,
    ``[B, Hq, S, D]`` out (``dim=2``: ``[B, S, Hkv, D]`` in, ``[B, S, Hq, D]`` out)."""
    groups = heads_q // k.shape[dim]
    if groups == 1:
        return k, v
    return k.repeat_interleave(groups, dim=dim), v.repeat_interleave(groups, dim=dim)


def device_state(exc: BaseException) -> bool:
    """Whether a kernel's error is the device's state (out of memory, an accelerator or CUDA error), which reaches
    the caller and turns nothing off, rather than the kernel refusing these inputs (which a lean path remembers and
    leaves to another kernel)."""
    import torch

    return isinstance(exc, torch.OutOfMemoryError | getattr(torch, "AcceleratorError", torch.OutOfMemoryError)) or (
        str(exc).startswith("CUDA error"))


def saving_tensors() -> bool:
    """Whether saved-tensor default hooks are set on this thread (the non-reentrant ``torch.utils.checkpoint``'s
    forward and recomputation, ``save_on_cpu``): torch's private query; False where it is gone."""
    import torch

    try:
        return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None
    except (AttributeError, TypeError, RuntimeError):
        return False


def callers_own(exc: BaseException) -> bool:
    """Whether an exception out of a backend's call is the caller's own control flow, not the backend failing:
    ``torch.utils.checkpoint``'s signal that a recomputation has every tensor it needs (``_StopRecomputationError``,
    raised by the saved-tensor hooks of non-reentrant activation checkpointing, ``use_reentrant=False``, so the
    recomputed forward stops early). It reaches the caller as it is: no other backend tries the call and nothing is
    remembered. Taken for a failure, it skipped SDPA for the call's signature and ran the exact math inside the
    stopped recomputation, whose hooks then raised "Unexpected state: target_frame.early_stop is set" (2026-12-02).
    Also its ``CheckpointError`` (a recomputation that saved other tensors than its forward, raised by the same
    hooks): the caller's checkpointed step failing, not the backend; taken for a backend's failure (a
    ``RuntimeError``), it skipped healthy backends for the signature, down to the exact math (review, 2026-12-02).
    By name: ``_StopRecomputationError`` is private to torch."""
    cls = type(exc)
    return cls.__module__ == "torch.utils.checkpoint" and cls.__name__ in ("_StopRecomputationError",
                                                                             "CheckpointError")


def records_grad(*tensors: Any) -> bool:
    """Whether autograd records a call on ``tensors`` (grad mode on and one of them requires grad; None entries
    ignored): the one rule for "this call needs a backward"."""
    import torch

    if not torch.is_grad_enabled():
        return False
    for t in tensors:  # noqa: SIM110 (a loop, not any() over a generator: ~40% less host time, on per-call paths)
        if getattr(t, "requires_grad", False):
            return True
    return False


def host_to_device(values: Any, device: Any) -> torch.Tensor:
    """A host array (``numpy.ndarray``) as a tensor of its dtype on ``device``, copied up without waiting for the
    device: on CUDA from pinned memory with ``non_blocking=True`` (torch's copy of pageable memory ends in a
    ``cudaStreamSynchronize``, which stops the host until every queued kernel has run, so the device then idles
    while the host queues the next ones); torch's pinned-memory allocator keeps the buffer until the copy is done.
    Elsewhere a plain copy. Measured on an H200 (2026-11-30, docs/benchmarks.md "twentieth session",
    ``train_profile.py --padded``): a Llama-3-8B-shaped 2-layer padded forward whose varlen route made two such
    copies and one offsets read had 6.8 ms of device idle time against 3.7 for transformers' own call."""
    import torch

    host = torch.from_numpy(values)
    dev = torch.device(device)
    if dev.type != "cuda":
        return host.to(dev)
    return host.pin_memory().to(dev, non_blocking=True)


def four_dims(t: torch.Tensor) -> torch.Tensor:
    """``t`` (a mask, or which rows see a key: broadcastable to ``[B, H, Sq, Sk]``) as a view with leading
    dimensions of size 1 up to four; itself when it has four."""
    return t if t.dim() >= 4 else t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))


def graph_capturing() -> bool:
    """True while a CUDA graph captures on the current stream: what a captured kernel writes exists only once the
    graph replays, and nothing may synchronise; and while an attnforge op runs in the warm-up of
    ``torch.compile``'s CUDA graphs (:func:`cudagraph_warmup`), where nothing made may be kept either. A capture
    needs CUDA initialized in this process, which is asked first: ``torch.cuda.is_available()`` reads the
    environment on every call (~1 µs of the 2.3 this took on an H200's host, 2026-11-28, ``decode_probe.py
    host_costs``), and every decode step's layers ask this."""
    import torch

    return bool(torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()) or _WARMING.get()  # type: ignore[no-untyped-call]


#: set by :func:`cudagraph_warmup` around an op's real implementation run by Inductor's CUDA graph trees' warm-up
_WARMING: contextvars.ContextVar[bool] = contextvars.ContextVar("attnforge_cudagraph_warmup", default=False)


@contextlib.contextmanager
def cudagraph_warmup(t: Any) -> Iterator[None]:
    """Around the real implementation of an attnforge op (:mod:`attnforge.dispatch._op`) on ``t``'s device: inside
    the warm-up of ``torch.compile(mode="reduce-overhead")``'s CUDA graph trees, :func:`graph_capturing` is True,
    so what the call prepares is made for the call and kept nowhere, as under capture.

    Why: the warm-up runs the compiled code eagerly with every allocation in the graphs' private memory pool, then
    checks that each live block of the pool is an output; a mask's derivations kept for the next layer (a bool
    mask's additive form, its rows that see a key) failed that check: "Detected 3 tensor(s) in the cudagraph pool
    not tracked as outputs" (H200, torch 2.11, 2026-12-01, a masked call under ``mode="reduce-overhead"``). Asked
    of ``torch._inductor.cudagraph_trees``' manager of the device (its ``in_warmup`` state and its stream, the one
    the warm-up runs on: torch/_inductor/cudagraph_trees.py, ``CUDAGraphTreeManager.run_eager`` and
    ``_use_cuda_memory_pool_manager``, torch 2.11-2.13); where that module is not loaded, or is another shape,
    nothing changes."""
    if not _in_cudagraph_warmup(t):
        yield
        return
    token = _WARMING.set(True)
    try:
        yield
    finally:
        _WARMING.reset(token)


def _in_cudagraph_warmup(t: Any) -> bool:
    import sys

    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    device: Any = getattr(t, "device", None)
    if trees is None or getattr(device, "type", None) != "cuda":
        return False
    try:
        import torch

        index = device.index if device.index is not None else torch.cuda.current_device()
        manager = trees.get_manager(index, create_if_none_exists=False)
        return bool(manager is not None and manager.in_warmup
                    and torch.cuda.current_stream(index) == manager.stream)
    except Exception:  # another torch's internals: then this is not a warm-up it can see
        return False


def made_for_autograd(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` run with ``torch.inference_mode`` off, for the caches that keep tensors across calls: what it makes is
    a normal tensor, which an ``inference_mode`` call reads as well as one that records gradients (an inference
    tensor could serve only the former). Costs a context switch on a cache miss only."""
    @functools.wraps(fn)
    def make(*args: Any, **kwargs: Any) -> T:
        import torch

        with torch.inference_mode(False):
            return fn(*args, **kwargs)

    return make


def narrowed(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A float tensor (an additive mask, logits) cast to ``dtype`` with its finite values kept finite: clamped to
    ``dtype``'s range first where ``t``'s dtype is wider, so ``torch.finfo(torch.float32).min`` (transformers'
    hiding value) cast to bfloat16 stays a finite hiding value and does not become ``-inf``. The difference
    shows in a row every key of which is hidden by a finite value: softmax spreads it evenly over the keys (the
    exact math does), while an all ``-inf`` row sees no key (zeros). Infinities and NaN pass as they are."""
    import torch

    if t.dtype == dtype:
        return t
    info = torch.finfo(dtype)
    if torch.finfo(t.dtype).max > info.max:
        t = torch.where(t.isinf(), t, t.clamp(info.min, info.max))
    return t.to(dtype)


def kept_outside_capture(maxsize: int) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """``functools.lru_cache(maxsize)`` for a function that makes device tensors from hashable arguments, bypassed
    inside CUDA graph capture: what a captured kernel writes exists only once the graph replays, so a kept copy
    made there would hand garbage to eager calls (it is made anew, uncached, instead).

    What it keeps is made outside ``torch.inference_mode`` (:func:`made_for_autograd`): a tensor first made under
    ``inference_mode`` would be an inference tensor, and a later call that records gradients through it fails
    ("Inference tensors cannot be saved for backward")."""
    def wrap(fn: Callable[..., T]) -> Callable[..., T]:
        cached = functools.lru_cache(maxsize=maxsize)(made_for_autograd(fn))

        @functools.wraps(fn)
        def call(*args: Any) -> T:
            if graph_capturing():
                return fn(*args)
            return cached(*args)

        return call
    return wrap


def bottom_right_mask(seqlen_q: int, seqlen_k: int, device: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The bottom-right causal mask for SDPA's ``attn_mask`` and the rows that see no key (made anew: the SDPA
    adapter keeps its additive form, ``sdpa._bottom_right_additive``).

    Query ``i`` may attend key ``j`` when ``j <= i + Sk - Sq`` (FlashAttention's convention). When Sq > Sk the
    first ``Sq - Sk`` rows see no key; they are opened to every key here (so softmax has no empty row and no
    NaN reaches the gradient) and the caller must zero them afterwards with the returned ``[Sq, 1]`` mask.

    Returns:
        ``(allowed [Sq, Sk] bool, empty_rows [Sq, 1] bool or None)`` on ``device``.
    """
    import torch

    ones = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    allowed = ones.tril(diagonal=seqlen_k - seqlen_q)
    if seqlen_q <= seqlen_k:
        return allowed, None
    empty = torch.arange(seqlen_q, device=device).unsqueeze(1) < seqlen_q - seqlen_k
    return allowed | empty, empty


def first(result: Any) -> Any:
    """The output tensor of kernels that return ``(out, lse)`` in some versions and ``out`` in others."""
    return result[0] if isinstance(result, (tuple, list)) else result  # a tuple: faster than a union


#: ``id`` -> a weak reference of each inference tensor attnforge made for a model's layers to read (:func:`made_here`)
_MADE_HERE: dict[int, weakref.ref[Any]] = {}


def made_here(t: torch.Tensor) -> torch.Tensor:
    """Mark ``t``, a tensor attnforge itself made for a model's layers to read and that nothing writes after (a mask
    the transformers integration's mask builder hands the model, varlen offsets made from a padding mask), so
    :class:`KeptPerMask` keeps what is derived from it under ``torch.inference_mode`` too, where an inference tensor
    has no version counter and a caller's own is never kept. Without this a model run under ``inference_mode`` (a
    common way to serve) prepared each mask again in every layer and never took the padded prefill's varlen route.
    The mark goes with the tensor. Returns ``t``."""
    if t.is_inference():
        key = id(t)

        def forget(ref: weakref.ref[Any], key: int = key) -> None:
            if _MADE_HERE.get(key) is ref:
                del _MADE_HERE[key]

        _MADE_HERE[key] = weakref.ref(t, forget)
    return t


def kept_version(t: torch.Tensor) -> int | None:
    """The one rule for whether what is derived from mask ``t`` may be kept, and what to compare a kept entry by:
    ``t``'s version counter (an in-place change bumps it); for an inference tensor (none) -1 where
    :func:`made_here` marked it, else None (never kept: an in-place change could not be seen). :class:`KeptPerMask`,
    the decode lanes and FlashAttention-4's padded decode route ask it."""
    if not t.is_inference():
        return t._version
    ref = _MADE_HERE.get(id(t))
    return -1 if ref is not None and ref() is t else None


class KeptPerMask(Generic[_V]):
    """What an adapter derived from the last few masks (:data:`KEPT` of them, the newest first), so a model that
    passes one mask object to every layer (transformers builds it once per forward; Gemma-2 two, a sliding and a
    full one, alternating by layer) pays the pass over all its entries once per mask and forward, not once per
    layer. An entry is found only for the same mask object (a weak reference: a new mask never matches a dead one's
    entry, and the entry is dropped with the mask), at the same version counter (an in-place change misses) and with
    the same preparation parameters; inference tensors (``torch.inference_mode``: no version counter) are never
    kept, except those attnforge made itself for the model to read (:func:`made_here`). A write that does not bump
    the version counter (through ``.data``, or through numpy memory shared by ``torch.from_numpy``) is not seen: a
    caller that writes so passes a new mask object (the exact math, the correctness fallback, keeps nothing here).
    The callers keep nothing for masks that require grad, nor under CUDA graph capture (a captured kernel has not
    run) or while ``torch.compile`` traces."""

    __slots__ = ("_entries",)

    #: masks kept at once (transformers' models use one or two per forward)
    KEPT = 4

    def __init__(self) -> None:
        self._entries: list[tuple[Any, ...]] = []

    def get(self, mask: torch.Tensor, params: tuple[Any, ...]) -> _V | None:
        version = kept_version(mask)
        if version is None:
            return None  # an inference tensor has no version counter to check (torch.inference_mode): never kept
        for entry in self._entries:
            if entry[0]() is mask and entry[1] == version and entry[2] == params:
                return entry[3]  # type: ignore[no-any-return]
        return None

    def put(self, mask: torch.Tensor, params: tuple[Any, ...], value: _V) -> None:
        version = kept_version(mask)
        if version is None:
            return
        ref = weakref.ref(mask, self._drop)
        self._entries = [(ref, version, params, value), *self._entries[: self.KEPT - 1]]

    def _drop(self, ref: weakref.ref[Any]) -> None:
        """The caller's mask is gone: free what was derived from it."""
        self._entries = [e for e in self._entries if e[0] is not ref]
