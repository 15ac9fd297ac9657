"""FlexAttention's features compiled for a CUDA GPU (skipped without one): outputs and gradients against the
float64 reference, rows that see no key, and one compiled copy per signature however the mask's content changes.

flex_attention has no backward on CPU, so this is where its gradients with softcap, window, masks and sinks are
checked (tests/dispatch/test_flex.py covers the rest on CPU).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from attnforge.backends import registry
from attnforge.backends.exact import reference_attention
from attnforge.backends.flex import FlexAdapter

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _flex() -> FlexAdapter:
    base = registry.adapters()["flex"]
    assert isinstance(base, FlexAdapter)
    return FlexAdapter(name="flex", caps=base.caps, requirement=base.requirement)  # real torch.compile


def _qkv(sq: int, sk: int, *, hq: int = 4, hkv: int = 2, d: int = 64, dtype: torch.dtype = torch.float32,
         grad: bool = True) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(sq * 1000 + sk)
    return tuple(torch.randn(2, h, s, d, device="cuda", dtype=dtype, generator=g).requires_grad_(grad)
                 for h, s in ((hq, sq), (hkv, sk), (hkv, sk)))


CASES = [
    pytest.param(True, {"softcap": 4.0}, id="softcap-causal"),
    pytest.param(False, {"window": (40, 17)}, id="window"),
    pytest.param(True, {"softcap": 30.0, "window": (64, 0)}, id="gemma2"),
    pytest.param(True, {"window": (32, 0), "causal_alignment": "top_left"}, id="window-top-left"),
    pytest.param(False, {"attn_mask": "bool"}, id="bool-mask"),
    pytest.param(True, {"attn_mask": "additive", "softcap": 5.0}, id="additive-mask-softcap"),
    pytest.param(True, {"sinks": "sinks", "return_lse": True}, id="sinks-lse"),
]


def _opts(spec: dict[str, Any], sq: int, sk: int) -> dict[str, Any]:
    g = torch.Generator(device="cuda").manual_seed(11)
    opts = dict(spec)
    if spec.get("attn_mask") == "bool":
        opts["attn_mask"] = torch.rand(2, 1, sq, sk, device="cuda", generator=g) > 0.3
    elif spec.get("attn_mask") == "additive":
        opts["attn_mask"] = torch.randn(1, 4, sq, sk, device="cuda", generator=g)
    if "sinks" in spec:
        opts["sinks"] = torch.randn(4, device="cuda", generator=g).requires_grad_()
    return opts


@pytest.mark.parametrize(("sq", "sk"), [pytest.param(150, 330, id="sq<sk"), pytest.param(330, 150, id="sq>sk")])
@pytest.mark.parametrize(("causal", "spec"), CASES)
def test_outputs_and_gradients_match_the_reference(causal: bool, spec: dict[str, Any], sq: int, sk: int) -> None:
    flex = _flex()
    q, k, v = _qkv(sq, sk)
    opts = _opts(spec, sq, sk)
    out = flex(q, k, v, causal=causal, scale=None, **opts)
    ref = reference_attention(q, k, v, causal=causal, scale=None, **opts)
    if opts.get("return_lse"):
        (out, lse), (ref, ref_lse) = out, ref
        torch.testing.assert_close(lse.double(), ref_lse.double(), atol=1e-4, rtol=1e-4)
        out, ref = out + lse.unsqueeze(-1), ref + torch.where(ref_lse.isinf(), 0, ref_lse).unsqueeze(-1)
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-4)
    leaves = [t for t in (q, k, v, opts.get("sinks")) if t is not None]
    weights = torch.randn(out.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(5))
    grads = torch.autograd.grad((out.nan_to_num(0.0, 0.0, 0.0) * weights).sum(), leaves)
    ref_grads = torch.autograd.grad((ref * weights).sum(), leaves)
    for got, want in zip(grads, ref_grads, strict=True):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), want.double(), atol=2e-3, rtol=2e-3)


def test_rows_that_see_no_key_are_zeros_with_finite_gradients() -> None:
    flex = _flex()
    q, k, v = _qkv(300, 140, dtype=torch.bfloat16)
    mask = torch.ones(300, 140, dtype=torch.bool, device="cuda")
    mask[200] = False  # row 200 sees nothing through the mask; rows 0-159 nothing through bottom-right causal
    out, lse = flex(q, k, v, causal=True, scale=None, attn_mask=mask, softcap=20.0, return_lse=True)
    for row in (0, 159, 200):
        assert torch.equal(out[:, :, row], torch.zeros_like(out[:, :, row]))
        assert bool((lse[:, :, row] == -math.inf).all())
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert all(bool(torch.isfinite(g).all()) for g in grads)


def test_gemma2_call_in_bf16_and_a_changed_mask_compiles_nothing_new() -> None:
    flex = _flex()
    q, k, v = _qkv(1024, 1024, hq=8, hkv=8, d=256, dtype=torch.bfloat16, grad=False)
    out = flex(q, k, v, causal=True, scale=None, softcap=50.0, window=(256, 0))
    ref = reference_attention(q, k, v, causal=True, scale=None, softcap=50.0, window=(256, 0))
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
    mask = torch.rand(1024, 1024, device="cuda") > 0.5
    for _ in range(3):
        out = flex(q, k, v, causal=False, scale=None, attn_mask=mask)
        torch.testing.assert_close(out.double(), reference_attention(q, k, v, attn_mask=mask), atol=2e-2, rtol=2e-2)
        mask.logical_not_()
    assert flex.compiled_signatures == 2
    assert flex.block_masks_built == 1
