"""The function the FlexAttention adapter compiles, in its own module so it can import torch at the top.

Imported only by :mod:`attnforge.backends.flex` on first use. Everything that varies per call is an argument:
tensors (``mask``, ``sinks``) are read inside ``score_mod`` closures defined here, so torch.compile lifts them
as graph inputs and a changed tensor is always honoured; the scalars (``softcap``, ``scale``) are Python
constants the compiled copy specialises on, which is why the adapter puts them in its signature.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.attention import flex_attention as _flex

flex_attention = _flex.flex_attention
#: torch >= 2.9 asks for the lse through ``return_aux=AuxRequest(lse=True)`` (``return_lse`` is deprecated)
_AUX = getattr(_flex, "AuxRequest", None)


def flex_template(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                  sinks: torch.Tensor | None, *, block_mask: Any, scale: float | None, enable_gqa: bool,
                  softcap: float | None, return_lse: bool) -> Any:
    """``flex_attention`` with attnforge's features; copied per signature (see ``flex.py``).

    Args:
        q, k, v: ``[B, Hq, Sq, D]``, ``[B, Hkv, Sk, D]``, ``[B, Hkv, Sk, Dv]``.
        mask: None, or a bool (True = visible) or additive float mask expanded to ``[B, Hq, Sq, Sk]``
            (a broadcast view), applied after the softcap as in :func:`attnforge.backends.exact.exact_attention`.
        sinks: None or ``[Hq]`` float32 sink logits: ``out * sigmoid(lse - sink)`` and
            ``lse' = logaddexp(lse, sink)`` are exactly a softmax whose denominator has ``exp(sink)`` added.
        block_mask: the cached structural (causal/window) ``BlockMask``, or None.
        softcap: ``c`` of ``c * tanh(score / c)`` on the scaled scores, or None.
        return_lse: also return the float32 ``[B, Hq, Sq]`` natural-log lse (``-inf`` on rows that see no key,
            the sink's logit with sinks).

    Returns:
        ``[B, Hq, Sq, Dv]`` in q's dtype, and the lse with ``return_lse``. Rows that see no key are zeros
        (flex_attention's convention, checked by tests/dispatch/test_flex.py).
    """
    score_mod = None
    if softcap is not None or mask is not None:

        def score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            if softcap is not None:
                score = softcap * torch.tanh(score / softcap)
            if mask is not None:
                seen = mask[b, h, q_idx, kv_idx]
                score = torch.where(seen, score, -float("inf")) if mask.dtype == torch.bool else score + seen
            return score

    need_lse = return_lse or sinks is not None
    if not need_lse:
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                              enable_gqa=enable_gqa)
    if _AUX is not None:
        out, aux = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                                  enable_gqa=enable_gqa, return_aux=_AUX(lse=True))
        lse = aux.lse
    else:  # torch < 2.9
        out, lse = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                                  enable_gqa=enable_gqa, return_lse=True)
    if sinks is not None:
        sink = sinks.view(1, -1, 1)
        out = (out.float() * torch.sigmoid(lse - sink).unsqueeze(-1)).to(out.dtype)
        lse = torch.logaddexp(lse, sink)
    return (out, lse) if return_lse else out
