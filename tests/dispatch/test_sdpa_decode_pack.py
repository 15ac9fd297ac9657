"""The SDPA adapter's one-row GQA calls (decode): packed onto the K/V heads, exact.

A decode call ``q [B, Hq, 1, D]`` with ``k [B, Hkv, Sk, D]`` goes to SDPA as ``q [B, Hkv, Hq/Hkv, D]`` with no
``enable_gqa``, as transformers' SDPA function does for a padded decode (``pack_gqa``); through
``enable_gqa`` with a mask a padded Llama-3-8B-shaped ``generate`` decoded 0.77x the default's tokens/s (H200,
docs/benchmarks.md 2026-11-27). These tests check every mask shape SDPA accepts against the float64 reference,
with the CUDA path's empty-row handling taken on CPU too, and that SDPA really got the packed call.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnforge.backends import registry
from attnforge.backends import sdpa as sdpa_module
from attnforge.backends.exact import reference_attention


@pytest.fixture(params=[True, False], ids=["cuda-path", "cpu-path"])
def seen(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The calls SDPA receives (q's shape and the keywords), with the adapter's CUDA path (rows that see no key
    opened and zeroed by the adapter) or its CPU path."""
    if request.param:
        monkeypatch.setattr(sdpa_module, "_safe_softmax_on_cpu", lambda: False)
    monkeypatch.setattr(sdpa_module, "_OPENED", sdpa_module._OpenedMasks())
    real = sdpa_module.original_sdpa()
    calls: list[dict[str, Any]] = []

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> torch.Tensor:
        calls.append({"q": tuple(q.shape), **kw})
        return real(q, k, v, **kw)

    monkeypatch.setattr(sdpa_module, "original_sdpa", lambda: spy)
    return calls


def _decode(b: int, hq: int, hkv: int, sk: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, 1, 8, generator=g, dtype=torch.float64)
    k = torch.randn(b, hkv, sk, 8, generator=g, dtype=torch.float64)
    v = torch.randn(b, hkv, sk, 8, generator=g, dtype=torch.float64)
    return q, k, v


MASK_SHAPES = ["b1", "bh", "h", "row", "one"]  # a [Sk] mask reaches backends as [1, Sk] (check_mask)


def _mask(kind: str, b: int, hq: int, sk: int, seed: int, *, additive: bool) -> torch.Tensor:
    """A padding-style mask of one of the shapes SDPA broadcasts to ``[B, Hq, 1, Sk]``; batch 0 row sees no key."""
    g = torch.Generator().manual_seed(seed + 1)
    shape = {"b1": (b, 1, 1, sk), "bh": (b, hq, 1, sk), "h": (hq, 1, sk), "row": (1, sk), "one": (1, 1, sk)}[kind]
    mask = torch.rand(shape, generator=g) > 0.3
    if kind in ("b1", "bh"):
        mask[0] = False  # a sequence whose every key is hidden (all padding)
    if additive:
        return torch.zeros(shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    return mask


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # seen is cleared per example
@given(groups=st.sampled_from([1, 2, 4, 7]), hkv=st.integers(1, 3), b=st.integers(1, 3), sk=st.integers(1, 40),
       kind=st.sampled_from(MASK_SHAPES), additive=st.booleans(), seed=st.integers(0, 2**16))
def test_a_decode_call_matches_the_reference_for_every_mask_shape(
        seen: list[dict[str, Any]], groups: int, hkv: int, b: int, sk: int, kind: str, additive: bool,
        seed: int) -> None:
    hq = hkv * groups
    q, k, v = _decode(b, hq, hkv, sk, seed)
    mask = _mask(kind, b, hq, sk, seed, additive=additive)
    seen.clear()
    out = registry.fallback()(q, k, v, causal=False, scale=None, attn_mask=mask)
    ref = reference_attention(q, k, v, causal=False, scale=None, attn_mask=mask)
    assert out.shape == (b, hq, 1, 8)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    call = seen[-1]
    if groups > 1:  # packed: Hkv heads, one row per query head of the group, no enable_gqa
        assert call["q"] == (b, hkv, groups, 8)
        assert "enable_gqa" not in call
    else:
        assert call["q"] == (b, hq, 1, 8)


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize("window", [None, (3, 0)])
def test_causal_and_windowed_decode_stay_exact(seen: list[dict[str, Any]], alignment: str,
                                               window: tuple[int, int] | None) -> None:
    """Top-left causal with one row sees key 0 only: SDPA's ``is_causal`` would be wrong on packed rows, so such
    a call is not packed; a window or a bottom-right causal call becomes a mask and is."""
    q, k, v = _decode(2, 8, 2, 12, seed=3)
    mask = torch.ones(2, 1, 1, 12, dtype=torch.bool)
    mask[1, ..., :4] = False
    for attn_mask in (None, mask):
        seen.clear()
        kw: dict[str, Any] = {"causal_alignment": alignment}
        if window is not None:
            kw["window"] = window
        if attn_mask is not None:
            kw["attn_mask"] = attn_mask
        out = registry.fallback()(q, k, v, causal=True, scale=None, **kw)
        ref = reference_attention(q, k, v, causal=True, scale=None, **kw)
        torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
        if seen[-1].get("is_causal"):
            assert seen[-1]["q"] == (2, 8, 1, 8)


def test_calls_of_more_than_one_row_are_not_packed(seen: list[dict[str, Any]]) -> None:
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 8, 3, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 10, 8, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.rand(2, 1, 3, 10, generator=g) > 0.2
    out = registry.fallback()(q, k, v, causal=False, scale=None, attn_mask=mask)
    torch.testing.assert_close(out, reference_attention(q, k, v, causal=False, scale=None, attn_mask=mask),
                               rtol=1e-9, atol=1e-9)
    assert seen[-1]["q"] == (2, 8, 3, 8)
    assert seen[-1]["enable_gqa"] is True


def test_a_packed_decode_call_has_gradients_equal_to_the_reference(seen: list[dict[str, Any]]) -> None:
    q, k, v = (t.requires_grad_(True) for t in _decode(2, 6, 2, 9, seed=7))
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    mask[1, ..., :3] = False
    out = registry.fallback()(q, k, v, causal=False, scale=0.5, attn_mask=mask)
    assert seen[-1]["q"] == (2, 2, 3, 8)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    ref = reference_attention(q, k, v, causal=False, scale=0.5, attn_mask=mask)
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
