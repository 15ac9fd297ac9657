"""AttnforgeProcessor against diffusers' AttnProcessor2_0 (skipped without diffusers; CI has none, the
processor's logic is also checked against a minimal stand-in module below)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from attnforge.integrations.diffusers import AttnforgeProcessor


def _standin(heads: int = 2, dim: int = 16) -> Any:
    """The attributes of diffusers' Attention that a processor reads, with plain Linear layers."""
    torch.manual_seed(0)
    lin = lambda: torch.nn.Linear(dim, dim)  # noqa: E731
    return SimpleNamespace(spatial_norm=None, group_norm=None, norm_cross=None, norm_q=None, norm_k=None,
                           heads=heads, scale=(dim // heads) ** -0.5, to_q=lin(), to_k=lin(), to_v=lin(),
                           to_out=[lin(), torch.nn.Identity()], residual_connection=True,
                           rescale_output_factor=2.0)


def test_processor_logic_matches_hand_written_attention() -> None:
    attn = _standin()
    x = torch.randn(2, 5, 16)
    ctx = torch.randn(2, 7, 16)
    b, h, d = 2, 2, 8
    q = attn.to_q(x).view(b, -1, h, d).transpose(1, 2)
    k = attn.to_k(ctx).view(b, -1, h, d).transpose(1, 2)
    v = attn.to_v(ctx).view(b, -1, h, d).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, -1, h * d)
    want = (attn.to_out[0](o) + x) / 2.0
    with torch.no_grad():
        got = AttnforgeProcessor()(attn, x, encoder_hidden_states=ctx)
        want = want.detach()
    torch.testing.assert_close(got, want)


def test_matches_attn_processor_2_0_in_a_real_diffusers_attention() -> None:
    diffusers = pytest.importorskip("diffusers")
    from diffusers.models.attention_processor import Attention, AttnProcessor2_0

    torch.manual_seed(0)
    attn = Attention(query_dim=32, heads=4, dim_head=8, cross_attention_dim=24, residual_connection=True,
                     rescale_output_factor=1.5).eval()
    x, ctx = torch.randn(2, 6, 32), torch.randn(2, 9, 24)
    with torch.no_grad():
        attn.set_processor(AttnProcessor2_0())
        want = attn(x, encoder_hidden_states=ctx)
        attn.set_processor(AttnforgeProcessor())
        got = attn(x, encoder_hidden_states=ctx)
        mask = torch.ones(2, 9, dtype=torch.bool)
        mask[0, 4:] = False
        got_masked = attn(x, encoder_hidden_states=ctx, attention_mask=mask)
        attn.set_processor(AttnProcessor2_0())
        want_masked = attn(x, encoder_hidden_states=ctx, attention_mask=mask)
    assert diffusers.__version__
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_masked, want_masked)
