"""The function the FlexAttention adapter compiles, in its own module so it can import torch at the top.

Imported only by :mod:`attnforge.backends.flex` on first use.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.attention.flex_attention import flex_attention


def flex_template(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, block_mask: Any,
                  scale: float | None, enable_gqa: bool) -> torch.Tensor:
    """``flex_attention`` with the arguments the adapter uses; copied per signature (see ``flex.py``)."""
    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)
