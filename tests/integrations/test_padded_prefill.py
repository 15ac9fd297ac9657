"""A padded batch's prefill through ``attn_implementation="attnforge"`` as varlen sequences
(:func:`attnforge.integrations.transformers._padded_prefill`): the runs of real tokens and of padding of the caller's
tensors, ``causal=True`` and no mask, where a kernel serves the packed call; the masked call everywhere else.

The seam faked is FlashAttention-4's public ``flash_attn_varlen_func`` (the module an adapter imports): the fake
computes each sequence of ``cu_seqlens`` in float64 with bottom-right causal masking and softcap, so a wrong offset,
view, head mapping or a padding token seen by a real one shows as a wrong answer against transformers' own SDPA.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from attnforge.backends import registry
from attnforge.backends._base import Requirement
from attnforge.backends.exact import reference_attention
from attnforge.backends.flash import FlashAttn4Adapter
from attnforge.dispatch import inputs
from attnforge.integrations import transformers as integration
from tests._fakes import count_calls
from tests.dispatch._padded_steps import fa4_only_dispatcher
from tests.integrations._models import VOCAB, tiny_model


class _FakeFa4:
    """The public functions of ``flash_attn.cute`` on float64 math; records each varlen call's keywords."""

    def __init__(self) -> None:
        self.varlen: list[dict[str, Any]] = []

    def module(self) -> types.ModuleType:
        module = types.ModuleType("fake_fa4_prefill")
        module.flash_attn_varlen_func = self.flash_attn_varlen_func  # type: ignore[attr-defined]
        module.flash_attn_func = self.flash_attn_func  # type: ignore[attr-defined]
        return module

    def flash_attn_varlen_func(self, q: Any, k: Any, v: Any, *, cu_seqlens_q: Any, cu_seqlens_k: Any,
                               max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float | None, causal: bool,
                               softcap: float | None = None) -> Any:
        self.varlen.append({"cu_seqlens_q": cu_seqlens_q.tolist(), "cu_seqlens_k": cu_seqlens_k.tolist(),
                            "max_seqlen_q": max_seqlen_q, "causal": causal, "shapes": (q.shape, k.shape, v.shape)})
        out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype)
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        for i in range(len(cq) - 1):
            rows = slice(cq[i], cq[i + 1])
            keys = slice(ck[i], ck[i + 1])
            assert cq[i + 1] - cq[i] <= max_seqlen_q
            o = reference_attention(q[rows].transpose(0, 1)[None].double(), k[keys].transpose(0, 1)[None].double(),
                                    v[keys].transpose(0, 1)[None].double(), causal=causal, scale=softmax_scale,
                                    softcap=softcap or None)
            out[rows] = o[0].transpose(0, 1).to(q.dtype)
        return out, None

    def flash_attn_func(self, q: Any, k: Any, v: Any, *, softmax_scale: float | None, causal: bool,
                        **kw: Any) -> Any:
        o = reference_attention(q.transpose(1, 2).double(), k.transpose(1, 2).double(), v.transpose(1, 2).double(),
                                causal=causal, scale=softmax_scale, softcap=kw.get("softcap") or None)
        return o.transpose(1, 2).to(q.dtype), None


@pytest.fixture
def fa4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> _FakeFa4:
    """A FlashAttention-4 verified on this CPU as the dispatcher's one backend beside plain SDPA, on the fake."""
    fake = _FakeFa4()
    monkeypatch.setitem(sys.modules, "fake_fa4_prefill", fake.module())
    caps = registry.adapters()["flash-attn-4"].caps  # type: ignore[attr-defined]
    caps = dataclasses.replace(caps, devices=("cpu",), support=dataclasses.replace(caps.support, dtypes=("float32",)))
    adapter = FlashAttn4Adapter(name="flash-attn-4", caps=caps,
                                requirement=Requirement(modules=("fake_fa4_prefill",), distributions=("pytest",)))
    fa4_only_dispatcher(adapter, tmp_path / "fa4home", monkeypatch, device="cpu", version=pytest.__version__)
    monkeypatch.setattr(integration, "PREFILL_VARLEN_MIN", 8)
    monkeypatch.setattr(integration, "_VARLEN_PAYS", {})
    return fake


def _llama() -> Any:
    integration.register()
    return tiny_model("llama", "sdpa").eval()


def _batch(seq: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (3, seq), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding
    mask[2, :3] = 0
    return ids, mask


def _logits(model: Any, impl: str, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits  # type: ignore[no-any-return]


def test_a_padded_forward_runs_as_varlen_sequences_with_sdpas_logits(fa4: _FakeFa4) -> None:
    """Left-padded rows and a full one: one varlen call a layer, the runs of real tokens and of padding as sequences
    of the ``[B * S, H, D]`` views, and the logits of transformers' own SDPA on every real position."""
    model = _llama()
    ids, mask = _batch()
    want = _logits(model, "sdpa", ids, mask)
    got = _logits(model, "attnforge", ids, mask)
    assert len(fa4.varlen) == 2  # one per layer
    # row 0: 0..24; row 1: 5 padding, 19 real; row 2: 3 padding, 21 real
    assert fa4.varlen[0]["cu_seqlens_q"] == [0, 24, 29, 48, 51, 72]
    assert fa4.varlen[0]["causal"] is True and fa4.varlen[0]["max_seqlen_q"] == 24
    q_shape, k_shape, _ = fa4.varlen[0]["shapes"]
    assert tuple(q_shape) == (72, 4, 8) and tuple(k_shape) == (72, 2, 8)
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=2e-5, rtol=2e-5)


def test_padding_query_rows_are_zeros_and_real_rows_the_exact_math(fa4: _FakeFa4) -> None:
    """The route itself on a built mask: a padding query row sees no key under the mask, so it is zeros, as the
    exact math gives it; a real row is the masked call's answer."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    integration.register()
    _, padding = _batch()
    padding = padding.bool()
    build = integration._mask_builder(sdpa_mask, causal_mask_function)
    mask = build(batch_size=3, q_length=24, kv_length=24, mask_function=causal_mask_function,
                 attention_mask=padding)
    assert mask is not None
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(3, h, 24, 16, generator=g) for h in (4, 2, 2))
    got = integration._padded_prefill(q, k, v, mask, {"scale": None})
    assert got is not None and tuple(got.shape) == (3, 24, 4, 16)
    want = reference_attention(q.double(), k.double(), v.double(), causal=False, attn_mask=mask).transpose(1, 2)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert not got[1, :5].any() and not got[2, :3].any()


@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
def test_padding_rows_alone_are_zeroed_in_place_when_nothing_records_grad(fa4: _FakeFa4, grad: bool) -> None:
    """Without a gradient to record, the kernel's fresh output gets zeros in its padding rows alone (one
    ``index_fill_`` over the rows ``prefill_sequences`` found, not a pass over every row); a call autograd records
    keeps the out-of-place fill, and its gradients are the exact math's. Both give the exact math's output."""
    from torch.profiler import ProfilerActivity, profile
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    integration.register()
    _, padding = _batch()
    build = integration._mask_builder(sdpa_mask, causal_mask_function)
    mask = build(batch_size=3, q_length=24, kv_length=24, mask_function=causal_mask_function,
                 attention_mask=padding.bool())
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(3, h, 24, 16, generator=g).requires_grad_(grad) for h in (4, 2, 2))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        got = integration._padded_prefill(q, k, v, mask, {"scale": None})
    ops = {e.name for e in prof.events()}
    assert got is not None
    assert ("aten::index_fill_" in ops) is not grad and ("aten::masked_fill" in ops) is grad, sorted(ops)
    want = reference_attention(q.double(), k.double(), v.double(), causal=False, attn_mask=mask).transpose(1, 2)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert not got[1, :5].any() and not got[2, :3].any() and got[0].all()
    if grad:
        for g_got, g_want in zip(torch.autograd.grad(got.sum(), (q, k, v)),
                                 torch.autograd.grad(want.sum(), (q, k, v)), strict=True):
            torch.testing.assert_close(g_got.double(), g_want.double(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["holes", "right", "short", "forced"])
def test_the_masked_call_serves_what_the_route_does_not(fa4: _FakeFa4, monkeypatch: pytest.MonkeyPatch,
                                                        case: str) -> None:
    """A row whose real tokens are not one run, a right-padded row (its padding rows see its real keys), a prompt
    shorter than ``PREFILL_VARLEN_MIN`` and a forced backend take the masked call, with the same logits."""
    import attnforge

    model = _llama()
    ids, mask = _batch()
    if case == "holes":
        mask[0, 10:12] = 0
    if case == "right":
        mask[0, -2:] = 0
    if case == "short":
        monkeypatch.setattr(integration, "PREFILL_VARLEN_MIN", 25)
    want = _logits(model, "sdpa", ids, mask)
    if case == "forced":
        with attnforge.use_backend("exact"):
            got = _logits(model, "attnforge", ids, mask)
    else:
        got = _logits(model, "attnforge", ids, mask)
    assert fa4.varlen == []
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=2e-5, rtol=2e-5)


def test_no_kernel_for_the_packed_call_keeps_the_masked_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where only the exact math serves varlen sequences (this CPU's default backends), the masked call serves, and
    the padding mask is never read on the host: that read is a device sync, and with a slim FlashAttention-3 built
    without varlen (no kernel for the packed call) it made an H200's padded Llama forward 0.943-0.979x of
    transformers' SDPA (2026-11-30, docs/benchmarks.md "twenty-sixth session")."""
    model = _llama()
    monkeypatch.setattr(integration, "PREFILL_VARLEN_MIN", 8)
    monkeypatch.setattr(integration, "_VARLEN_PAYS", {})
    reads = count_calls(monkeypatch, integration, "prefill_sequences")
    ids, mask = _batch()
    seen: list[Any] = []
    real_attention = integration._padded_prefill

    def spy(*args: Any) -> Any:
        out = real_attention(*args)
        seen.append(out is not None)
        return out

    monkeypatch.setattr(integration, "_padded_prefill", spy)
    want = _logits(model, "sdpa", ids, mask)
    got = _logits(model, "attnforge", ids, mask)
    assert seen == [False, False]
    assert reads == []
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=2e-5, rtol=2e-5)


def test_a_padded_generate_gives_sdpas_tokens_and_reads_no_offsets_back(
        fa4: _FakeFa4, monkeypatch: pytest.MonkeyPatch) -> None:
    """``generate`` over a left-padded batch: the prefill's two layers share one offsets tensor, made from the mask
    the host read once, so its facts are known and never read back from the device (``inputs._read_offsets``: a
    sync, which let the device idle 3 ms more in a 2-layer Llama-3-8B-shaped forward on an H200, 2026-11-30); the
    tokens are SDPA's."""
    model = _llama()
    ids, mask = _batch()
    reads = count_calls(monkeypatch, inputs, "_read_offsets")
    kw = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    model.set_attn_implementation("sdpa")
    want = model.generate(**kw)
    model.set_attn_implementation("attnforge")
    got = model.generate(**kw)
    assert torch.equal(got, want)
    assert len(fa4.varlen) == 2 and fa4.varlen[0]["cu_seqlens_q"] == [0, 24, 29, 48, 51, 72]
    assert reads == []


def test_a_masked_call_sdpa_does_not_serve_keeps_its_mask(fa4: _FakeFa4) -> None:
    """Gemma-2's global layers (a plain causal mask with softcap): SDPA cannot take the softcap, so the masked call is
    not SDPA's whole square to save (Flex's masked kernel skips tiles itself; here the model's eager function takes
    it), and no varlen call is made; the logits are eager's."""
    integration.register()
    model = tiny_model("gemma2-softcap-sliding-window", "eager").eval()
    ids, mask = _batch()
    want = _logits(model, "eager", ids, mask)
    got = _logits(model, "attnforge", ids, mask)
    assert fa4.varlen == []
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pads", [(0, 0, 0), (5, 0, 24), (3, 24, 1)])
def test_the_offsets_prefill_sequences_makes_are_checked_without_a_read(
        pads: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`inputs.prefill_sequences` keeps the facts of the offsets it makes (``keep_offsets``): the varlen call's
    check finds them without a read back, and they are the facts that read gives (lengths, longest), as are the
    offsets and the padding rows."""
    b, s = len(pads), 24
    padding = torch.ones(b, s, dtype=torch.bool)
    for row, n in enumerate(pads):
        padding[row, :n] = False
    seqs = inputs.prefill_sequences(padding)
    assert seqs is not None
    reads = count_calls(monkeypatch, inputs, "_read_offsets")
    kept = inputs.check_offsets(seqs.cu_seqlens, seqs.cu_seqlens, rows_q=b * s, rows_k=b * s, device=padding.device)
    assert reads == []
    read = inputs._read_offsets(seqs.cu_seqlens, seqs.cu_seqlens, rows_q=b * s, rows_k=b * s)
    assert kept[2:] == read[2:] == (seqs.longest, seqs.longest)
    assert torch.equal(kept[0], read[0]) and torch.equal(kept[1], read[1])
    assert seqs.cu_seqlens.dtype == torch.int32
    want_hidden = torch.nonzero(~padding.reshape(-1)).flatten()
    if not any(pads):
        assert seqs.hidden is None and seqs.hidden_rows is None
    else:
        assert torch.equal(seqs.hidden_rows, want_hidden) and seqs.hidden_rows.dtype == torch.int64


def test_under_inference_mode_the_route_serves_and_reads_no_offsets_back(
        fa4: _FakeFa4, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model run under ``torch.inference_mode`` (a common way to serve): the mask the integration's builder made is
    its own (``made_here``), so its varlen sequences are kept for both layers and the route serves (the mask of an
    inference tensor has no version counter, and before, nothing derived from it was kept: the masked call served);
    the offsets' facts are known, nothing is read back; the logits are SDPA's."""
    model = _llama()
    ids, mask = _batch()
    reads = count_calls(monkeypatch, inputs, "_read_offsets")
    want = _logits(model, "sdpa", ids, mask)
    model.set_attn_implementation("attnforge")
    with torch.inference_mode():
        got = model(input_ids=ids, attention_mask=mask).logits
    assert len(fa4.varlen) == 2 and fa4.varlen[0]["cu_seqlens_q"] == [0, 24, 29, 48, 51, 72]
    assert reads == []
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=2e-5, rtol=2e-5)
