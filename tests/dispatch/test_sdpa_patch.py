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


def test_patches_ended_out_of_order_put_the_original_back_once_the_last_ends() -> None:
    """Two threads' ``with patch_sdpa():`` blocks overlap in any order: A enters, B enters, A leaves, B leaves.
    B had recorded the patched function as what it replaced and put it back, and the original was forgotten, so
    SDPA stayed patched for good and a call left to SDPA (inside ``sdpa_kernel``) recursed without end."""
    a, b = attnforge.patch_sdpa(), attnforge.patch_sdpa()
    a.restore()
    assert F.scaled_dot_product_attention is not ORIGINAL and original_sdpa() is ORIGINAL  # b still routes
    b.restore()
    assert F.scaled_dot_product_attention is ORIGINAL and original_sdpa() is ORIGINAL
    q, k, v = _qkv()
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v), ORIGINAL(q, k, v))


def test_overlapping_patches_in_threads_leave_sdpa_as_it_was() -> None:
    import threading

    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with attnforge.patch_sdpa():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def second() -> None:
        a_in.wait(10)
        with attnforge.patch_sdpa():
            b_in.set()
            a_out.wait(10)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert F.scaled_dot_product_attention is ORIGINAL and original_sdpa() is ORIGINAL


def test_a_function_another_library_installed_over_a_patch_is_put_back_in_reverse_order() -> None:
    def wrapper(*args: Any, **kwargs: Any) -> Any:  # another library's patch, calling what it replaced
        return inner(*args, **kwargs)

    outer = attnforge.patch_sdpa()
    inner = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = wrapper
    try:
        with attnforge.patch_sdpa():
            assert F.scaled_dot_product_attention is not wrapper
        assert F.scaled_dot_product_attention is wrapper
        q, k, v = _qkv()
        torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v), ORIGINAL(q, k, v))
    finally:
        F.scaled_dot_product_attention = inner
        outer.restore()
    assert F.scaled_dot_product_attention is ORIGINAL and original_sdpa() is ORIGINAL


@pytest.mark.parametrize(("kwargs", "shapes", "routed"), [
    pytest.param({}, {}, True, id="plain"),
    pytest.param({"is_causal": True}, {}, True, id="causal-square"),
    pytest.param({"scale": 0.3}, {}, True, id="scale"),
    pytest.param({"enable_gqa": True}, {"hkv": 2}, True, id="gqa"),
    pytest.param({"is_causal": True}, {"sq": 3}, True, id="causal-top-left-rect"),
    pytest.param({"attn_mask": torch.ones(6, 6, dtype=torch.bool).tril()}, {}, True, id="mask"),
    pytest.param({"attn_mask": torch.randn(1, 6, 6)}, {}, True, id="additive-mask"),
    pytest.param({"dropout_p": 0.5}, {}, True, id="dropout"),
    pytest.param({"attn_mask": torch.ones(6, 6, dtype=torch.bool), "is_causal": True}, {}, False,
                 id="mask-and-causal-sdpa-refuses"),
])
def test_routes_only_what_it_serves_exactly(monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any],
                                            shapes: dict[str, int], routed: bool) -> None:
    spy = Spy(monkeypatch)
    q, k, v = _qkv(**shapes)
    torch.manual_seed(0)
    try:
        want = ORIGINAL(q, k, v, **kwargs)
    except RuntimeError as exc:  # SDPA refuses: the patched function must refuse alike
        with attnforge.patch_sdpa(), pytest.raises(RuntimeError, match=str(exc)[:20]):
            F.scaled_dot_product_attention(q, k, v, **kwargs)
        assert spy.calls == 0
        return
    with attnforge.patch_sdpa():
        torch.manual_seed(0)
        got = F.scaled_dot_product_attention(q, k, v, **kwargs)
    assert spy.calls == int(routed)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("kernels", [["MATH"], ["MATH", "FLASH_ATTENTION"], ["EFFICIENT_ATTENTION", "MATH"]])
def test_an_explicit_sdpa_kernel_context_of_the_user_is_respected(monkeypatch: pytest.MonkeyPatch,
                                                                  kernels: list[str]) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    spy = Spy(monkeypatch)
    q, k, v = _qkv()
    with attnforge.patch_sdpa():
        F.scaled_dot_product_attention(q, k, v)
        assert spy.calls == 1
        with sdpa_kernel([getattr(SDPBackend, name) for name in kernels]):
            got = F.scaled_dot_product_attention(q, k, v)
        assert spy.calls == 1  # the user's choice reached SDPA untouched
        F.scaled_dot_product_attention(q, k, v)
        assert spy.calls == 2
    torch.testing.assert_close(got, ORIGINAL(q, k, v))
