"""FlexAttention's features on CPU (eager flex_attention behind a non-compiling compiler): each against the float64
reference, rows that see no key, the block-mask cache, per-call mask tensors and one compiled copy per signature.

flex_attention has no backward on CPU (torch 2.13 raises), so the gradients of q/k/v are checked on the GPU
(tests/dispatch/test_flex_gpu.py); here only the sinks' gradient, which is attnforge's own math around flex's lse.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnforge.backends import registry
from attnforge.backends.adapter import AttentionCall
from attnforge.backends.exact import reference_attention
from attnforge.backends.flex import FlexAdapter
from tests.dispatch._compiler import CountingCompiler

pytestmark = pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")

TOL = {torch.float32: {"atol": 2e-5, "rtol": 2e-5}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}




def _flex() -> tuple[FlexAdapter, CountingCompiler]:
    base = registry.adapters()["flex"]
    assert isinstance(base, FlexAdapter)
    compiler = CountingCompiler()
    return FlexAdapter(name="flex", caps=base.caps, requirement=base.requirement, compiler=compiler), compiler


def _qkv(sq: int = 9, sk: int = 13, *, hq: int = 4, hkv: int = 2, d: int = 16, dv: int | None = None,
         dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, hq, sq, d, generator=g)
    k = torch.randn(2, hkv, sk, d, generator=g)
    v = torch.randn(2, hkv, sk, dv or d, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _check(flex: FlexAdapter, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
           **opts: Any) -> None:
    got = flex(q, k, v, causal=causal, scale=None, **opts)
    want = reference_attention(q, k, v, causal=causal, scale=None, **opts)
    if opts.get("return_lse"):
        (got, lse), (want, want_lse) = got, want
        assert lse.dtype == torch.float32
        assert lse.shape == q.shape[:3]
        torch.testing.assert_close(lse.double(), want_lse.double(), atol=2e-4, rtol=2e-4)  # lse: float32 sums
    assert got.dtype == q.dtype
    assert got.shape == (*q.shape[:3], v.shape[-1])
    torch.testing.assert_close(got.double(), want, **TOL[q.dtype])


def _masks(sq: int, sk: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {
        "bool-b1qk": torch.rand(2, 1, sq, sk, generator=g) > 0.3,
        "bool-qk": torch.rand(sq, sk, generator=g) > 0.3,
        "additive-hq": torch.randn(1, 4, sq, sk, generator=g),
        "additive-keys": torch.where(torch.rand(2, 1, 1, sk, generator=g) > 0.2, 0.0, -math.inf),
        "additive-f64": torch.randn(sq, sk, generator=g, dtype=torch.float64),
    }


FEATURES = [
    pytest.param(False, {}, id="plain"),
    pytest.param(True, {}, id="causal"),
    pytest.param(True, {"causal_alignment": "top_left"}, id="causal-top-left"),
    pytest.param(False, {"softcap": 2.5}, id="softcap"),
    pytest.param(False, {"window": (3, 2)}, id="window-both"),
    pytest.param(False, {"window": (4, None)}, id="window-left"),
    pytest.param(False, {"window": (-1, 1)}, id="window-right"),
    pytest.param(True, {"window": (3, 0)}, id="window-causal"),
    pytest.param(False, {"window": (2, 5), "causal_alignment": "top_left"}, id="window-top-left"),
    pytest.param(False, {"return_lse": True}, id="lse"),
    pytest.param(True, {"sinks": torch.tensor([0.5, -1.0, 2.0, 0.0]), "return_lse": True}, id="sinks-lse"),
    pytest.param(True, {"softcap": 5.0, "window": (4, 0)}, id="gemma2"),
    pytest.param(True, {"softcap": 3.0, "window": (5, 0), "sinks": torch.tensor([1.0, 0.0, -2.0, 0.5]),
                        "return_lse": True, "causal_alignment": "top_left"}, id="all-structural"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("sq", "sk"), [pytest.param(9, 13, id="sq<sk"), pytest.param(13, 9, id="sq>sk")])
@pytest.mark.parametrize(("causal", "opts"), FEATURES)
def test_each_feature_and_combination_matches_the_reference(causal: bool, opts: dict[str, Any], sq: int, sk: int,
                                                            dtype: torch.dtype) -> None:
    flex, _ = _flex()
    _check(flex, *_qkv(sq, sk, dtype=dtype), causal=causal, **opts)


@pytest.mark.parametrize("name", list(_masks(9, 13)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_bool_and_additive_masks_with_the_other_features(name: str, dtype: torch.dtype) -> None:
    flex, _ = _flex()
    mask = _masks(9, 13)[name]
    q, k, v = _qkv(9, 13, dtype=dtype, dv=8)
    _check(flex, q, k, v, causal=False, attn_mask=mask)
    _check(flex, q, k, v, causal=True, attn_mask=mask, softcap=4.0, window=(6, 0), return_lse=True,
           sinks=torch.tensor([0.0, 1.0, -1.0, 3.0]))


def test_rows_that_see_no_key_are_zeros_with_lse_minus_inf() -> None:
    flex, _ = _flex()
    q, k, v = _qkv(13, 9)
    mask = torch.ones(13, 9, dtype=torch.bool)
    mask[5] = False  # row 5 sees nothing through the mask; rows 0-3 nothing through bottom-right causal
    for opts in ({}, {"attn_mask": mask}, {"attn_mask": torch.zeros(13, 9).masked_fill(~mask, -math.inf)},
                 {"window": (1, 0), "attn_mask": mask, "softcap": 2.0}):
        out, lse = flex(q, k, v, causal=True, scale=None, return_lse=True, **opts)
        for row in (0, 3, 5) if opts else (0, 3):
            assert torch.equal(out[:, :, row], torch.zeros_like(out[:, :, row]))
            assert torch.equal(lse[:, :, row], torch.full_like(lse[:, :, row], -math.inf))
        assert torch.isfinite(out).all()
        _check(flex, q, k, v, causal=True, return_lse=True, **opts)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    out, lse = flex(q, k, v, causal=True, scale=None, return_lse=True, sinks=sinks, attn_mask=mask)
    assert torch.equal(out[:, :, 5], torch.zeros_like(out[:, :, 5]))
    assert torch.equal(lse[:, :, 5], sinks.view(1, 4).expand(2, 4))  # only the sink: lse is its logit


def test_the_sinks_gradient_matches_the_reference() -> None:
    flex, _ = _flex()
    q, k, v = _qkv(9, 13)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)
    out, lse = flex(q, k, v, causal=True, scale=None, sinks=sinks, return_lse=True)
    want, want_lse = reference_attention(q, k, v, causal=True, scale=None, sinks=sinks, return_lse=True)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    (got,) = torch.autograd.grad((out * weights).sum() + lse.sum(), sinks)
    (ref,) = torch.autograd.grad((want * weights).sum() + want_lse.sum(), sinks)
    torch.testing.assert_close(got.double(), ref.double(), atol=1e-5, rtol=1e-5)


def test_block_masks_are_built_once_per_structure_and_tensor_masks_never() -> None:
    flex, _ = _flex()
    q, k, v = _qkv(9, 13)
    for _ in range(3):
        flex(q, k, v, causal=True, scale=None)
        flex(q, k, v, causal=True, scale=None, softcap=2.0)  # another signature, the same block mask
        flex(q, k, v, causal=False, scale=None, window=(-1, 0))  # bounds equal to causal: the same block mask
    assert flex.block_masks_built == 1
    flex(q, k, v, causal=True, scale=None, causal_alignment="top_left")
    flex(q, k, v, causal=True, scale=None, window=(3, None))
    flex(*_qkv(10, 13), causal=True, scale=None)
    assert flex.block_masks_built == 4
    flex(q, k, v, causal=False, scale=None, attn_mask=torch.ones(9, 13, dtype=torch.bool))
    flex(q, k, v, causal=False, scale=None, softcap=3.0)
    assert flex.block_masks_built == 4  # masks given as tensors and softcap are score_mods, no block mask


def test_a_changed_mask_tensor_is_honoured_without_a_new_compile() -> None:
    flex, compiler = _flex()
    q, k, v = _qkv(9, 13)
    mask = torch.rand(9, 13, generator=torch.Generator().manual_seed(1)) > 0.5
    first = flex(q, k, v, causal=False, scale=None, attn_mask=mask)
    torch.testing.assert_close(first.double(), reference_attention(q, k, v, attn_mask=mask), **TOL[q.dtype])
    mask.logical_not_()  # in place: the same tensor object, new content
    second = flex(q, k, v, causal=False, scale=None, attn_mask=mask)
    torch.testing.assert_close(second.double(), reference_attention(q, k, v, attn_mask=mask), **TOL[q.dtype])
    other = torch.rand(9, 13, generator=torch.Generator().manual_seed(2)) > 0.5
    third = flex(q, k, v, causal=False, scale=None, attn_mask=other)
    torch.testing.assert_close(third.double(), reference_attention(q, k, v, attn_mask=other), **TOL[q.dtype])
    assert not torch.equal(first, second)
    assert len(compiler.compiled) == 1  # the mask is an argument of the one compiled copy, not baked into it


def test_a_new_softcap_or_feature_set_compiles_a_new_signature_once() -> None:
    flex, compiler = _flex()
    q, k, v = _qkv(9, 13)
    for _ in range(2):
        flex(q, k, v, causal=True, scale=None, softcap=2.0)
    assert flex.compiled_signatures == 1
    flex(q, k, v, causal=True, scale=None, softcap=3.0)
    flex(q, k, v, causal=True, scale=None, softcap=3.0, return_lse=True)
    flex(q, k, v, causal=True, scale=None, softcap=3.0, window=(2, 0))
    flex(q, k, v, causal=True, scale=None, softcap=3.0, window=(3, 0))
    flex(q, k, v, causal=True, scale=None, softcap=3.0, sinks=torch.zeros(4))
    flex(q, k, v, causal=True, scale=None, softcap=3.0, attn_mask=torch.zeros(9, 13))
    flex(q, k, v, causal=True, scale=None, softcap=3.0, attn_mask=torch.zeros(9, 13, dtype=torch.bool))
    flex(q, k, v, causal=True, scale=None, softcap=3.0, attn_mask=torch.zeros(2, 1, 9, 13, dtype=torch.bool))
    for _ in range(2):
        flex(q, k, v, causal=True, scale=None, softcap=3.0, attn_mask=torch.ones(9, 13, dtype=torch.bool))
    assert flex.compiled_signatures == 9
    assert len(set(compiler.compiled)) == 9  # each its own code object, hence its own torch.compile cache


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sq=st.integers(1, 24), sk=st.integers(1, 24), groups=st.sampled_from([(1, 1), (2, 1), (4, 2)]),
       causal=st.booleans(), top_left=st.booleans(),
       window=st.none() | st.tuples(st.none() | st.integers(-1, 8), st.none() | st.integers(-1, 8)),
       softcap=st.none() | st.floats(0.5, 50.0), lse=st.booleans(), seed=st.integers(0, 2**16))
@pytest.mark.slow
def test_random_shapes_windows_and_softcaps_match_the_reference(  # noqa: PLR0917 - one draw per argument
        sq: int, sk: int, groups: tuple[int, int], causal: bool, top_left: bool,
        window: tuple[int | None, int | None] | None, softcap: float | None, lse: bool, seed: int) -> None:
    flex, _ = _flex()
    opts: dict[str, Any] = {"causal_alignment": "top_left"} if top_left else {}
    if window is not None:
        opts["window"] = window
    if softcap is not None:
        opts["softcap"] = softcap
    if lse:
        opts["return_lse"] = True
    _check(flex, *_qkv(sq, sk, hq=groups[0], hkv=groups[1], d=8, seed=seed), causal=causal, **opts)


@pytest.mark.parametrize(("features", "declined"), [
    pytest.param(frozenset({"lse"}), True, id="lse"), pytest.param(frozenset({"sinks"}), True, id="sinks"),
    pytest.param(frozenset({"softcap", "window", "mask"}), False, id="softcap-window-mask")])
def test_compiled_for_cpu_flex_declines_lse_and_sinks_only(features: frozenset[str], declined: bool) -> None:
    call = AttentionCall(device_type="cpu", compute_capability=None, dtype="float32", batch=1, heads_q=2,
                         heads_kv=2, seqlen_q=8, seqlen_k=8, head_dim=16, causal=True, needs_grad=False,
                         features=features)
    compiled = registry.adapters()["flex"]
    assert any("returns no lse" in r for r in compiled.unsupported_reasons(call)) is declined
    assert not _flex()[0].unsupported_reasons(call)  # eager flex_attention has every feature on CPU
    assert not compiled.unsupported_reasons(dataclasses.replace(call, device_type="cuda", compute_capability=(9, 0)))


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch internals imported by inductor
def test_real_compile_serves_gemma2_features_and_follows_a_changed_mask() -> None:
    base = registry.adapters()["flex"]
    assert isinstance(base, FlexAdapter)
    flex = FlexAdapter(name="flex", caps=base.caps, requirement=base.requirement)  # torch.compile, on CPU
    q, k, v = _qkv(40, 48, d=32, dv=16)
    mask = torch.rand(40, 48, generator=torch.Generator().manual_seed(4)) > 0.2
    opts = {"softcap": 3.0, "window": (10, 0), "attn_mask": mask}
    for _ in range(2):
        out = flex(q, k, v, causal=True, scale=None, **opts)
        torch.testing.assert_close(out.double(), reference_attention(q, k, v, causal=True, scale=None, **opts),
                                   **TOL[torch.float32])
        mask.logical_not_()
    assert flex.compiled_signatures == 1


def test_a_decode_loop_with_a_mask_and_softcap_stops_compiling_per_step(tmp_path: Any) -> None:
    """Flex compiles one kernel per exact shape; a decode loop makes a new shape every step (Sk grows), so after
    DYNAMIC_AFTER shapes its class is dynamic and decided without flex (here: the exact math; SDPA lacks
    softcap). Before, only plain calls counted shapes: a masked softcap decode compiled flex on every step."""
    from pathlib import Path

    from attnforge.dispatch import features, runtime
    from attnforge.records import RecordStore, VerifyRecord, device_key

    flex, compiler = _flex()
    store = RecordStore(Path(tmp_path))
    store.add_verify(VerifyRecord(device_key=device_key("cpu", None, torch.__version__), backend="flex",
                                  backend_version=None, ok=True, summary="ok"))
    previous = runtime.set_dispatcher(runtime.Dispatcher({"flex": flex}, records=store))
    try:
        q = torch.randn(2, 4, 1, 16, generator=torch.Generator().manual_seed(0))
        for step in range(10):
            k, v = (torch.randn(2, 2, 40 + step, 16, generator=torch.Generator().manual_seed(step + s))
                    for s in (1, 2))
            mask = torch.ones(2, 1, 1, 40 + step, dtype=torch.bool)  # one length bucket (33-64)
            mask[1, ..., :7] = False
            got = runtime.attention(q, k, v, attn_mask=mask, softcap=30.0)
            want = reference_attention(q, k, v, causal=False, scale=None, attn_mask=mask, softcap=30.0)
            torch.testing.assert_close(got.double(), want, **TOL[torch.float32])
        assert len(compiler.compiled) == features.DYNAMIC_AFTER
        assert "changed shape" in str(runtime.explain(q, k, v, attn_mask=mask, softcap=30.0))
    finally:
        runtime.set_dispatcher(previous)


def test_block_masks_kept_are_bounded_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A windowed decode loop makes a new block mask per step: only the newest BLOCK_MASKS_KEPT stay."""
    from attnforge.backends import flex as flex_module

    monkeypatch.setattr(flex_module, "BLOCK_MASKS_KEPT", 2)
    flex, _ = _flex()
    q = _qkv(1, 20)[0]
    for sk in (20, 21, 22):
        k, v = _qkv(1, sk)[1:]
        _check(flex, q, k, v, causal=False, window=(4, 0))
    assert flex.block_masks_built == 2
    k, v = _qkv(1, 22)[1:]
    _check(flex, q, k, v, causal=False, window=(4, 0))  # the newest stays kept
    assert flex.block_masks_built == 2
