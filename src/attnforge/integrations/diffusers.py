"""A diffusers attention processor that runs :func:`attnforge.attention`.

``AttnforgeProcessor`` does what diffusers' default ``AttnProcessor2_0`` does for the classic
``diffusers.models.attention_processor.Attention`` module (UNets, VAEs, many transformers), with the attention
itself served by attnforge; calls with an attention mask go to PyTorch SDPA unchanged. Use it with
``model.set_attn_processor(AttnforgeProcessor())``. Unlike ``AttnProcessor2_0``, it honours ``attn.scale``
(equal to ``1/sqrt(D)`` unless the module was built with ``scale_qk=False``).

Models whose processors call diffusers' ``dispatch_attention_fn`` (Flux, Wan, ...) with the default ``native``
backend reach ``torch.nn.functional.scaled_dot_product_attention``; :func:`attnforge.patch_sdpa` routes those.

diffusers is imported by nothing here: the processor only uses the module's attributes, so this file imports
without diffusers installed.
"""

from __future__ import annotations

from typing import Any


class AttnforgeProcessor:
    """Drop-in for ``AttnProcessor2_0``: ``processor(attn, hidden_states, encoder_hidden_states=None,
    attention_mask=None, temb=None)``; hidden states ``[B, S, C]`` or ``[B, C, H, W]``."""

    def __call__(self, attn: Any, hidden_states: Any, encoder_hidden_states: Any = None,
                 attention_mask: Any = None, temb: Any = None, *args: Any, **kwargs: Any) -> Any:
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

        hidden_states = _attend(query, key, value, attention_mask, getattr(attn, "scale", None))

        hidden_states = hidden_states.transpose(1, 2).reshape(batch, -1, attn.heads * head_dim)
        hidden_states = hidden_states.to(query.dtype)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        if input_ndim == 4:
            hidden_states = hidden_states.transpose(-1, -2).reshape(batch, channel, height, width)
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        return hidden_states / attn.rescale_output_factor


def _attend(query: Any, key: Any, value: Any, mask: Any, scale: float | None) -> Any:
    """``[B, H, S, D]`` attention: attnforge without a mask, the unpatched SDPA with one."""
    if mask is not None:
        from attnforge.dispatch.sdpa_patch import original_sdpa

        return original_sdpa()(query, key, value, attn_mask=mask, dropout_p=0.0, is_causal=False, scale=scale)
    from attnforge.dispatch.runtime import attention

    return attention(query, key, value, scale=scale)
