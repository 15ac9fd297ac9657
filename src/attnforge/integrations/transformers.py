"""``attn_implementation="attnforge"`` for transformers models (transformers >= 4.48 ``AttentionInterface``).

After :func:`register`, ``AutoModel.from_pretrained(..., attn_implementation="attnforge")`` (or
``model.set_attn_implementation("attnforge")``) sends every attention call that attnforge can serve exactly
to :func:`attnforge.attention`; the rest (padding masks, dropout, position biases, paged caches, softcap,
``output_attentions``, causal with Sq != Sk, whose top-left meaning in transformers differs from attnforge's
bottom-right) go to transformers' own SDPA function unchanged. Masks are built as for ``"sdpa"`` (the SDPA
mask function is registered under the same name), so a batch without padding gets no mask at all.

Contract of the registered function (runtime-anchors.md §2.2): ``fn(module, query, key, value,
attention_mask, **kwargs) -> (attn_output, attn_weights)``, with q/k/v ``[B, H, S, D]`` in and the output
``[B, S, H, D]``.
"""

from __future__ import annotations

from typing import Any

NAME = "attnforge"
_PASS_THROUGH_KWARGS = ("position_bias", "cache", "softcap", "sliding_window", "s_aux")


def attention_forward(  # noqa: PLR0917 - transformers' AttentionInterface signature
    module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                      dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
                      **kwargs: Any) -> tuple[Any, None]:
    """The function registered as ``"attnforge"``: q ``[B, Hq, Sq, D]``, k/v ``[B, Hkv, Sk, D]``.

    Returns:
        ``([B, Sq, Hq, D] contiguous, None)`` as transformers' SDPA function does.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    causal = causal and query.shape[2] > 1
    servable = (attention_mask is None and dropout == 0.0 and not kwargs.get("output_attentions", False)
                and all(kwargs.get(name) is None for name in _PASS_THROUGH_KWARGS)
                and not (causal and query.shape[2] != key.shape[2]))
    if not servable:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    from attnforge.dispatch.runtime import attention

    out = attention(query, key, value, causal=causal, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register ``"attnforge"`` with transformers' ``AttentionInterface`` and ``AttentionMaskInterface``.

    Idempotent. Raises ImportError when transformers is not installed.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
