"""diffusers: an ``"attnforge"`` attention backend and an attention processor, both running
:func:`attnforge.attention`.

Two ways in, for the two kinds of attention module diffusers has:

- ``model.set_attention_backend("attnforge")`` after :func:`register`: every processor that calls diffusers'
  ``dispatch_attention_fn`` (Flux, Wan, LTX-Video, HunyuanVideo, and the other ``AttentionModuleMixin`` models)
  keeps its own projections, norms and rotary embeddings and hands only the attention to attnforge. diffusers'
  ``AttentionBackendName`` is a closed enum with no registration API (diffusers 0.42,
  ``models/attention_dispatch.py``), so :func:`register` adds the member ``ATTNFORGE`` to it and the function to
  ``_AttentionBackendRegistry``, the way diffusers' own backends are registered.
- ``model.set_attn_processor(AttnforgeProcessor())``: on the classic ``Attention`` module (UNets, VAEs), whose
  default ``AttnProcessor2_0`` calls ``torch.nn.functional.scaled_dot_product_attention`` directly, it does what
  ``AttnProcessor2_0`` does (honouring ``attn.scale``, which ``AttnProcessor2_0`` ignores; equal unless the module
  was built with ``scale_qk=False``). On an ``AttentionModuleMixin`` module (``FluxAttention`` ...) it runs that
  module's default processor with the ``"attnforge"`` backend.

:class:`AttnforgeProcessor` replaces ``AttnProcessor2_0`` only: set on a classic module whose processor has its
own joint-attention logic (CogVideoX's ``CogVideoXAttnProcessor2_0``) it would compute something else.
:func:`route` looks at each module's current processor and changes only those it can serve exactly, and lists
the rest; :func:`attnforge.patch_sdpa` routes the SDPA calls of those (CogVideoX).

diffusers is imported only inside :func:`register` and the delegating branch of the processor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NAME = "attnforge"


@dataclass(frozen=True, slots=True, kw_only=True)
class Routed:
    """What :func:`route` did, by module name.

    Attributes:
        backend: processors that call ``dispatch_attention_fn``, now with the ``"attnforge"`` backend.
        processor: ``AttnProcessor``/``AttnProcessor2_0`` replaced by :class:`AttnforgeProcessor`.
        unchanged: ``"name: ProcessorClass"`` of every other attention module, left as it was.
    """

    backend: tuple[str, ...]
    processor: tuple[str, ...]
    unchanged: tuple[str, ...]


def route(model: Any) -> Routed:
    """Send every attention module of a diffusers ``model`` that attnforge can serve exactly to it.

    Raises ImportError when diffusers is not installed.
    """
    from diffusers.models.attention_processor import AttnProcessor, AttnProcessor2_0

    member = register()
    shared = AttnforgeProcessor()
    done: dict[str, list[str]] = {"backend": [], "processor": [], "unchanged": []}
    for name, module in model.named_modules():
        processor = getattr(module, "processor", None)
        if processor is None or not callable(getattr(module, "set_processor", None)):
            continue
        if hasattr(processor, "_attention_backend"):
            processor._attention_backend = member
            done["backend"].append(name)
        elif type(processor) in {AttnProcessor, AttnProcessor2_0}:
            module.set_processor(shared)
            done["processor"].append(name)
        else:
            done["unchanged"].append(f"{name}: {type(processor).__name__}")
    return Routed(**{kind: tuple(names) for kind, names in done.items()})


def attention_backend(  # noqa: PLR0917 - the parameter names are diffusers' backend contract
    query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
        scale: float | None = None, enable_gqa: bool = False, return_lse: bool = False,
        _parallel_config: Any = None) -> Any:
    """diffusers' backend contract: q ``[B, Sq, Hq, D]``, k/v ``[B, Sk, Hkv, D]`` in, ``[B, Sq, Hq, Dv]`` out
    (and the log-sum-exp ``[B, Sq, Hq]`` float32 with ``return_lse``).

    ``attn_mask`` is bool or additive, broadcastable to ``[B, Hq, Sq, Sk]``, or ``[B, Sk]`` (a key padding
    mask, as diffusers' native backend accepts). ``is_causal`` is SDPA's top-left alignment.
    """
    from attnforge.dispatch import runtime

    if attn_mask is not None and attn_mask.ndim == 2 and attn_mask.shape == (query.shape[0], key.shape[1]):
        attn_mask = attn_mask[:, None, None, :]
    result = runtime.attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale,
                                 causal=is_causal, causal_alignment="top_left", enable_gqa=enable_gqa,
                                 return_lse=return_lse, layout="bshd")
    if return_lse:
        out, lse = result
        return out, lse.transpose(1, 2)
    return result


def register() -> Any:
    """Make ``"attnforge"`` a diffusers attention backend (idempotent); returns its ``AttentionBackendName``.

    Raises ImportError when diffusers is not installed.
    """
    from diffusers.models import attention_dispatch as dispatch

    names = dispatch.AttentionBackendName
    member: Any = names._value2member_map_.get(NAME)
    if member is None:
        member = str.__new__(names, NAME)
        member._name_, member._value_ = NAME.upper(), NAME
        type.__setattr__(names, NAME.upper(), member)
        names._member_names_.append(NAME.upper())
        names._member_map_[NAME.upper()] = member
        names._value2member_map_[NAME] = member
    registry = dispatch._AttentionBackendRegistry
    if member not in registry._backends:
        registry.register(member, constraints=[dispatch._check_device, dispatch._check_shape])(attention_backend)
    from diffusers.models.modeling_utils import ModelMixin

    current = ModelMixin.set_attention_backend
    if not getattr(current, "_attnforge_checks", False):
        ModelMixin.set_attention_backend = _warning_when_unused(current)  # type: ignore[method-assign]
    return member


def _warning_when_unused(original: Any) -> Any:
    """diffusers' ``ModelMixin.set_attention_backend``, warning when ``"attnforge"`` reaches no module: diffusers
    sets a backend only on processors that call ``dispatch_attention_fn`` and skips the others without a word (a
    UNet's ``AttnProcessor2_0``: 0 attnforge calls in a forward, this CPU machine 2026-12-01), so the model would
    run as before while its user believes otherwise. The warning names :func:`route`."""
    import functools

    @functools.wraps(original)
    def set_attention_backend(self: Any, backend: str) -> None:
        original(self, backend)
        if str(backend).lower() != NAME:
            return
        if not any(hasattr(getattr(m, "processor", None), "_attention_backend") for m in self.modules()):
            import warnings

            warnings.warn(f'set_attention_backend("{NAME}") reached no attention module of this '
                          f"{type(self).__name__}: its processors call scaled_dot_product_attention themselves, so "
                          "it runs as before. Use attnforge.integrations.diffusers.route(model), or "
                          "model.set_attn_processor(AttnforgeProcessor())", UserWarning, stacklevel=2)

    set_attention_backend._attnforge_checks = True  # type: ignore[attr-defined]
    return set_attention_backend


class AttnforgeProcessor:
    """``processor(attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None)``.

    Hidden states ``[B, S, C]`` or ``[B, C, H, W]`` on the classic ``Attention``; on an
    ``AttentionModuleMixin`` module the arguments are that module's processor's (Flux: the fifth is
    ``image_rotary_emb``).
    """

    def __init__(self) -> None:
        self._delegates: dict[type, Any] = {}

    def __call__(self, attn: Any, hidden_states: Any, encoder_hidden_states: Any = None,
                 attention_mask: Any = None, temb: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not hasattr(attn, "spatial_norm"):  # FluxAttention, WanAttention, LTXAttention, ...
            extra = (temb, *args) if temb is not None or args else ()
            return self._delegate(attn)(attn, hidden_states, encoder_hidden_states, attention_mask, *extra,
                                        **kwargs)
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        input_ndim = hidden_states.ndim
        if input_ndim == 4:
            batch, channel, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch, channel, height * width).transpose(1, 2)
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        batch, context_len, _ = context.shape
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, context_len, batch)
            attention_mask = attention_mask.view(batch, attn.heads, -1, attention_mask.shape[-1])
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)

        query = attn.to_q(hidden_states)
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        elif attn.norm_cross:
            encoder_hidden_states = attn.norm_encoder_hidden_states(encoder_hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)
        head_dim = key.shape[-1] // attn.heads
        query = query.view(batch, -1, attn.heads, head_dim).transpose(1, 2)
        key = key.view(batch, -1, attn.heads, head_dim).transpose(1, 2)
        value = value.view(batch, -1, attn.heads, head_dim).transpose(1, 2)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)

        from attnforge.dispatch import runtime

        hidden_states = runtime.attention(query, key, value, attn_mask=attention_mask,
                                            scale=getattr(attn, "scale", None))

        hidden_states = hidden_states.transpose(1, 2).reshape(batch, -1, attn.heads * head_dim)
        hidden_states = hidden_states.to(query.dtype)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        if input_ndim == 4:
            hidden_states = hidden_states.transpose(-1, -2).reshape(batch, channel, height, width)
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        return hidden_states / attn.rescale_output_factor

    def _delegate(self, attn: Any) -> Any:
        """The module's default processor, one per module class, with the ``"attnforge"`` backend."""
        cls = type(attn)
        processor = self._delegates.get(cls)
        if processor is None:
            processor = cls._default_processor_cls()
            processor._attention_backend = register()
            self._delegates[cls] = processor
        return processor
