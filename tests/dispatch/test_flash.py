"""FlashAttention 2/3/4 adapters over stand-in kernel modules: each version's spelling of the features, bhsd
inputs reaching the kernel as views in forward and backward, and a slim FA3 build's capabilities."""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Any

import pytest
import torch

from attnforge.backends import registry
from attnforge.backends._base import Requirement
from attnforge.backends.adapter import AttentionCall
from attnforge.backends.exact import reference_attention
from attnforge.backends.flash import (
    FlashAttn3Adapter,
    FlashAttn4Adapter,
    FlashAttnAdapter,
    capabilities_from_build,
)


class _Kernel(torch.autograd.Function):
    """A BSHD kernel with its own backward (as FlashAttention's): records what forward and backward got."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seen: dict[str, Any],  # noqa: PLR0917
                kwargs: dict[str, Any]) -> torch.Tensor:
        seen["fwd"] = (q, k, v)
        ctx.save_for_backward(q, k, v)
        ctx.seen, ctx.kwargs = seen, kwargs
        return _bshd_ref(q, k, v, kwargs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        ctx.seen["bwd"] = grad
        q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        with torch.enable_grad():
            out = _bshd_ref(q, k, v, ctx.kwargs)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
        return dq, dk, dv, None, None


def _bshd_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    window = kwargs.get("window_size")
    if window is not None:
        window = tuple(None if s is None or s < 0 else s for s in window)
    out = reference_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                              causal=kwargs.get("causal", False), scale=kwargs.get("softmax_scale"), window=window,
                              softcap=kwargs.get("softcap") or None, sinks=kwargs.get("learnable_sink"))
    return out.transpose(1, 2).to(q.dtype)


def _module(name: str, calls: list[tuple[str, dict[str, Any]]], seen: dict[str, Any]) -> types.ModuleType:
    module = types.ModuleType(name)

    def flash_attn_func(q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
        calls.append(("dense", kwargs))
        out = _Kernel.apply(q, k, v, seen, kwargs)
        if kwargs.get("return_attn_probs") or kwargs.get("return_lse"):
            lse = torch.zeros(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)
            return out, lse
        return out

    def flash_attn_varlen_func(q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
        calls.append(("varlen", kwargs))
        seen["varlen"] = (q, k, v)
        return q

    module.flash_attn_func = flash_attn_func  # type: ignore[attr-defined]
    module.flash_attn_varlen_func = flash_attn_varlen_func  # type: ignore[attr-defined]
    return module


def _adapter(cls: type, bid: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[Any], dict[str, Any]]:
    calls: list[tuple[str, dict[str, Any]]] = []
    seen: dict[str, Any] = {}
    monkeypatch.setitem(sys.modules, f"fake_{bid}", _module(f"fake_{bid}", calls, seen))
    caps = registry.adapters()[bid].caps  # type: ignore[attr-defined]
    caps = dataclasses.replace(caps, devices=("cpu",), support=dataclasses.replace(caps.support, dtypes=("float32",)))
    return cls(name=bid, caps=caps, requirement=Requirement(modules=(f"fake_{bid}",))), calls, seen


def _qkv(sq: int = 5, sk: int = 7) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(8)
    return tuple(torch.randn(2, h, s, 8, generator=g).requires_grad_() for h, s in ((4, sq), (2, sk), (2, sk)))


def test_the_registry_builds_one_class_per_version() -> None:
    built = registry.adapters()
    assert type(built["flash-attn"]) is FlashAttnAdapter
    assert type(built["flash-attn-3"]) is FlashAttn3Adapter
    assert type(built["flash-attn-4"]) is FlashAttn4Adapter


@pytest.mark.parametrize(("cls", "bid", "expected"), [
    pytest.param(FlashAttnAdapter, "flash-attn", {"window_size": (3, -1), "softcap": 2.0, "dropout_p": 0.1,
                                                  "return_attn_probs": True}, id="fa2"),
    pytest.param(FlashAttn3Adapter, "flash-attn-3", {"window_size": (3, -1), "softcap": 2.0,
                                                     "return_attn_probs": True}, id="fa3"),
    pytest.param(FlashAttn4Adapter, "flash-attn-4", {"window_size": (3, None), "softcap": 2.0,
                                                     "return_lse": True, "learnable_sink": "sinks"}, id="fa4"),
])
def test_each_version_gets_the_features_in_its_own_spelling(monkeypatch: pytest.MonkeyPatch, cls: type,
                                                            bid: str, expected: dict[str, Any]) -> None:
    fa, calls, _ = _adapter(cls, bid, monkeypatch)
    q, k, v = _qkv()
    opts: dict[str, Any] = {"window": (3, None), "softcap": 2.0, "return_lse": True}
    if "dropout_p" in expected:
        opts["dropout_p"] = 0.1
    sinks = torch.randn(4)
    if "learnable_sink" in expected:
        opts["sinks"] = sinks
        expected = {**expected, "learnable_sink": sinks}
    out, lse = fa(q, k, v, causal=True, scale=0.5, **opts)
    kind, kwargs = calls[-1]
    assert kind == "dense"
    assert kwargs == {"softmax_scale": 0.5, "causal": True, **expected}
    assert out.shape == (2, 4, 5, 8) and lse.shape == (2, 4, 5) and lse.dtype == torch.float32


def test_a_plain_call_passes_only_scale_and_causal(monkeypatch: pytest.MonkeyPatch) -> None:
    fa, calls, _ = _adapter(FlashAttn3Adapter, "flash-attn-3", monkeypatch)
    q, k, v = _qkv()
    fa(q, k, v, causal=False, scale=None)
    assert calls[-1] == ("dense", {"softmax_scale": None, "causal": False})


def test_varlen_reaches_the_varlen_entry_with_the_packed_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    fa, calls, seen = _adapter(FlashAttn4Adapter, "flash-attn-4", monkeypatch)
    q = torch.randn(9, 4, 8)
    k = v = torch.randn(11, 2, 8)
    cu_q, cu_k = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 5, 11], dtype=torch.int32)
    fa(q, k, v, causal=True, scale=None, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=5, max_seqlen_k=6)
    kind, kwargs = calls[-1]
    assert kind == "varlen" and kwargs["cu_seqlens_q"] is cu_q and kwargs["max_seqlen_k"] == 6
    assert seen["varlen"][0] is q


@pytest.mark.parametrize("features", [{}, {"window": (2, 0), "softcap": 3.0}])
def test_bhsd_inputs_reach_the_kernel_as_views_in_forward_and_backward(monkeypatch: pytest.MonkeyPatch,
                                                                       features: dict[str, Any]) -> None:
    fa, _, seen = _adapter(FlashAttnAdapter, "flash-attn", monkeypatch)
    q, k, v = _qkv()
    out = fa(q, k, v, causal=True, scale=None, **features)
    for given, got in zip((q, k, v), seen["fwd"], strict=True):
        assert got.data_ptr() == given.data_ptr() and not got.is_contiguous()  # a transpose view, no copy
        assert got.stride(-1) == 1  # what the kernels need
    grad = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    assert seen["bwd"].data_ptr() == grad.data_ptr()  # the caller's gradient as a view, no copy
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = reference_attention(*leaves, causal=True, **features)
    torch.testing.assert_close(out, want.float(), atol=1e-5, rtol=1e-5)
    for got, expect in zip((dq, dk, dv), torch.autograd.grad(want, leaves, grad.double()), strict=True):
        torch.testing.assert_close(got.double(), expect, atol=1e-4, rtol=1e-4)


# -- slim builds ------------------------------------------------------------------------------------------
def _fa3_caps() -> Any:
    return registry.adapters()["flash-attn-3"].caps  # type: ignore[attr-defined]


def _call(**changes: Any) -> AttentionCall:
    base = AttentionCall(device_type="cuda", compute_capability=(9, 0), dtype="bfloat16", batch=1, heads_q=8,
                         heads_kv=2, seqlen_q=128, seqlen_k=128, head_dim=128, causal=True, needs_grad=False)
    return dataclasses.replace(base, **changes)


def test_a_slim_build_narrows_head_dims_dtypes_backward_and_features() -> None:
    full = _fa3_caps()
    slim = capabilities_from_build(full, {"head_dims": [128], "dtypes": ["bfloat16"], "backward": False,
                                          "features": ["varlen", "split"]})
    assert slim.unsupported_reasons(_call()) == []
    assert slim.unsupported_reasons(_call(head_dim=64)) == []  # runs on the hdim128 kernel (round up)
    assert any("head dim 256" in r for r in slim.unsupported_reasons(_call(head_dim=256)))
    assert any("float16" in r for r in slim.unsupported_reasons(_call(dtype="float16")))
    assert any("backward" in r for r in slim.unsupported_reasons(_call(needs_grad=True)))
    assert any("window" in r for r in slim.unsupported_reasons(_call(features=frozenset({"window"}))))
    assert slim.unsupported_reasons(_call(features=frozenset({"varlen", "lse"}))) == []
    assert "window" in full.features and "window" not in slim.features
    with_local = capabilities_from_build(full, {"head_dims": [64, 128], "dtypes": ["bf16", "fp16"],
                                                "backward": True, "features": ["local", "softcap", "varlen"]})
    assert with_local.features == full.features and with_local.support.dtypes == ("float16", "bfloat16")


@pytest.mark.parametrize("bad", [{}, {"head_dims": [], "dtypes": [], "backward": True, "features": []},
                                 {"head_dims": [128], "dtypes": ["bfloat16"], "backward": "yes", "features": []}])
def test_a_malformed_build_record_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="bad build capabilities"):
        capabilities_from_build(_fa3_caps(), bad)


def test_the_registry_reads_a_recorded_build(monkeypatch: pytest.MonkeyPatch) -> None:
    reader = types.ModuleType("attnforge.cache.capabilities")
    asked: list[tuple[str, ...]] = []

    def installed_capabilities(distributions: Any) -> Any:
        asked.append(tuple(distributions))
        if "flash-attn-3" in distributions:
            return {"head_dims": [128], "dtypes": ["bfloat16"], "backward": True, "features": []}
        return None

    reader.installed_capabilities = installed_capabilities  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "attnforge.cache.capabilities", reader)
    monkeypatch.setattr(registry, "_built", registry._built.__wrapped__)  # type: ignore[attr-defined]
    built = registry.adapters()
    caps = built["flash-attn-3"].caps  # type: ignore[attr-defined]
    assert caps.support.max_head_dim == 128 and caps.support.dtypes == ("bfloat16",) and "varlen" not in caps.features
    assert built["flash-attn-4"].caps.support.max_head_dim == 256  # type: ignore[attr-defined]
    assert asked  # builtins (SDPA, flex) are not asked
