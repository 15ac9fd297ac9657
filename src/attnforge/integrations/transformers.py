"""``attn_implementation="attnforge"`` for transformers models (transformers 5.23+ ``AttentionInterface``).

After :func:`register`, ``AutoModel.from_pretrained(..., attn_implementation="attnforge")`` (or
``model.set_attn_implementation("attnforge")``) sends every attention call to :func:`attnforge.attention`,
with each keyword the model families pass mapped to one of its features:

=====================================  ==========================================================================
transformers passes                    attnforge gets
=====================================  ==========================================================================
``attention_mask`` (bool or additive)  ``attn_mask`` (built by transformers' ``sdpa_mask``, registered under the
                                       same name: padding, packed ``position_ids``, sliding windows are in it;
                                       None when the call is plainly causal or bidirectional; a padded
                                       ``generate``'s later decode steps: built unread, :func:`_mask_builder`)
a padded prefill's causal mask         varlen sequences, ``causal=True``, no mask (:func:`_padded_prefill`)
no mask, causal module, Sq > 1         ``causal=True``, keys past Sq cut off as transformers' SDPA function does
                                       (an empty static cache: top-left alignment)
``sliding_window=W``, no mask          ``window=(W - 1, 0)`` (transformers: key ``j`` seen by query ``i`` iff
                                       ``i - W < j <= i``, ``masking_utils.sliding_window_overlay``)
``softcap``                            ``softcap`` (Gemma 2: ``softcap * tanh(scores / softcap)``)
``s_aux`` (GPT-OSS)                    ``sinks``
``dropout``, ``scaling``               ``dropout_p``, ``scale``
``cu_seq_lens_q/k``, no mask           varlen (``cu_seqlens_q/k``, ``max_seqlen_q/k``)
``cu_seq_lens_q/k`` and a mask         the mask narrowed to the packed sequences (:func:`_within_sequences`)
``position_bias`` (T5-style)           an additive ``attn_mask`` (transformers' ``create_position_bias_mask``)
a paged cache (continuous batching)    the cache is updated first, as transformers' SDPA function does
=====================================  ==========================================================================

A call attnforge cannot express (``output_attentions=True``, which needs the weights; a keyword this table does
not know) goes to the model's *own* eager function (``eager_attention_forward`` of the model's modeling file,
which implements that model's sinks, softcap, ...), with the mask converted as transformers' ``eager_mask``
does. It never goes to transformers' SDPA function, which ignores sinks and refuses softcap. A call that only
attnforge's exact math would serve (softcap or sinks with no verified kernel for them, :func:`_exact_only`) goes
there too: the framework's default is faster than that fallback.

A model transformers runs only eagerly for a reason other than softcap or sinks (PegasusX, NLLB-MoE ...:
:func:`takes_sdpa_masks`) gets eager's masks, which its own code relies on; a model that computes attention in its own
code (:func:`routes_attention`) is refused at load.

Contract of the registered function (runtime-anchors.md §2.2): ``fn(module, query, key, value,
attention_mask, **kwargs) -> (attn_output, attn_weights)``, with q/k/v ``[B, H, S, D]`` in and the output
``[B, S, H, Dv]``.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from attnforge.backends._base import KeptPerMask, graph_capturing, made_here, records_grad
from attnforge.dispatch.inputs import PrefillSequences, prefill_sequences
from attnforge.errors import DispatchError

NAME = "attnforge"

#: keywords that carry no attention semantics (the mask already reflects them) or that this module maps
_KNOWN_KWARGS = frozenset({
    "position_ids", "cache_position", "use_cache", "past_key_values", "past_key_value", "output_hidden_states",
    "output_router_logits", "num_items_in_batch", "return_dict", "layer_idx", "seq_idx",
    "sliding_window", "softcap", "s_aux", "position_bias", "cache", "output_attentions",
    "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
})

_EAGER_BY_CLASS: dict[type, Callable[..., Any]] = {}


def attention_forward(  # noqa: PLR0917 - transformers' AttentionInterface signature
    module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
        dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
        **kwargs: Any) -> tuple[Any, Any]:
    """The function registered as ``"attnforge"``: q ``[B, Hq, Sq, D]``, k ``[B, Hkv, Sk, D]``, v
    ``[B, Hkv, Sk, Dv]``, float tensors of one dtype and device.

    Returns:
        ``([B, Sq, Hq, Dv] contiguous, None)`` as transformers' SDPA function does; ``(out, weights)`` from the
        model's eager function when the call went there.

    Raises:
        DispatchError: the call needs the eager path and the model's modeling file has none.
    """
    if kwargs.get("indices") is not None:  # a DSA model's top-k keys (DeepSeek-V3.2): folded into the mask
        attention_mask = _with_selected_keys(module, query, key, attention_mask, indices=kwargs["indices"],
                                             is_causal=is_causal)
        kwargs = {name: val for name, val in kwargs.items() if name != "indices"}
    if kwargs.get("cu_seq_lens_q") is not None:
        if attention_mask is None and _needs_eager(None, kwargs):
            # packed rows handed to the eager function (output_attentions): its mask must keep the sequences apart,
            # as the varlen call does; a plain causal one spanned them (logits 0.48 off, CPU fuzz 2026-12-03)
            import torch

            attention_mask = _plain_mask(module, query, key, is_causal)
            if attention_mask is None:
                attention_mask = torch.ones(1, 1, query.shape[2], key.shape[2], dtype=torch.bool, device=query.device)
        if attention_mask is not None:
            attention_mask = _within_sequences(attention_mask, query, key, kwargs)
    if _needs_eager(attention_mask, kwargs):
        return _eager(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                      is_causal=is_causal, **kwargs)
    from attnforge.dispatch import runtime

    cache = kwargs.get("cache")
    if cache is not None:  # a paged cache: the new keys go in first (transformers' sdpa_attention_forward)
        key, value = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx, kwargs=kwargs)
    causal = _causal(module, is_causal)
    q_len, kv_len = query.shape[2], key.shape[2]
    features: dict[str, Any] = {"scale": scaling, "dropout_p": dropout,
                                "softcap": kwargs.get("softcap"), "sinks": kwargs.get("s_aux")}
    mask = attention_mask
    if kwargs.get("position_bias") is not None:
        from transformers.integrations.sdpa_attention import create_position_bias_mask

        mask = create_position_bias_mask(kwargs["position_bias"], mask, causal and mask is None and q_len > 1,
                                         query, key)
    given_key, given_value = key, value
    if mask is not None:
        if q_len == kv_len > 1:
            packed = _padded_prefill(query, key, value, mask, features)
            if packed is not None:
                return packed, None
        call: dict[str, Any] = {"attn_mask": mask, **features}
    else:
        causal = causal and q_len > 1  # one query row sees every cached key: no mask at all
        # an empty static cache: only the first Sq keys exist (top-left alignment). Unless the positions cover every
        # key: the last Sq queries, sliced after the model made its positions and masks (Gemma 4's KV-shared layers
        # with logits_to_keep > 1, which transformers keeps from "sdpa" alone when a mask was skipped), bottom-right
        # as eager's sliced mask (top-left was 0.31 off its logits, CPU fuzz 2026-12-03)
        if causal and kv_len > q_len and getattr(kwargs.get("position_ids"), "shape", (None,))[-1] != kv_len:
            key, value, kv_len = key[:, :, :q_len], value[:, :, :q_len], q_len
        window = kwargs.get("sliding_window")
        if causal and window is not None and kv_len > window:
            features["window"] = (window - 1, 0)
        if kwargs.get("cu_seq_lens_q") is not None:
            return _varlen(query, key, value, causal=causal, features=features, kwargs=kwargs), None
        call = {"causal": causal, **features}
    if ((features["softcap"] or features["sinks"] is not None) and kwargs.get("position_bias") is None
            and _exact_only(query, key, value, call)):
        _note_route(module, eager=True)
        return _eager(module, query, given_key, given_value, attention_mask, dropout=dropout, scaling=scaling,
                      is_causal=is_causal, **kwargs)
    _note_route(module, eager=False)
    out = runtime.attention(query, key, value, **call)
    return out.transpose(1, 2).contiguous(), None


#: per model config (by ``id``, with a weak reference to it): the dispatcher and its generation it was seen under
#: and whether every attention call of the model since then was handed to its eager function (:func:`_note_route`)
_EAGER_SERVED: dict[int, tuple[weakref.ref[Any], tuple[weakref.ref[Any], int], bool]] = {}


def _note_route(module: Any, *, eager: bool) -> None:
    """Record where a call of ``module``'s model went: handed to its eager function (``eager``) or to
    :func:`attnforge.attention`. One call that was not keeps the model off eager's masks for the dispatcher's
    generation (:func:`eager_served`); a new generation (records or verification changed) asks again. On every
    call of the model: a call attnforge serves of a model already marked so returns after one lookup (0.2 µs on
    the CI host; a "no" of an older generation is a "no" as well, :func:`eager_served` reading only a "yes")."""
    config = getattr(module, "config", None)
    if config is None:
        return
    held = _EAGER_SERVED.get(id(config))
    if not eager and held is not None and not held[2] and held[0]() is config:
        return
    token = _served_token()
    if held is not None and held[1] == token and held[0]() is config:
        if held[2] and not eager:
            _EAGER_SERVED[id(config)] = (held[0], token, False)
        return
    if token is None:  # torch.compile tracing: the dispatcher's lock is not Dynamo's to trace
        return
    try:
        ref = weakref.ref(config)
    except TypeError:  # a config that takes no weak reference: nothing remembered
        return
    if len(_EAGER_SERVED) >= _EXACT_ONLY_KEPT:
        _EAGER_SERVED.clear()
    _EAGER_SERVED[id(config)] = (ref, token, eager)


def _token(dispatcher: Any) -> tuple[weakref.ref[Any], int]:
    """What an answer kept for ``dispatcher`` holds for: a weak reference to it (a new dispatcher may reuse a freed
    one's ``id``, as the suite's showed, and starts at generation 0 too) and its generation (its records and
    decisions). The key part of :data:`_EAGER_SERVED`, :data:`_EXACT_ONLY` and :data:`_VARLEN_PAYS`."""
    return weakref.ref(dispatcher), dispatcher.generation


def _served_token() -> tuple[weakref.ref[Any], int] | None:
    """The process dispatcher's :func:`_token`, which an :data:`_EAGER_SERVED` answer holds for; None while
    ``torch.compile`` traces (the custom op serves every call then)."""
    import torch

    from attnforge.dispatch import runtime

    if torch.compiler.is_compiling():
        return None
    return _token(runtime.get_dispatcher())


def eager_served(config: Any) -> bool:
    """Whether every attention call of the model of ``config`` went to its own eager function so far in the
    dispatcher's generation (Gemma-2's softcap calls with no FlexAttention verified and no FlashAttention-4 route,
    :func:`_exact_only`): its masks are then built as eager's (:func:`_mask_builder`). False while ``torch.compile``
    traces."""
    held = _EAGER_SERVED.get(id(config))
    if held is None or not held[2] or held[0]() is not config:
        return False
    token = _served_token()
    return token is not None and held[1] == token


#: per kind of call (:func:`_exact_only`): the backend attnforge chooses for it ("" where explain raised)
_EXACT_ONLY: dict[tuple[Any, ...], str] = {}
#: kinds remembered at once (all forgotten when full)
_EXACT_ONLY_KEPT = 256


def _exact_only(query: Any, key: Any, value: Any, call: dict[str, Any]) -> bool:
    """Whether :func:`attnforge.attention` would serve this call (``call``: its keywords) with its exact math alone:
    no verified kernel takes its features (Gemma-2's softcap or GPT-OSS's sinks with FlexAttention not verified
    and no FlashAttention-4 route for the call). :func:`attention_forward` hands such a call to the model's own eager
    function, the framework's default, instead: on an H200 (2026-11-28, docs/benchmarks.md "tenth session", a
    Gemma-2-9B-shaped decoder, FlexAttention not verified) the exact math ran the padded prefill at 0.89x eager's
    speed, and a decode call took 362 µs against eager's 246.

    Asked of :func:`attnforge.explain` once per kind of call: the head counts and head dims, one query row or more,
    dtype, device, the mask's rank and dtype, which features are present, whether a gradient is recorded, and the
    dispatcher with its generation (:func:`_token`): what the backends' capabilities and verify records turn on, not
    the lengths, which grow every decode step. Never for a forced backend (``attnforge.use_backend``: the
    caller asked for it), nor while ``torch.compile`` traces (the custom op serves then).

    A masked decode call whose chosen backend's route would leave it to the exact math all the same (the route's
    ``leaves_to_exact``: FlashAttention-4's padded decode, where a step's masks serve one layer each, so their runs
    are not worth reading) is handed over too, per call: on an H200 (2026-11-29, docs/benchmarks.md "thirteenth
    session") 16 of a 2-layer Gemma-2-9B-shaped decoder's 18 decode calls took that exact math behind the dispatch,
    the decode step 0.94-0.96x eager's; with the hand-off, all 16 went to eager and the step ran 1.062x eager's
    ("fourteenth session")."""
    import torch

    from attnforge.backends.exact import EXACT
    from attnforge.dispatch import runtime
    from attnforge.dispatch.dispatcher import _FORCED

    if torch.compiler.is_compiling() or _FORCED.get() is not None:  # Dynamo cannot trace a ContextVar's get
        return False
    dispatcher = runtime.get_dispatcher()
    mask = call.get("attn_mask")
    grad = records_grad(query, key, value)
    kind = (query.shape[1], key.shape[1], query.shape[-1], value.shape[-1], query.shape[2] == 1, query.dtype,
            query.device, None if mask is None else (mask.dim(), mask.dtype), call.get("causal"),
            "window" in call, bool(call.get("dropout_p")), call.get("softcap") is not None,
            call.get("sinks") is not None, grad, _token(dispatcher))
    chosen = _EXACT_ONLY.get(kind)
    if chosen is None:
        chosen = _remember(_EXACT_ONLY, kind, _chosen(query, key, value, call) or "")
    if chosen == EXACT:
        return True
    leaves = getattr(dispatcher.adapters.get(chosen), "leaves_to_exact", None) if mask is not None else None
    if leaves is None:
        return False
    features = {name: val for name, val in call.items()
                if name != "attn_mask" and val is not None and not (name == "dropout_p" and not val)}
    return bool(leaves(query, key, value, mask, **features))


def _needs_eager(attention_mask: Any, kwargs: dict[str, Any]) -> bool:
    """Whether this call carries something :func:`attnforge.attention` cannot express."""
    import torch

    if kwargs.get("output_attentions"):
        return True
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):  # a flex BlockMask
        return True
    return any(name not in _KNOWN_KWARGS and val is not None and val is not False for name, val in kwargs.items())


def _varlen(query: Any, key: Any, value: Any, *, causal: bool, features: dict[str, Any],
            kwargs: dict[str, Any]) -> Any:
    """Packed sequences with FlashAttention-style ``cu_seq_lens``, which index the ``B`` rows flattened (``[B * Sq]``
    tokens, as transformers' FlashAttention path reads them: ``DataCollatorWithFlattening`` packs one row, a
    padding-free batch may have several): ``[B, Sq, H, Dv]`` out. Until 2026-12-03 row 0 alone was passed, and a
    batch of several rows raised "cu_seqlens do not describe the packed tensors"."""
    from attnforge.dispatch import runtime

    q, k, v = _packed_views(query, key, value)
    out = runtime.attention(
        q, k, v, causal=causal,
        cu_seqlens_q=kwargs["cu_seq_lens_q"], cu_seqlens_k=kwargs.get("cu_seq_lens_k", kwargs["cu_seq_lens_q"]),
        max_seqlen_q=kwargs.get("max_length_q"), max_seqlen_k=kwargs.get("max_length_k"), **features)
    return out.reshape(query.shape[0], query.shape[2], *out.shape[1:]).contiguous()


def _within_sequences(mask: Any, query: Any, key: Any, kwargs: dict[str, Any]) -> Any:
    """``mask`` (``[B or 1, H or 1, Sq, Sk]``, bool or additive) narrowed to the packed sequences ``cu_seq_lens_q/k``
    describe (over the ``B`` rows flattened, as :func:`_varlen` reads them): a query sees a key only within its own
    sequence. A model that builds a layer's mask without ``position_ids`` (GPT-OSS's sliding-window layers, transformers
    5.24) hands a packed row (``DataCollatorWithFlattening``) a mask that spans its sequences, with the ``cu_seq_lens``
    beside it; its unmasked layers take the varlen call and keep the sequences apart, so the masked ones must too
    (found by a CPU fuzz, 2026-12-03: the second sequence's logits 0.05-0.17 off, the ``cu_seq_lens`` dropped). No host
    sync: the sequence of each position comes from ``searchsorted`` on the mask's device. A mask that is not a tensor
    (a flex ``BlockMask``) is left as it is."""
    import torch

    cu_q = kwargs["cu_seq_lens_q"]
    cu_k = kwargs.get("cu_seq_lens_k")
    batch, q_len, kv_len = query.shape[0], query.shape[2], key.shape[2]
    if not (isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[-2] in (1, q_len)
            and mask.shape[-1] in (1, kv_len) and isinstance(cu_q, torch.Tensor)
            and (cu_k is None or isinstance(cu_k, torch.Tensor))):
        return mask  # what does not fit the call is attnforge.attention's to refuse, with its own words
    device = mask.device

    def sequence_of(offsets: Any, length: int) -> Any:
        positions = torch.arange(batch * length, device=device)
        return (torch.searchsorted(offsets.to(device=device, dtype=torch.int64), positions, right=True) - 1).view(
            batch, length)

    same = sequence_of(cu_q, q_len)[:, None, :, None] == sequence_of(cu_q if cu_k is None else cu_k,
                                                                     kv_len)[:, None, None, :]
    if mask.dtype == torch.bool:
        return mask & same
    return mask.masked_fill(~same, torch.finfo(mask.dtype).min)


def model_eager_function(module: Any) -> Callable[..., Any]:
    """The ``eager_attention_forward`` of the modeling file that defines ``module``'s class (or a base class).

    Raises:
        DispatchError: no class in the module's MRO comes from a file that defines one.
    """
    cls = type(module)
    found = _EAGER_BY_CLASS.get(cls)
    if found is not None:
        return found
    for klass in cls.__mro__:
        fn = getattr(sys.modules.get(klass.__module__), "eager_attention_forward", None)
        if callable(fn):
            _EAGER_BY_CLASS[cls] = fn
            return _EAGER_BY_CLASS[cls]
    raise DispatchError(f"{cls.__name__} has no eager attention function to hand this call to",
                        cause="the call needs attention weights or passes a keyword attnforge does not know",
                        hint='load the model with attn_implementation="eager"')


def _causal(module: Any, is_causal: bool | None) -> bool:
    """Whether a call without a mask is causal: transformers' SDPA function's rule (``is_causal``, else the module's
    ``is_causal``, else True), except for a model that gets eager's masks (:data:`_EAGER_MASKS`): its eager function
    reads no ``is_causal`` and attends to every key where the model passes no mask. BridgeTower's image stream (its
    modules say ``is_causal=True``, and it passes no mask) was served causal, image features 0.37 off eager (CPU
    fuzz, 2026-12-03)."""
    if type(getattr(module, "config", None)) in _EAGER_MASKS:
        return False
    return bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))


def _plain_mask(module: Any, query: Any, key: Any, is_causal: bool | None) -> Any:
    """The bool causal mask ``[1, 1, Sq, Sk]`` (top-left) that transformers' sdpa mask builder skipped for a plainly
    causal call (None: the call is not causal, or has one query row)."""
    import torch

    q_len, kv_len = query.shape[2], key.shape[2]
    if not _causal(module, is_causal) or q_len <= 1:
        return None
    rows = torch.arange(q_len, device=query.device)[:, None]
    return (torch.arange(kv_len, device=query.device)[None, :] <= rows)[None, None]


def _with_selected_keys(module: Any, query: Any, key: Any, attention_mask: Any, *, indices: Any,
                        is_causal: bool | None) -> Any:
    """The mask of a call that carries ``indices``, the ``[B, Sq, topk]`` keys each query of a DeepSeek Sparse
    Attention model keeps (its lightning indexer's choice, FlashMLA's sparse argument), with every other key hidden,
    as the model's own code folds them in for ``"eager"`` and ``"sdpa"`` (transformers 5.25:
    ``models/deepseek_v32/modeling_deepseek_v32.py`` lines 431-443, the same in glm_moe_dsa, hy_v4, axk2 and
    dots3_note). For any other implementation the model passes ``indices`` and the unselected mask; handed to the
    model's eager function, which reads no ``indices``, every key was attended (logits 0.08-0.12 off SDPA's, CPU
    fuzz 2026-12-03).

    Raises:
        DispatchError: ``indices`` is not a ``[B, Sq, topk]`` integer tensor.
    """
    import torch

    batch, q_len, kv_len = query.shape[0], query.shape[2], key.shape[2]
    if (not isinstance(indices, torch.Tensor) or indices.dim() != 3 or tuple(indices.shape[:2]) != (batch, q_len)
            or indices.is_floating_point() or indices.is_complex()):
        raise DispatchError(f"indices of shape {tuple(getattr(indices, 'shape', ()))} are not the [B={batch}, "
                            f"Sq={q_len}, topk] keys of a sparse-attention call",
                            hint="attnforge folds DeepSeek Sparse Attention's top-k indices into the mask; load the "
                                 "model with attn_implementation='sdpa' for any other use of indices")
    hidden = (indices.new_ones((batch, q_len, kv_len), dtype=torch.bool)
              .scatter(-1, indices.long(), False).unsqueeze(1))  # [B, 1, Sq, Sk]; True: not selected
    mask = attention_mask if attention_mask is not None else _plain_mask(module, query, key, is_causal)
    if mask is None:
        return ~hidden
    if mask.dtype == torch.bool:
        return mask & ~hidden
    return mask.masked_fill(hidden, torch.finfo(query.dtype).min)


def _eager(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, *, dropout: float,
           scaling: float | None, is_causal: bool | None, **kwargs: Any) -> tuple[Any, Any]:
    """The model's own eager function, given the additive mask transformers' ``eager_mask`` would have built."""
    import torch

    mask = attention_mask if attention_mask is not None else _plain_mask(module, query, key, is_causal)
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.where(mask, torch.zeros((), dtype=query.dtype, device=mask.device),
                           torch.finfo(query.dtype).min)
    fn = model_eager_function(module)
    return fn(module, query, key, value, mask, dropout=dropout, scaling=scaling, **kwargs)  # type: ignore[no-any-return]


def register() -> None:
    """Register ``"attnforge"`` with transformers' ``AttentionInterface`` and ``AttentionMaskInterface``.

    Idempotent. Raises ImportError when transformers is not installed.
    """
    from transformers import AttentionInterface, PreTrainedModel
    from transformers.masking_utils import AttentionMaskInterface, causal_mask_function, sdpa_mask

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, _mask_builder(sdpa_mask, causal_mask_function))
    current = PreTrainedModel.get_correct_attn_implementation
    if not getattr(current, "_attnforge_checks", False):
        PreTrainedModel.get_correct_attn_implementation = _refusing_unrouted(current)  # type: ignore[method-assign]


def routes_attention(cls: type) -> bool:
    """Whether a transformers model class computes its attention through transformers' ``AttentionInterface``
    (so ``"attnforge"`` reaches :func:`attention_forward`): its ``is_backend_compatible()`` flag, or, since some
    classes that route lack the flag (StableLM, Falcon-H1 in transformers 5.24), transformers' own reading of the
    class's module (``_can_set_attn_implementation``: an ``*Attention*`` module class calls
    ``ALL_ATTENTION_FUNCTIONS.get_interface(``, or there is none). True where transformers has no such reading or
    the module's source cannot be read (a class defined in a notebook): no refusal on a guess.

    False, whatever the flag says, where the module picks attention classes by implementation name (a dict indexed
    by ``config._attn_implementation`` that holds an ``"eager"`` and an ``"sdpa"`` class: GIT's text layers, SAM's
    and DeepSeek-OCR-2's SAM vision encoder in transformers 5.24): those layers compute attention in their own code,
    and the lookup raised ``KeyError: 'attnforge'`` at load (2026-12-03)."""
    source = _module_source(cls)
    if source is not None and _picks_attention_classes_by_name(source):
        return False
    if getattr(cls, "is_backend_compatible", lambda: True)():
        return True
    can_set = getattr(cls, "_can_set_attn_implementation", None)
    if can_set is None or can_set():  # transformers reads the module once and keeps the answer on the class
        return True
    return source is None  # transformers also answers False where it cannot read the source: that is no evidence


def _module_source(cls: type) -> str | None:
    """The source of the module that defines ``cls``; None where it cannot be read (a class defined in a notebook)."""
    import inspect

    try:
        return inspect.getsource(sys.modules[cls.__module__])
    except (KeyError, OSError, TypeError):
        return None


#: a dict indexed by the implementation name (``GIT_SELF_ATTENTION_CLASSES[config._attn_implementation]``); the
#: interfaces transformers registers names in (``ALL_ATTENTION_FUNCTIONS``, ``ALL_MASK_ATTENTION_FUNCTIONS``) aside
_BY_NAME = r"\b(\w+)\[\s*[\w.]*\._attn_implementation\s*\]"


def _picks_attention_classes_by_name(source: str) -> bool:
    """Whether a modeling module's ``source`` indexes anything but transformers' registries by the implementation
    name (:data:`_BY_NAME`)."""
    import re

    return any(found not in {"ALL_ATTENTION_FUNCTIONS", "ALL_MASK_ATTENTION_FUNCTIONS"}
               for found in re.findall(_BY_NAME, source))


def takes_sdpa_masks(cls: type) -> bool:
    """Whether a transformers model class runs right on the masks transformers builds for ``"sdpa"`` (bool, or None
    for a plainly causal or bidirectional call), which :func:`register` builds for ``"attnforge"``: its
    ``_supports_sdpa`` flag, or, where transformers refuses SDPA for it, a refusal for a feature
    :func:`attnforge.attention` serves: the class's module passes ``softcap=`` or ``s_aux=`` to its attention
    (Gemma 2, GPT-OSS, VaultGemma, MiMo-V2-Flash ... in transformers 5.24).

    Any other refusal is the model's own code relying on eager's masks: PegasusX's, BigBirdPegasus's and NLLB-MoE's
    decoder self-attention modules say ``is_causal=False`` and rely on the causal mask, which SDPA's mask builder
    skips for an unpadded batch (so they attended to later tokens), and NLLB-MoE's router reads the mask as eager's
    additive one. Through ``"attnforge"`` they got SDPA's masks: logits 0.005-0.06 off eager, padded or not
    (2026-12-03). Such a model gets eager's masks instead (:func:`_refusing_unrouted`, :func:`_mask_builder`), built
    whole (an unpadded encoder's too, which eager skips: Splinter's self-attention module has no ``is_causal``, so a
    missing mask read as causal). False too where the module's source cannot be read: eager's masks are right for any
    model."""
    import re

    if getattr(cls, "_supports_sdpa", False):
        return True
    source = _module_source(cls)
    return (source is not None and re.search(r"\b(?:softcap|s_aux)\s*=", source) is not None
            and re.search(_EDITS_THE_MASK, source) is None)


#: a modeling module that pads, extends or casts the 4-D mask it is given, as eager's additive one: DeepSeek-V4's
#: compressed layers append their ``block_bias`` (0 / -inf) with ``torch.cat([attention_mask,
#: block_bias.to(attention_mask.dtype)])`` and pad with ``value=0.0``; on SDPA's bool mask that flipped which
#: compressed slots are seen (logits 0.33 off eager, transformers 5.25, CPU fuzz 2026-12-03). Such a module gets
#: eager's masks whatever it passes (a false match costs speed only: eager's masks are right for any model)
_EDITS_THE_MASK = r"(?:F\.pad|torch\.cat)\(\s*[\[(]?\s*attention_mask\b|\.to\(\s*attention_mask\.dtype\s*\)"


def _refusing_unrouted(original: Callable[..., str]) -> Callable[..., str]:
    """transformers' ``get_correct_attn_implementation``, refusing ``"attnforge"`` (or ``"paged|attnforge"``) for a
    model class that does not route its attention (:func:`routes_attention`). transformers lets any registered
    name through; such a model (XGLM, MPT, Falcon, GPT-Neo, RoFormer ... in transformers 5.24) never calls
    attnforge and gets the masks built for ``"attnforge"`` (SDPA's, bool or None) in its own code: wrong logits
    (XGLM 0.03, MPT 0.6 off eager on a padded batch), a crash (MPT, ``None.to``) or a KeyError (Falcon).

    A model class that routes but does not take SDPA's masks (:func:`takes_sdpa_masks`) gets eager's: its config's
    class is noted in :data:`_EAGER_MASKS`, which :func:`_mask_builder` reads (the config is what transformers hands
    the mask function; its class, unlike the object, survives ``copy.deepcopy(model)``).

    Raises:
        ValueError: transformers' own error type for an implementation a model does not support.
    """
    import functools

    @functools.wraps(original)
    def get_correct_attn_implementation(self: Any, requested_attention: str | None = None,
                                        *args: Any, **kwargs: Any) -> str:
        if NAME not in (requested_attention or "").split("|"):
            return original(self, requested_attention, *args, **kwargs)
        if not routes_attention(type(self)):
            raise ValueError(
                f'{type(self).__name__} computes attention in its own code, not through transformers\' '
                f'AttentionInterface, so attn_implementation="{requested_attention}" would never reach attnforge '
                'and its masks would be built for the wrong kernel. Load it with attn_implementation="sdpa" and '
                'route its torch.nn.functional.scaled_dot_product_attention calls with attnforge.patch_sdpa(), '
                'or use attn_implementation="eager"')
        config = getattr(self, "config", None)
        if config is not None and not takes_sdpa_masks(type(self)):
            _EAGER_MASKS.add(type(config))
        return original(self, requested_attention, *args, **kwargs)

    get_correct_attn_implementation._attnforge_checks = True  # type: ignore[attr-defined]
    return get_correct_attn_implementation


#: config classes of the model classes that get eager's masks through ``"attnforge"`` (:func:`takes_sdpa_masks`)
_EAGER_MASKS: set[type] = set()

#: per (batch size, device, local window) of a decode step's mask: the step's K/V length and whether its padding
#: mask hid keys (:func:`_mask_builder`)
_PADDED_DECODE: dict[tuple[Any, str, Any], tuple[Any, bool]] = {}


def _mask_builder(sdpa_mask: Callable[..., Any], causal: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' ``sdpa_mask`` for ``"attnforge"`` (its ``eager_mask`` for a model that relies on eager's masks,
    whose config's class :data:`_EAGER_MASKS` holds: :func:`takes_sdpa_masks`), except where a decode step
    (``q_length == 1``) continues a padded batch's ``generate``: its mask is built without asking whether it could be
    skipped. To skip a mask (None: no mask), ``sdpa_mask`` first reads whether the padding mask hides any key
    (``masking_utils._ignore_causal_mask_sdpa``: a sum and a host sync, on every step and for each kind of mask).
    A padded batch's answer is the same on every step of its ``generate``, so only its first decode step asks; a
    step continues the last one of its batch size, device and window when its one query is the last key (a dynamic
    cache's step) and its K/V length is the last one's or one more. A built mask that hides nothing gives the
    outputs of no mask, so a wrong guess (an unpadded batch following a padded one at the next length) only costs
    that ``generate`` its skip. A step whose query is not the last key (a static cache, a prefix longer than the
    input) is left to ``sdpa_mask``: its skip there may also mean that a built mask would not fit the call.

    Measured on an H200 (2026-11-28, ``models_e2e.py --diagnose``, Gemma-2-9B-shaped, 2 layers, a padded batch): 35
    host syncs in 9 decode steps through ``"attnforge"`` against 15 for eager (whose mask is always built), the
    extra 20 all in that check, ~58 µs each of a ~4.1 ms step. An unpadded batch keeps the check (as transformers'
    SDPA does): building its mask is ~26 torch calls against the check's 3 (transformers 5.24's ``sdpa_mask``,
    counted on CPU). Forward, prefill and training (``q_length > 1``) keep the skip: an unpadded batch's call is then
    plainly causal, which the fast kernels serve without a mask.

    Such a continued step's mask is, for the plain causal mask (``causal``: ``masking_utils.causal_mask_function``,
    nothing composed with it) when the query is the last key (a dynamic cache), the padding mask's row of those keys
    (:func:`_last_query_mask`): one view instead of ``sdpa_mask``'s ~26 torch calls (index arithmetic over
    ``arange``s), each a few µs of host time on an H200's host. So is a sliding window's (``local_size``: Gemma-2,
    Gemma-3, Mistral) while its keys do not outgrow the window, where its mask function hides no key from the query
    (:func:`_hides_no_key`, a few CPU ops)."""
    import functools

    @functools.wraps(sdpa_mask)
    def build(*args: Any, **kwargs: Any) -> Any:
        import torch

        get = kwargs.get
        config = get("config")
        if type(config) in _EAGER_MASKS or (config is not None and eager_served(config)):
            from transformers.masking_utils import eager_mask

            # built whole: a skipped bidirectional mask (None) is "nothing hidden" to eager's function, which reads no
            # is_causal, but causal to attention_forward for a module without one (Splinter, ALIGN's and CLAP's text
            # encoders in transformers 5.24: hidden states 0.03-0.6 off eager, 2026-12-03). A model whose calls all
            # went to its eager function (eager_served) gets eager's masks too: sdpa_mask's skip check reads the
            # padding mask on the host (two syncs a mask), for a skip that eager's function cannot use (H200,
            # 2026-12-02, gemma_padded_probe.py: Gemma-2's padded forward 0.988x eager with the check, 1.001x
            # without; docs/benchmarks.md "thirty-ninth session")
            return eager_mask(*args, **{**kwargs, "allow_is_bidirectional_skip": False})
        padding = get("attention_mask")
        # transformers passes keywords (masking_utils' mask_interface calls): anything else is passed through, as is
        # a traced call (sdpa_mask reads no values then, and the state here is nothing to guard a graph on)
        if (args or not isinstance(padding, torch.Tensor) or get("allow_is_causal_skip", True) is False
                or torch.compiler.is_compiling()):
            return sdpa_mask(*args, **kwargs)
        if get("q_length") != 1:
            mask = _made(sdpa_mask(**kwargs), padding)
            if mask is not None and _plain_causal_prefill(kwargs, causal):
                _PREFILL_PADDING.put(mask, (), padding)
            return mask
        key, kv_length = (get("batch_size"), str(padding.device), get("local_size")), get("kv_length")
        last = _PADDED_DECODE.get(key)
        # a continued step: the query is the last key (a dynamic cache's decode step; anything else, a static cache's
        # or a prefix's, is sdpa_mask's to decide, since its skip also means the mask would not fit the call)
        if (last is not None and last[1] and isinstance(last[0], int) and _query_is_last_key(kwargs)
                and kwargs["kv_length"] - last[0] in (0, 1)):
            _PADDED_DECODE[key] = (kv_length, True)
            fn = get("mask_function")
            built = (_last_query_mask(kwargs) if fn is causal or (key[2] is not None and kv_length <= key[2]
                                                                   and _hides_no_key(kwargs)) else None)
            return built if built is not None else _made(sdpa_mask(**{**kwargs, "allow_is_causal_skip": False}),
                                                             padding)
        mask = _made(sdpa_mask(**kwargs), padding)
        local = key[2]
        if local is None or (isinstance(kv_length, int) and kv_length < local):  # the answer was the padding's
            _PADDED_DECODE[key] = (kv_length, mask is not None)
        return mask

    return build


def _made(mask: Any, padding: Any) -> Any:
    """``sdpa_mask``'s mask (or None), marked as attnforge's own (:func:`~attnforge.backends._base.made_here`) where
    it is fresh memory: only the model's layers read it, so what they derive from it is kept under
    ``torch.inference_mode`` too. A mask that shares the caller's ``padding`` mask's memory (a view of it: transformers
    5.23's ``sdpa_mask`` builds none, a later one might) is the caller's to change in place, and stays unmarked."""
    if mask is None or _shares_memory(mask, padding):
        return mask
    return made_here(mask)


def _shares_memory(a: Any, b: Any) -> bool:
    """Whether tensors ``a`` and ``b`` are views of one storage."""
    return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


#: a padded prefill's mask, as built for ``"attnforge"`` (:func:`_mask_builder`) -> the 2D padding mask it was built
#: from (``[B, S]`` bool), per mask object and version counter
_PREFILL_PADDING: KeptPerMask[Any] = KeptPerMask()
#: per such mask: its varlen sequences (:class:`PrefillSequences`), or False where a row sees more than one run
_PREFILL_SEQUENCES: KeptPerMask[PrefillSequences | bool] = KeptPerMask()
#: per kind of packed call (:func:`_varlen_pays`): whether it is taken over the masked call
_VARLEN_PAYS: dict[tuple[Any, ...], bool] = {}
#: the shortest longest sequence of a padded prefill taken as varlen sequences. Measured on an H200 (2026-11-29,
#: docs/benchmarks.md "fifteenth session", ``prefill_varlen.py``, Llama-3-8B's heads, 4 prompts, bf16): the varlen
#: call through FlashAttention-4's public function took 0.24-0.25 ms up to 1024 tokens (its host cost: the masked
#: SDPA call 0.07-0.33 ms), 0.38 ms at 2048 against 1.04 and 1.13 at 4096 against 3.78; in a 2-layer model the
#: route's extra host time (~1 ms a layer, the runs read, the public entry) made a 1024-token prefill 0.91x
PREFILL_VARLEN_MIN = 2048


def _plain_causal_prefill(kwargs: dict[str, Any], causal: Callable[..., Any]) -> bool:
    """Whether ``sdpa_mask``'s keywords describe a fresh prefill's plain causal mask over a bool padding mask
    (``mask_function`` transformers' ``causal_mask_function`` itself, no window, queries and keys the same
    ``S`` positions from 0, a ``[B, S]`` padding mask, no vmap): the mask is then ``causal & padding`` and nothing
    else, which :func:`_padded_prefill` serves as varlen sequences."""
    import torch

    get = kwargs.get
    padding = kwargs["attention_mask"]
    length = get("q_length")
    return (get("mask_function") is causal and get("local_size") is None and not get("use_vmap")
            and isinstance(length, int) and length > 1 and get("kv_length") == length
            and get("q_offset", 0) == 0 and get("kv_offset", 0) == 0 and padding.dtype == torch.bool
            and padding.dim() == 2 and tuple(padding.shape) == (get("batch_size"), length))


def _padded_prefill(query: Any, key: Any, value: Any, mask: Any, features: dict[str, Any]) -> Any:
    """A padded batch's prefill (``q [B, Hq, S, D]``, ``k/v [B, Hkv, S, D]``, ``mask`` built for it by
    :func:`_mask_builder`: causal and the padding, nothing else) of a left-padded batch as varlen sequences with
    ``causal=True`` and no mask: ``[B, S, Hq, Dv]`` out, or None where this does not apply (the caller passes the
    mask then).

    The masked call hands a kernel the whole ``S x S`` square of every row (SDPA's kernels take a mask or
    ``is_causal``, not both, so they cannot skip the tiles above the diagonal), where the varlen causal call computes
    about half of it and none of the padding, as transformers' own FlashAttention path does (``_upad_input``),
    here without moving a token: the runs of real tokens and of padding are sequences of the caller's tensors viewed
    ``[B * S, H, D]`` (no copy where their storage is ``[B, S, H, D]``, as a projection's ``view(...).transpose(1,
    2)`` is). Taken only where it pays (:func:`_varlen_pays`: a kernel serves the packed call, SDPA the masked one), its
    longest real run is at least :data:`PREFILL_VARLEN_MIN` tokens, and not under CUDA graph capture, a forced
    backend or ``torch.compile`` (the runs are read on the host: one sync per mask object, kept for every layer)."""
    import torch

    from attnforge.dispatch import runtime
    from attnforge.dispatch.dispatcher import _FORCED

    # torch.compile first: the kept padding's lookup reads the mask's version counter and is_inference(), which
    # Dynamo cannot trace (fullgraph=True failed on a padded batch's first layer)
    if torch.compiler.is_compiling() or _FORCED.get() is not None or (query.is_cuda and graph_capturing()):
        return None
    padding = _PREFILL_PADDING.get(mask, ())
    if padding is None:
        return None
    b, hq, s, _ = query.shape
    if s < PREFILL_VARLEN_MIN or tuple(padding.shape) != (b, s) or key.shape[0] != b:
        return None
    base = {name: val for name, val in features.items() if val is not None}
    # decided before the mask is read: where no kernel serves the packed call (a slim FlashAttention-3 built without
    # varlen, and no FlashAttention-4), the read is a sync for nothing; on an H200 (2026-11-30, docs/benchmarks.md
    # "twenty-sixth session") a 2-layer Llama-3-8B's padded forward read 0.943-0.979x of transformers' SDPA so
    if not _varlen_pays(query, key, value, mask=mask, features=features, base=base):
        return None
    kept = _PREFILL_SEQUENCES.get(mask, ())
    if kept is None:
        kept = prefill_sequences(padding) or False
        _PREFILL_SEQUENCES.put(mask, (), kept)
    if not isinstance(kept, PrefillSequences) or kept.longest_real < PREFILL_VARLEN_MIN:
        return None
    seqs = kept
    q, k, v = _packed_views(query, key, value)
    dv = v.shape[-1]
    out = runtime.attention(q, k, v, **_packed_call(base, seqs.cu_seqlens, seqs.longest))
    if seqs.hidden is None:
        return out.view(b, s, hq, dv)
    if records_grad(q, k, v) or not out.is_contiguous():
        return out.view(b, s, hq, dv).masked_fill(seqs.hidden, 0)
    # the kernel's fresh output, nothing recorded for backward: only the padding rows are written, not every row
    return out.view(b * s, hq * dv).index_fill_(0, seqs.hidden_rows, 0).view(b, s, hq, dv)


def _packed_views(query: Any, key: Any, value: Any) -> tuple[Any, Any, Any]:
    """``q [B, H, Sq, D]``, ``k``, ``v [B, H, Sk, D]`` each viewed ``[B * S, H, D]``, its rows flattened
    (:func:`_padded_prefill`, :func:`_varlen`: no copy where their storage is ``[B, S, H, D]``, or ``B`` is 1)."""
    return tuple(t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[-1]) for t in (query, key, value))


def _packed_call(base: dict[str, Any], offsets: Any, longest: int) -> dict[str, Any]:
    """A padded prefill's packed call (:func:`_padded_prefill`): the caller's features ``base`` and causal
    self-attention over the sequences ``offsets`` (int32 ``[n + 1]``) mark, the longest ``longest`` long."""
    return dict(base, causal=True, cu_seqlens_q=offsets, cu_seqlens_k=offsets, max_seqlen_q=longest,
                max_seqlen_k=longest)


#: the keywords a padded prefill's packed call adds to the caller's features
_PACKED_KEYWORDS = tuple(_packed_call({}, None, 0))


def _varlen_pays(query: Any, key: Any, value: Any, *, mask: Any, features: dict[str, Any],
                 base: dict[str, Any]) -> bool:
    """Whether the packed call of ``query``, ``key``, ``value`` (``[B, H, S, D]``, viewed ``[B * S, H, D]``:
    :func:`_packed_views`; ``base``: the caller's features without the varlen keywords) is worth taking over the
    masked one (``mask``, ``features``: :func:`_padded_prefill`): a kernel (not the exact math)
    serves it, and plain SDPA's kernels serve the masked call, which compute the whole square (a masked
    FlexAttention call skips the tiles its block mask hides already: a Gemma-2-9B-shaped decoder's padded forward on
    an H200 ran 1.162x eager with FlashAttention-4's varlen kernel, 1.247x with Flex's masked one, 2026-11-29,
    docs/benchmarks.md "fifteenth session"). Asked of :func:`attnforge.explain` once per kind (heads, head dims,
    dtype, device, the features present, whether a gradient is recorded, the length's power-of-two bucket, as shape
    classes bucket it: what serves the masked call may differ by length, and the dispatcher with its generation,
    :func:`_token`), as :func:`_exact_only` asks, on offsets of ``B`` whole rows of ``S`` (no mask read: the packed
    call's class is that of its longest sequence's bucket, ``S``'s here)."""
    from attnforge.backends.exact import EXACT
    from attnforge.backends.sdpa import SDPA_KERNELS
    from attnforge.dispatch import runtime

    dispatcher = runtime.get_dispatcher()
    b, hq, s, d = query.shape
    kind = (hq, key.shape[1], d, value.shape[-1], query.dtype, query.device, records_grad(query, key, value),
            tuple(sorted((*(name for name, val in base.items() if val is not None and not (
                name == "dropout_p" and not val)), *_PACKED_KEYWORDS))), s.bit_length(), _token(dispatcher))
    pays = _VARLEN_PAYS.get(kind)
    if pays is None:
        import torch

        from attnforge.dispatch.inputs import keep_offsets

        rows = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=query.device)
        keep_offsets(rows, rows=b * s, longest=s)  # known here: explain reads nothing back
        packed = _chosen(*_packed_views(query, key, value), _packed_call(base, rows, s))
        dense = _chosen(query, key, value, {"attn_mask": mask, **features})
        pays = _remember(_VARLEN_PAYS, kind, packed not in (None, EXACT) and dense in SDPA_KERNELS)
    return pays


def _chosen(query: Any, key: Any, value: Any, call: dict[str, Any]) -> str | None:
    """The backend :func:`attnforge.explain` chooses for the call (``call``: its keywords); None where it raises
    (:func:`attnforge.attention` itself says what is wrong with the call)."""
    from attnforge.dispatch import runtime

    try:
        return runtime.explain(query, key, value, **call).chosen
    except Exception:
        return None


_T = TypeVar("_T")


def _remember(kept: dict[tuple[Any, ...], _T], kind: tuple[Any, ...], answer: _T) -> _T:
    """Keep ``answer`` for ``kind`` in ``kept`` (at most :data:`_EXACT_ONLY_KEPT` kinds: all forgotten when full)."""
    if len(kept) >= _EXACT_ONLY_KEPT:
        kept.clear()
    kept[kind] = answer
    return answer


def _last_query_mask(kwargs: dict[str, Any]) -> Any:
    """``sdpa_mask``'s causal mask for one query that is the last key (``q_offset = kv_offset + kv_length - 1``: the
    causal part hides nothing) over a bool padding mask ``[B, >= kv_offset + kv_length]``: ``[B, 1, 1, kv_length]``,
    True where a key is seen, a view of the padding mask's columns ``kv_offset .. kv_offset + kv_length``; None where
    the keywords say anything else (``sdpa_mask`` builds those)."""
    import torch

    padding = kwargs["attention_mask"]
    if not (_query_is_last_key(kwargs) and padding.__class__ is torch.Tensor and padding.dtype == torch.bool
            and padding.dim() == 2 and padding.shape[0] == kwargs.get("batch_size")):
        return None
    kv_offset, kv_length = kwargs.get("kv_offset", 0), kwargs["kv_length"]
    if padding.shape[1] < kv_offset + kv_length:
        return None
    return padding[:, None, None, kv_offset:kv_offset + kv_length]


def _hides_no_key(kwargs: dict[str, Any]) -> bool:
    """Whether a decode step's mask function (``mask_function``, before ``sdpa_mask`` adds the padding) hides none of
    the keys ``kv_offset .. kv_offset + kv_length`` from the one query (``q_offset``) of any batch row: the function
    evaluated as ``sdpa_mask`` evaluates it without vmap (the four index tensors broadcast ``[B, 1, 1, 1]``,
    ``[1, 1, 1, 1]``, ``[1, 1, 1, 1]``, ``[1, 1, 1, kv_length]``), on CPU index tensors, so an index function
    launches no device work. False for ``use_vmap``, for an answer that is not a CPU bool tensor, and where the
    function raises (``sdpa_mask`` then builds the mask, and says what is wrong). A function over device tensors
    either raises here (a CPU index against a device tensor) or, composed by ``and_masks``/``or_masks``, has its part
    copied to the CPU (one host sync: the answer stays right). Asked only for a window (``local_size``) its keys do
    not outgrow."""
    import torch

    if kwargs.get("use_vmap"):
        return False
    kv_offset, kv_length = kwargs.get("kv_offset", 0), kwargs["kv_length"]
    try:
        seen = kwargs["mask_function"](torch.arange(kwargs["batch_size"])[:, None, None, None],
                                       torch.zeros(1, 1, 1, 1, dtype=torch.long),
                                       torch.full((1, 1, 1, 1), kwargs["q_offset"]),
                                       (torch.arange(kv_length) + kv_offset)[None, None, None, :])
    except Exception:  # any mask function's failure: sdpa_mask decides, and raises it there
        return False
    return (isinstance(seen, torch.Tensor) and seen.device.type == "cpu" and seen.dtype == torch.bool
            and bool(seen.all()))


def _query_is_last_key(kwargs: dict[str, Any]) -> bool:
    """Whether a mask function's one query is its last key (``q_offset == kv_offset + kv_length - 1``, all ints: a
    dynamic cache's decode step), read from the keywords transformers passes it."""
    kv_length, kv_offset, q_offset = kwargs.get("kv_length"), kwargs.get("kv_offset", 0), kwargs.get("q_offset", 0)
    return (isinstance(kv_length, int) and isinstance(kv_offset, int) and isinstance(q_offset, int)
            and q_offset == kv_offset + kv_length - 1)

