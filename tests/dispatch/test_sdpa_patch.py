"""patch_sdpa(): servable SDPA calls go through the dispatcher, the rest reach the original untouched."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

import attnforge
from attnforge.dispatch import runtime
from attnforge.dispatch.sdpa_patch import original_sdpa

ORIGINAL = F.scaled_dot_product_attention


class Spy:
    """Counts how often the dispatcher serves a call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = runtime.attention

        def spy(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(runtime, "attention", spy)


def _qkv(hq: int = 4, hkv: int = 4, sq: int = 6, sk: int = 6) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(5)
    return tuple(torch.randn(1, h, s, 8, generator=g) for h, s in ((hq, sq), (hkv, sk), (hkv, sk)))


def test_context_manager_restores_the_original() -> None:
    with attnforge.patch_sdpa() as patch:
        assert F.scaled_dot_product_attention is not ORIGINAL
        assert patch.active
    assert F.scaled_dot_product_attention is ORIGINAL
    assert original_sdpa() is ORIGINAL


def test_function_form_restores_and_restore_is_idempotent() -> None:
    patch = attnforge.patch_sdpa()
    try:
        assert F.scaled_dot_product_attention is not ORIGINAL
    finally:
        patch.restore()
    patch.restore()
    assert F.scaled_dot_product_attention is ORIGINAL


def test_restores_even_when_the_body_raises() -> None:
    with pytest.raises(ValueError, match="boom"), attnforge.patch_sdpa():
        raise ValueError("boom")
    assert F.scaled_dot_product_attention is ORIGINAL


def test_nested_patches_restore_in_order() -> None:
    with attnforge.patch_sdpa():
        with attnforge.patch_sdpa():
            assert original_sdpa() is ORIGINAL
        assert F.scaled_dot_product_attention is not ORIGINAL
    assert F.scaled_dot_product_attention is ORIGINAL


@pytest.mark.parametrize(("kwargs", "shapes", "routed"), [
    pytest.param({}, {}, True, id="plain"),
    pytest.param({"is_causal": True}, {}, True, id="causal-square"),
    pytest.param({"scale": 0.3}, {}, True, id="scale"),
    pytest.param({"enable_gqa": True}, {"hkv": 2}, True, id="gqa"),
    pytest.param({"is_causal": True}, {"sq": 3}, False, id="causal-top-left-rect"),
    pytest.param({"attn_mask": torch.ones(6, 6, dtype=torch.bool).tril()}, {}, False, id="mask"),
    pytest.param({"dropout_p": 0.5}, {}, False, id="dropout"),
])
def test_routes_only_what_it_serves_exactly(monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any],
                                            shapes: dict[str, int], routed: bool) -> None:
    spy = Spy(monkeypatch)
    q, k, v = _qkv(**shapes)
    torch.manual_seed(0)
    want = ORIGINAL(q, k, v, **kwargs)
    with attnforge.patch_sdpa():
        torch.manual_seed(0)
        got = F.scaled_dot_product_attention(q, k, v, **kwargs)
    assert spy.calls == int(routed)
    torch.testing.assert_close(got, want)
