"""FlashAttention 2, 3 and 4 adapters, and the capabilities of a slim FlashAttention-3 build.

One adapter class per major version, because the three spell the same features differently
(runtime-anchors.md §5.1-5.3 and the crosswalk §5.7):

=================  =========================  ===========================  ==============================
feature            FA2 ``flash_attn``         FA3 ``flash_attn_interface``  FA4 ``flash_attn.cute``
=================  =========================  ===========================  ==============================
window (l, r)      ``window_size``, -1 = inf  ``window_size``, -1 = inf     ``window_size``, None = inf
softcap            ``softcap`` (0 = off)      ``softcap``                   ``softcap``
dropout            ``dropout_p``              none                          none
sinks              none                       none                          ``learnable_sink``
lse                ``return_attn_probs``      ``return_attn_probs``         ``return_lse``
varlen             ``flash_attn_varlen_func`` ``flash_attn_varlen_func``    ``flash_attn_varlen_func``
=================  =========================  ===========================  ==============================

Layout: the kernels take ``[B, S, H, D]`` with only the last dim contiguous, so ``__call__`` hands them
``transpose(1, 2)`` *views* of bhsd tensors and returns a view of their output: no copy in forward, and
autograd's gradients flow back through the same views (no copy in backward either). Causal and windows are
bottom-right aligned, as attnforge's default; rows that see no key come back as zeros.

Bound routes (``bind``: the dispatcher's plain calls, first-use measurement, bench, verify) skip the public
functions' Python layers where the installed package is one a direct entry mirrors: FA2
:mod:`~attnforge.backends._fa2_direct`, FA3 :mod:`~attnforge.backends._fa3_direct`, FA4
:mod:`~attnforge.backends._fa4_direct` (docs/dispatch-overhead.md, 2026-11-26).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from attnforge.backends._base import AdapterBase, first
from attnforge.backends._padded_decode import MaskSharing
from attnforge.backends.capabilities import Capabilities

if TYPE_CHECKING:
    import torch

    from attnforge.backends.adapter import AttentionCall

#: slim-build feature names (``catalog/data/backends.toml`` ``[recipes.flash-attn-3.slim] features``) -> the
#: attention() feature each switch turns off when left out
_BUILD_FEATURES = {"local": "window", "softcap": "softcap", "varlen": "varlen", "paged-kv": "paged",
                   "paged": "paged", "window": "window"}
_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp8": "float8_e4m3fn", "e4m3": "float8_e4m3fn"}


@dataclass(slots=True, kw_only=True)
class FlashAttnAdapter(AdapterBase):
    """FlashAttention-2 (``flash_attn.flash_attn_func``); FA3 and FA4 subclass it with their spellings.

    Plain calls pass ``softmax_scale`` and ``causal`` only (every version); FA3/FA4 return ``(out, lse)`` in
    some versions, of which only ``out`` is used.
    """

    #: how ``window_size`` spells an unbounded side
    unbounded: ClassVar[int | None] = -1
    #: the keyword that asks for the log-sum-exp
    lse_keyword: ClassVar[str] = "return_attn_probs"
    #: the direct kernel entry, looked up once (:meth:`direct_entry`)
    _direct: list[Any] = field(default_factory=list, repr=False)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None, **features: Any) -> Any:
        """Run the kernel on ``[B, Hq, Sq, D]`` / ``[B, Hkv, Sk, D]``; returns ``[B, Hq, Sq, Dv]``.

        Varlen calls (``cu_seqlens_q`` in ``features``) take the packed ``[total, H, D]`` tensors as they are.
        """
        if "cu_seqlens_q" in features:
            return self.call_bshd(q, k, v, causal=causal, scale=scale, **features)
        out = self.call_bshd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal,
                             scale=scale, **features)
        if features.get("return_lse"):
            return out[0].transpose(1, 2), out[1]
        return out.transpose(1, 2)

    def direct_entry(self) -> Any:
        """What the bound route calls instead of the public function, or None where the installed package is not
        one a direct entry mirrors; looked up once. FA2: the ``flash_attn_2_cuda`` module
        (:mod:`attnforge.backends._fa2_direct`). Raises what importing the package raises."""
        if not self._direct:
            self._direct.append(self._find_direct())
        return self._direct[0]

    def _find_direct(self) -> Any:
        import importlib

        from attnforge.backends import _fa2_direct

        if self.installed_version() not in _fa2_direct.VERSIONS:
            return None
        self.module()
        return importlib.import_module(_fa2_direct.NATIVE)

    def bind(self, call: AttentionCall, *, scale: float | None, bshd: bool) -> Callable[..., torch.Tensor]:
        """The plain call bound for a route (:func:`attnforge.backends.bound.bound_call`): FA2's native
        ``fwd``/``bwd`` called directly when the version is mirrored and D is a multiple of 8
        (:func:`attnforge.backends._fa2_direct.bind`), else :meth:`bind_public`."""
        from attnforge.backends import _fa2_direct

        native = None if call.head_dim % _fa2_direct.HEAD_DIM_MULTIPLE else self.direct_entry()
        if native is None:
            return self.bind_public(call, scale=scale, bshd=bshd)
        return _fa2_direct.bind(native, scale=scale if scale is not None else call.head_dim ** -0.5,
                                causal=call.causal, bshd=bshd, needs_grad=call.needs_grad)

    def bind_public(self, call: AttentionCall, *, scale: float | None,
                    bshd: bool) -> Callable[..., torch.Tensor]:
        """The plain call bound to the public function: ``(q, k, v)`` in the caller's layout straight into
        ``flash_attn_func`` (bhsd through ``transpose(1, 2)`` views both ways), the module looked up once.
        Raises what importing the module raises."""
        kernel = self.module().flash_attn_func
        causal = call.causal
        if bshd:
            def run_bshd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                return first(kernel(q, k, v, softmax_scale=scale, causal=causal))  # type: ignore[no-any-return]

            return run_bshd

        def run_bhsd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = first(kernel(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale,
                               causal=causal))
            return out.transpose(1, 2)  # type: ignore[no-any-return]

        return run_bhsd

    def call_bshd(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                  scale: float | None, **features: Any) -> Any:
        """Run the kernel on ``[B, Sq, Hq, D]`` / ``[B, Sk, Hkv, D]``; returns ``[B, Sq, Hq, Dv]`` (and the
        float32 lse ``[B, Hq, Sq]``, or ``[Hq, total_q]`` for varlen, with ``return_lse``)."""
        if not features:
            return first(self.module().flash_attn_func(q, k, v, softmax_scale=scale, causal=causal))
        return self._with_features(q, k, v, causal=causal, scale=scale, **features)

    def _with_features(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                       scale: float | None, window: Any = None, softcap: float | None = None,
                       dropout_p: float = 0.0, sinks: Any = None, return_lse: bool = False,
                       cu_seqlens_q: Any = None, cu_seqlens_k: Any = None, max_seqlen_q: int | None = None,
                       max_seqlen_k: int | None = None) -> Any:
        kwargs: dict[str, Any] = {"softmax_scale": scale, "causal": causal}
        if window is not None:
            kwargs["window_size"] = tuple(self.unbounded if side is None else side for side in window)
        if softcap:
            kwargs["softcap"] = softcap
        if dropout_p:
            kwargs["dropout_p"] = dropout_p
        if sinks is not None:
            kwargs["learnable_sink"] = sinks
        if return_lse:
            kwargs[self.lse_keyword] = True
        module = self.module()
        if cu_seqlens_q is not None:
            result = module.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                                   max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                                   **kwargs)
        else:
            result = module.flash_attn_func(q, k, v, **kwargs)
        if return_lse:
            return result[0], result[1].float()
        return first(result)


@dataclass(slots=True, kw_only=True)
class FlashAttn3Adapter(FlashAttnAdapter):
    """FlashAttention-3 (``flash_attn_interface``, Hopper): as FA2 without dropout; its capabilities can be
    narrowed to what a slim build compiled (:func:`capabilities_from_build`).

    Its bound route calls the registered ops directly (:mod:`attnforge.backends._fa3_direct`) when their
    schemas are the ones mirrored there; any other build keeps the public ``flash_attn_func``.

    Attributes:
        op_namespace: the ``torch.ops`` namespace of the ops (tests register the mirrored schemas in their own).
        entry_module: the module holding a ``--abi torch`` build's lean entry (``attnforge_fwd`` /
            ``attnforge_bwd``: :mod:`attnforge.backends._fa3_direct`), called instead of the ops where present.
    """

    op_namespace: str = "flash_attn_3"
    entry_module: str | None = "flash_attn_3._C"

    def _find_direct(self) -> Any:
        """The ops to call directly (:class:`~attnforge.backends._fa3_direct.Fa3Ops`, with the build's lean entry
        where it has one), or None when the installed build registers other schemas."""
        from attnforge.backends import _fa3_direct

        self.module()  # importing flash_attn_interface registers the ops (it imports flash_attn_3._C)
        return _fa3_direct.find_ops(self.op_namespace, self.entry_module)

    def serving_notes(self, call: AttentionCall) -> tuple[str, ...]:
        """How a bound route reaches FA3's kernels, once this process has looked (nothing before: this imports
        nothing): the build's lean entry, the registered ops, or the public function."""
        if not self._direct:
            return ()
        ops = self._direct[0]
        if ops is None:
            return ("FlashAttention-3 through its public flash_attn_func: the installed build registers other op "
                    "schemas than attnforge's direct entry mirrors",)
        if ops.train is not None:  # the C++ node (entry 2)
            return ("FlashAttention-3 through its build's lean entry (flash_attn_3._C.attnforge_fwd / attnforge_bwd, "
                    "and attnforge_attn's C++ autograd node when a gradient is needed; an `--abi torch` build): the "
                    "least host time a call",)
        if ops.entry is not None:
            return ("FlashAttention-3 through its build's lean entry (flash_attn_3._C.attnforge_fwd / attnforge_bwd, "
                    "an `--abi torch` build of before attnforge's C++ train node): a call that needs a gradient goes "
                    "through a Python autograd node; rebuilding it (`attnforge install flash-attn-3 --abi torch "
                    "--source ...`) adds the node (docs/slim-builds.md)",)
        return ("FlashAttention-3 through torch.ops.flash_attn_3.fwd / bwd called directly; a build made with "
                "`attnforge install flash-attn-3 --abi torch --source ...` adds a lean entry with less host time a "
                "call (docs/slim-builds.md)",)

    def bind(self, call: AttentionCall, *, scale: float | None, bshd: bool) -> Callable[..., torch.Tensor]:
        """The plain call bound for a route: the ops called directly, forward-only when ``call`` needs no
        gradient (:func:`attnforge.backends._fa3_direct.bind`); the public function when the schemas differ.
        The scale defaults to ``D ** -0.5`` here, as ``FlashAttnFunc.forward`` defaults it."""
        ops = self.direct_entry()
        if ops is None:
            return self.bind_public(call, scale=scale, bshd=bshd)
        from attnforge.backends import _fa3_direct

        return _fa3_direct.bind(ops, scale=scale if scale is not None else call.head_dim ** -0.5,
                                causal=call.causal, bshd=bshd, needs_grad=call.needs_grad)


@dataclass(slots=True, kw_only=True)
class FlashAttn4Adapter(FlashAttnAdapter):
    """FlashAttention-4 (``flash_attn.cute``): ``window_size`` sides are None when unbounded, sinks are
    ``learnable_sink``, the lse is ``return_lse``.

    Its bound route calls ``_flash_attn_fwd`` without the autograd node when the installed version is one
    :mod:`attnforge.backends._fa4_direct` mirrors; a call that needs a gradient gets that module's lean
    ``autograd.Function`` (the forward's replay, ``_flash_attn_bwd`` called directly) in place of
    ``FlashAttnFunc``.

    A mask (``attn_mask``) is served on a decode step only (``caps.mask_max_seqlen_q``): a padded batch's step is
    a varlen call with no mask (:mod:`attnforge.backends._padded_decode`), run by the recorded compiled call
    (:class:`~attnforge.backends._fa4_direct.Replayer` with the per-call ``cu_seqlens``); any other masked call
    (a mask that is not one run of keys per row, a gradient, CUDA graph capture, ``torch.compile`` tracing, an
    inference-mode mask, another feature beside softcap, a mirrored version not installed, a mask's first call where
    the masks before it served one call each: :class:`~attnforge.backends._padded_decode.MaskSharing`) gets the exact
    math
    (:func:`attnforge.backends.exact.exact_attention`), so the answer is right whatever the mask holds. Gemma-2's
    padded decode call on an H200 (2026-11-28, docs/benchmarks.md "ninth session"): 19.4 µs of host time and
    118 µs wall a call back to back (the kernel 110 µs of device time), against eager's 166 and 158. A call the
    kernel raises on is logged once and its kind goes to the exact math from then on, unless the error is the
    device's state (:func:`~attnforge.backends._base.device_state`), which reaches the caller.

    Attributes:
        varlen_replays: the masked decode route's :class:`~attnforge.backends._fa4_direct.Replayer` per
            signature (dtype, the varlen views' shapes and strides, softcap, scale, device); at most
            :data:`VARLEN_REPLAYS`, all dropped when full.
        mask_sharing: whether a mask's runs are worth reading on its first call
            (:class:`~attnforge.backends._padded_decode.MaskSharing`: masks that serve one layer each stay on the
            exact math).
    """

    unbounded: ClassVar[int | None] = None
    lse_keyword: ClassVar[str] = "return_lse"
    #: signatures of the masked decode route kept at once (a generate keeps one per batch size and mask kind)
    VARLEN_REPLAYS: ClassVar[int] = 64
    varlen_replays: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False)
    mask_sharing: MaskSharing = field(default_factory=MaskSharing, repr=False)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None, **features: Any) -> Any:
        """As :meth:`FlashAttnAdapter.__call__`; a call with ``attn_mask`` as the class docstring says."""
        if "attn_mask" in features:
            return self._masked(q, k, v, causal=causal, scale=scale, **features)
        return FlashAttnAdapter.__call__(self, q, k, v, causal=causal, scale=scale, **features)

    def _masked(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float | None,
                attn_mask: Any, softcap: float | None = None, window: Any = None,
                causal_alignment: str = "bottom_right", **rest: Any) -> Any:
        """A masked call on ``[B, Hq, Sq, D]`` / ``[B, Hkv, Sk, D]``: the varlen decode route where it applies
        (:meth:`_padded_decode`), else the exact math with the same keywords; ``[B, Hq, Sq, Dv]`` either way."""
        from attnforge.backends.exact import exact_attention, hides_keys

        if not rest and q.shape[2] == 1 and not hides_keys(1, k.shape[2], causal=causal,
                                                           top_left=causal_alignment == "top_left", window=window):
            out = self._padded_decode(q, k, v, attn_mask, scale=scale, softcap=softcap)
            if out is not None:
                return out
        return exact_attention(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask, softcap=softcap,
                               window=window, causal_alignment=causal_alignment, **rest)

    def _padded_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, *,
                       scale: float | None, softcap: float | None) -> torch.Tensor | None:
        """A decode step under a padding mask on the varlen kernel (the class docstring), or None where the route
        does not apply."""
        from attnforge.backends import _fa4_direct
        from attnforge.backends._base import device_state
        from attnforge.backends._padded_decode import varlen_decode

        if not self._may_read(q, k, v, mask):
            return None
        if not self.mask_sharing.worth_reading(mask, _sharing_kind(q, k)):
            return None  # the mask's first call, after masks of its kind that served one call each: the exact math
        fwd = self.direct_entry()
        seqs = varlen_decode(q, k, v, mask) if fwd is not None else None
        if seqs is None:
            return None
        key = _replay_key(q, seqs, scale=scale, softcap=softcap)
        run = self.varlen_replays.get(key)
        if run is False:
            return None  # the kernel refused this kind of call before: the exact math serves it
        if run is None:
            if len(self.varlen_replays) >= self.VARLEN_REPLAYS:
                self.varlen_replays.clear()
            run = _fa4_direct.Replayer(fwd, _fa4_direct.varlen_keywords(scale=scale, softcap=softcap))
            self.varlen_replays[key] = run
        try:
            out = run(seqs.q, seqs.k, seqs.v, cu_seqlens_q=seqs.cu_seqlens_q, cu_seqlens_k=seqs.cu_seqlens_k,
                      seqused_k=seqs.seqused_k, max_seqlen_k=seqs.max_seqlen_k)
        except Exception as exc:  # a refusal of this kind of call (an assertion of _flash_attn_fwd's, a CuTe error)
            if device_state(exc):
                raise  # the device's state, not a refusal: it reaches the caller, as every backend's does
            self.varlen_replays[key] = False
            import logging

            logging.getLogger("attnforge").warning(
                "FlashAttention-4's varlen decode refused a call (q %s, k %s, softcap %s): %s: %s; the exact math "
                "serves calls of this kind from now on", tuple(q.shape), tuple(k.shape), softcap,
                type(exc).__name__, str(exc).splitlines()[0][:300] if str(exc) else "")
            return None
        return out.view(q.shape[0], q.shape[1], 1, out.shape[-1])  # type: ignore[no-any-return]

    def _may_read(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> bool:
        """Whether the padded decode route may read this call's mask at all: a device the kernel runs on, no gradient
        recorded, not while ``torch.compile`` traces, not under CUDA graph capture (the runs' one host sync would
        break it), not a mask whose runs would not be kept (an inference-mode mask attnforge did not make:
        :func:`~attnforge.backends._base.kept_version`)."""
        import torch

        from attnforge.backends._base import graph_capturing, kept_version, records_grad

        return not (q.device.type not in self.caps.devices or records_grad(q, k, v, mask)
                    or torch.compiler.is_compiling() or (q.device.type == "cuda" and graph_capturing())
                    or kept_version(mask) is None)

    def leaves_to_exact(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, *,
                        causal: bool = False, **features: Any) -> bool:
        """Whether this masked decode call (``q [B, Hq, 1, D]``, ``k/v [B, Hkv, Sk, D]``, the caller's ``mask``;
        ``features``: the keywords it would pass) would get the exact math because its mask is not worth reading
        (:meth:`~attnforge.backends._padded_decode.MaskSharing.would_decline`; then the call is counted as the route
        would have counted it). For a caller that has a faster path for such a call than the exact math behind the
        dispatch (the transformers integration: the model's own eager function, Gemma-2's default). False for
        anything the route itself decides on (:meth:`_may_read`: a gradient, CUDA graph capture, ``torch.compile``
        tracing, an inference-mode mask; a mask whose runs are worth reading); the sharing rule is asked first, so
        a call whose mask is read (a step's later layers) pays one lookup. A masked call with a feature the route
        does not take beside a mask (sinks: GPT-OSS) never gets here: the capabilities' ``mask_with`` keep it from
        this backend.

        Why: a Gemma-2-9B-shaped decoder of 2 layers on an H200 (2026-11-29, docs/benchmarks.md "thirteenth
        session"), each of a step's two masks serving one layer: 16 of 18 decode calls took the exact math inside
        this route, a decode step 0.94-0.96x eager's."""
        import torch

        if causal or q.shape[2] != 1 or mask.__class__ is not torch.Tensor:
            return False
        kind = _sharing_kind(q, k)
        if not self.mask_sharing.would_decline(mask, kind) or not self._may_read(q, k, v, mask):
            return False
        self.mask_sharing.worth_reading(mask, kind)  # counts the call (False: it would not have been read)
        return True

    def decode_lane(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, *,
                    scale: float | None, softcap: float | None = None) -> Fa4DecodeLane | None:
        """The varlen replay of the masked decode call just served (``q [B, Hq, 1, D]``, ``k/v [B, Hkv, Sk, D]``, the
        caller's ``mask``), kept for the calls that repeat it (:class:`Fa4DecodeLane`: the next layers of a step,
        which :func:`attnforge.dispatch.features.lane_call` matches), or None where that call did not take the
        replay (its mask's runs not kept, no replayable recording of its kind)."""
        from attnforge.backends._padded_decode import key_rows, varlen_decode

        if q.shape[2] != 1 or q.device.type not in self.caps.devices:
            return None
        seqs = varlen_decode(q, k, v, mask, read=False)
        if seqs is None:
            return None
        run = self.varlen_replays.get(_replay_key(q, seqs, scale=scale, softcap=softcap))
        if run is None or run is False or run.replay is None:
            return None
        return Fa4DecodeLane(run=run, cu_seqlens_q=seqs.cu_seqlens_q, cu_seqlens_k=seqs.cu_seqlens_k,
                             seqused_k=seqs.seqused_k, max_seqlen_k=k.shape[2], rows=key_rows(k),
                             out_shape=(q.shape[0], q.shape[1], 1, v.shape[-1]), sharing=self.mask_sharing,
                             kind=_sharing_kind(q, k), cuda=q.device.type == "cuda")

    def _find_direct(self) -> Any:
        """``flash_attn.cute.interface._flash_attn_fwd`` when the installed flash-attn-4 is a version
        :data:`~attnforge.backends._fa4_direct.VERSIONS` names, else None."""
        import importlib

        from attnforge.backends import _fa4_direct

        if self.installed_version() not in _fa4_direct.VERSIONS:
            return None
        self.module()
        return getattr(importlib.import_module(_fa4_direct.INTERFACE), "_flash_attn_fwd", None)

    def direct_backward(self) -> Any:
        """``flash_attn.cute.interface._flash_attn_bwd`` where :meth:`direct_entry` found ``_flash_attn_fwd`` (a
        mirrored version), else None. Asked when a route is bound, never per call."""
        import importlib

        from attnforge.backends import _fa4_direct

        if self.direct_entry() is None:
            return None
        return getattr(importlib.import_module(_fa4_direct.INTERFACE), "_flash_attn_bwd", None)

    def bind(self, call: AttentionCall, *, scale: float | None, bshd: bool) -> Callable[..., torch.Tensor]:
        """The plain call bound for a route when the version is mirrored (:func:`attnforge.backends._fa4_direct.bind`):
        ``_flash_attn_fwd`` directly when no gradient is needed, else the lean ``autograd.Function`` around it and
        ``_flash_attn_bwd``; otherwise the public function."""
        from attnforge.backends import _fa4_direct

        dv = call.head_dim_v or call.head_dim
        fwd = None if dv == _fa4_direct.MLA_HEAD_DIM else self.direct_entry()
        bwd = self.direct_backward() if fwd is not None and call.needs_grad else None
        if fwd is None or (call.needs_grad and bwd is None):
            return self.bind_public(call, scale=scale, bshd=bshd)
        return _fa4_direct.bind(fwd, scale=scale, causal=call.causal, bshd=bshd, bwd=bwd)


@dataclass(slots=True, kw_only=True)
class Fa4DecodeLane:
    """FlashAttention-4's padded decode route bound to one mask object (:meth:`FlashAttn4Adapter.decode_lane`), for
    the calls that repeat the call it was made for (the next layers of a step: the same mask object, q/k/v of the same
    shapes, strides, dtypes and devices, the same scale and softcap; :func:`attnforge.dispatch.features.lane_call`
    checks that): the mask's runs and the replayed compiled call are kept, so each later call makes three views and
    replays the kernel, skipping the call's signature, the plan lookup and the adapter's checks. Calling it returns
    ``[B, Hq, 1, Dv]``, or None where the call must take the adapter's general path (autograd records it, CUDA graph
    capture, ``torch.compile`` traces): a decline is for that call alone (no ``retired``, unlike SDPA's lane).

    Why: on an H200's host (2026-11-28, docs/benchmarks.md "tenth session") Gemma-2-9B's decode through the route
    read 0.96-1.01x eager per step at 2, 8 and 42 layers although the replayed call costs 29 µs of host time against
    eager's 145-259: the dispatch and checks around it (~39 µs a call on this repository's CPU machine, of which the
    replay is 4.5) are paid by every layer."""

    run: Any
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    seqused_k: torch.Tensor
    max_seqlen_k: int
    rows: int
    out_shape: tuple[int, ...]
    sharing: MaskSharing
    kind: tuple[Any, ...]
    cuda: bool

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        import torch

        from attnforge.backends._base import graph_capturing, records_grad
        from attnforge.backends._padded_decode import varlen_views

        if records_grad(q, k, v, mask) or torch.compiler.is_compiling() or (self.cuda and graph_capturing()):
            return None  # this call only: the adapter's general path decides it
        self.sharing.worth_reading(mask, self.kind)  # counts the call: later masks of the kind are read at once
        out = self.run(*varlen_views(q, k, v, self.rows), cu_seqlens_q=self.cu_seqlens_q,
                       cu_seqlens_k=self.cu_seqlens_k, seqused_k=self.seqused_k, max_seqlen_k=self.max_seqlen_k)
        return out.view(self.out_shape)  # type: ignore[no-any-return]


def _sharing_kind(q: torch.Tensor, k: torch.Tensor) -> tuple[Any, ...]:
    """The kind of a masked decode call :class:`~attnforge.backends._padded_decode.MaskSharing` learns per: batch,
    query and K/V heads, head dim, dtype, device (not the length, which grows every step)."""
    return (q.shape[0], q.shape[1], k.shape[1], q.shape[-1], q.dtype, q.device)


def _replay_key(q: torch.Tensor, seqs: Any, *, scale: float | None, softcap: float | None) -> tuple[Any, ...]:
    """The key of a masked decode call's :class:`~attnforge.backends._fa4_direct.Replayer` in
    :attr:`FlashAttn4Adapter.varlen_replays`: dtype, the varlen views' shapes and strides (``seqs``:
    :class:`~attnforge.backends._padded_decode.VarlenDecode`), softcap, scale, device."""
    return (q.dtype, seqs.q.shape, seqs.q.stride(), seqs.k.stride(), seqs.v.shape[-1], softcap, scale, q.device)


def capabilities_from_build(base: Capabilities, build: Mapping[str, Any]) -> Capabilities:
    """Narrow a backend's capabilities to what one build of it compiled (a slim FlashAttention-3 build).

    Args:
        base: the backend's capabilities from the catalog (what a full build serves).
        build: the capabilities recorded with the build (``provenance.json`` ``details.capabilities``, written
            by the slim build; :func:`attnforge.cache.capabilities.installed_capabilities` reads them back).
            Keys, all required:

            - ``head_dims: list[int]``: the head dims kernels were built for; a head dim D runs on the
              smallest kept one >= D (``round_up_headdim``), so the largest is the limit;
            - ``dtypes: list[str]``: ``"bfloat16"``, ``"float16"``, ``"float8_e4m3fn"`` (``bf16``/``fp16``/
              ``fp8`` accepted);
            - ``backward: bool``: the backward kernels were built;
            - ``features: list[str]``: the optional features kept, by their build switch names (``local`` =
              sliding window, ``softcap``, ``varlen``, ``paged-kv``, ``split``, ``append-kv`` ...).

    Returns:
        ``base`` with head dims, dtypes, backward and the switchable features (window, softcap, varlen,
        paged KV) limited to the build's; features no switch removes (lse, GQA) stay.

    Raises:
        ValueError: a key is missing or of the wrong type.
    """
    try:
        head_dims = [int(d) for d in build["head_dims"]]
        dtypes = {_DTYPE_ALIASES.get(str(d), str(d)) for d in build["dtypes"]}
        backward = build["backward"]
        kept = {_BUILD_FEATURES[str(f)] for f in build["features"] if str(f) in _BUILD_FEATURES}
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"bad build capabilities {dict(build)!r}: {exc}") from None
    if not isinstance(backward, bool) or not head_dims:
        raise ValueError(f"bad build capabilities {dict(build)!r}: backward must be a bool, head_dims non-empty")
    switchable = set(_BUILD_FEATURES.values())
    return replace(
        base,
        support=replace(base.support, max_head_dim=min(base.support.max_head_dim, max(head_dims)),
                        dtypes=tuple(d for d in base.support.dtypes if d in dtypes)),
        backward=base.backward and backward,
        features=frozenset(f for f in base.features if f not in switchable or f in kept),
        offers=frozenset(f for f in base.offers if f not in switchable or f in kept),
    )
