"""Concrete adapters: registry, lazy imports, SDPA and FlexAttention numerics on CPU."""

from __future__ import annotations

import sys

import pytest
import torch

from attnforge.backends import registry
from attnforge.backends._base import bottom_right_mask
from attnforge.backends.exact import reference_attention
from attnforge.backends.flex import FlexAdapter
from attnforge.catalog import load_catalog
from tests.dispatch._compiler import CountingCompiler


def test_registry_is_keyed_by_catalog_ids() -> None:
    adapters = registry.adapters()
    assert set(adapters) == set(load_catalog().backends)
    assert all(a.name == bid for bid, a in adapters.items())
    assert registry.adapters()["flex"] is adapters["flex"]
    assert registry.fallback().name == "sdpa"


def test_missing_package_is_a_reason_not_an_error() -> None:
    adapter = registry.adapters()["flash-attn-3"]
    if "flash_attn_interface" in sys.modules:
        pytest.skip("flash_attn_interface is installed here")
    error = adapter.load_error()
    assert error is not None
    assert "flash_attn_interface" in error


def test_importing_the_registry_imports_no_backend_package() -> None:
    for name in ("flash_attn", "flash_attn_interface", "sageattention", "xformers"):
        assert name not in sys.modules


@pytest.mark.parametrize(("sq", "sk"), [pytest.param(3, 5, id="sq<sk"), pytest.param(5, 3, id="sq>sk"),
                                        pytest.param(4, 4, id="square")])
def test_bottom_right_mask(sq: int, sk: int) -> None:
    allowed, empty = bottom_right_mask(sq, sk, torch.device("cpu"))
    for i in range(sq):
        row_empty = i + sk - sq < 0
        assert (empty is not None and bool(empty[i, 0])) == row_empty
        if not row_empty:
            assert allowed[i].tolist() == [j <= i + sk - sq for j in range(sk)]


def _qkv(sq: int, sk: int, *, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(sq * 100 + sk)
    sizes = ((4, sq), (2, sk), (2, sk))  # Hq = 4, Hkv = 2: GQA
    return tuple(torch.randn(2, h, s, 8, generator=g, dtype=dtype) for h, s in sizes)


@pytest.mark.parametrize("name", ["sdpa-math", "sdpa"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("sq", "sk"), [pytest.param(3, 7, id="sq<sk"), pytest.param(7, 3, id="sq>sk")])
def test_sdpa_adapters_match_reference(name: str, causal: bool, sq: int, sk: int) -> None:
    adapter = registry.fallback() if name == "sdpa" else registry.adapters()[name]
    q, k, v = _qkv(sq, sk)
    out = adapter(q, k, v, causal=causal, scale=0.25)
    torch.testing.assert_close(out, reference_attention(q, k, v, causal=causal, scale=0.25))




@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
def test_flex_compiles_once_per_signature_with_its_own_code_object() -> None:
    base = registry.adapters()["flex"]
    assert isinstance(base, FlexAdapter)
    compiler = CountingCompiler()
    flex = FlexAdapter(name="flex", caps=base.caps, requirement=base.requirement, compiler=compiler)
    q, k, v = _qkv(5, 9, dtype=torch.float32)
    for _ in range(3):
        out = flex(q, k, v, causal=True, scale=None)
    torch.testing.assert_close(out, reference_attention(q, k, v, causal=True, scale=None).float())
    flex(q, k, v, causal=False, scale=None)
    q2, k2, v2 = _qkv(6, 9, dtype=torch.float32)
    flex(q2, k2, v2, causal=True, scale=None)
    assert flex.compiled_signatures == 3
    assert len(set(compiler.compiled)) == 3  # distinct code objects, hence distinct torch.compile caches


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch internals imported by inductor
def test_flex_real_compile_matches_reference_with_empty_rows() -> None:
    flex = registry.adapters()["flex"]
    q, k, v = _qkv(9, 5, dtype=torch.float32)
    out = flex(q, k, v, causal=True, scale=0.5)
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, causal=True, scale=0.5),
                               atol=1e-5, rtol=1e-4)


def test_the_bottom_right_mask_is_kept_except_when_made_inside_cuda_graph_capture(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A mask made inside capture is filled only when the graph replays: keeping it would hand garbage to eager
    calls (the meta device stands in for a GPU here). The SDPA adapter keeps its additive form."""
    from attnforge.backends.sdpa import _bottom_right_additive

    meta = torch.device("meta")
    assert _bottom_right_additive(7, 5, torch.float32, meta)[0] is _bottom_right_additive(7, 5, torch.float32, meta)[0]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # a capture needs CUDA initialized
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    inside = _bottom_right_additive(9, 6, torch.float32, meta)
    assert inside[0] is not _bottom_right_additive(9, 6, torch.float32, meta)[0]
    assert inside[0].shape == (9, 6) and inside[1] is not None and inside[1].shape == (9, 1)
