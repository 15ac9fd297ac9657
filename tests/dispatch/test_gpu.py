"""On a CUDA GPU: every torch built-in adapter against the float64 reference (skipped without a GPU)."""

from __future__ import annotations

import warnings

import pytest
import torch

from attnforge.backends import registry
from attnforge.backends import sdpa as sdpa_module
from attnforge.backends.adapter import AttentionCall
from attnforge.backends.exact import reference_attention

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

BUILTIN = ["sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math", "flex", "sdpa"]
CASES = [
    pytest.param(8, 8, 128, 128, False, id="plain"),
    pytest.param(8, 8, 128, 128, True, id="causal-square"),
    pytest.param(8, 2, 96, 160, True, id="causal-sq<sk-gqa"),
    pytest.param(8, 8, 160, 96, True, id="causal-sq>sk"),
]


@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize(("hq", "hkv", "sq", "sk", "causal"), CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_builtin_adapter_matches_reference(  # noqa: PLR0917 - parametrized
        name: str, hq: int, hkv: int, sq: int, sk: int, causal: bool,
                                           dtype: torch.dtype) -> None:
    adapter = registry.fallback() if name == "sdpa" else registry.adapters()[name]
    cc = torch.cuda.get_device_capability()
    call = AttentionCall(device_type="cuda", compute_capability=(cc[0], cc[1]), dtype=str(dtype)[6:], batch=2,
                         heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=64, causal=causal,
                         needs_grad=True)
    reasons = adapter.unsupported_reasons(call)
    if reasons:
        pytest.skip("; ".join(reasons))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, h, s, 64, device="cuda", dtype=dtype, generator=g).requires_grad_()
               for h, s in ((hq, sq), (hkv, sk), (hkv, sk)))
    out = adapter(q, k, v, causal=causal, scale=None)
    ref = reference_attention(q, k, v, causal=causal, scale=None)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.double(), want.double(), atol=5e-2, rtol=5e-2)


# FA4 4.0.0b36's CuTe DSL warns (UserWarning: "Argument aux_data ... cannot be converted to a JitArgument") on its
# first compile of the lse/softcap kernels; pytest's filterwarnings=error made that warning the case's error (H100,
# 2026-11-25, docs/benchmarks.md), while `attnforge verify`, which runs with Python's default filters, passed all 42.
@pytest.mark.filterwarnings("ignore:Argument aux_data:UserWarning")
@pytest.mark.parametrize("name", sorted(registry.adapters()))
def test_every_claimed_feature_matches_the_reference_on_this_gpu(name: str) -> None:
    """verify's feature cases (one per claimed feature and dtype) through each usable adapter."""
    from attnforge.catalog.tolerances import PrecisionKind, load_tolerances
    from attnforge.verify.cases import feature_cases
    from attnforge.verify.check import CaseStatus, verify_backend
    from attnforge.verify.device import current_device

    adapter = registry.adapters()[name]
    if adapter.load_error() is not None:
        pytest.skip(f"not usable here: {adapter.load_error()}")
    claimed = adapter.caps.features  # type: ignore[attr-defined]
    if not claimed:
        pytest.skip("claims no feature")
    cases = feature_cases(claimed, dtypes=("bfloat16", "float16"), head_dims=(64, 128), max_seqlen=256)
    kind = PrecisionKind.QUANTIZED if adapter.caps.quantized else PrecisionKind.EXACT  # type: ignore[attr-defined]
    res = verify_backend(adapter, device=current_device("cuda"), cases=cases, tolerances=load_tolerances(),
                         kind=kind)
    bad = [f"{c.case.label}: {c.detail}" for c in res.cases if c.status in (CaseStatus.FAILED, CaseStatus.ERROR)]
    assert not bad, bad


@pytest.mark.parametrize(("hq", "hkv", "sq", "mask_heads"), [(32, 8, 1, 1), (16, 8, 1, 16), (8, 8, 1, 1),
                                                               (32, 8, 4, 1)],
                         ids=["llama-decode", "per-head-mask", "mha", "speculative-4"])
@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events:UserWarning")  # torch 2.11's profiler, H200
def test_a_masked_decode_call_runs_no_cudnn_kernel_at_any_length(hq: int, hkv: int, sq: int, mask_heads: int) -> None:
    """cuDNN's SDPA builds a graph per new sequence length (42-67 ms a first call on an H200, 2026-11-28): the
    SDPA adapter's masked decode calls leave it out while a length is not settled (met fewer times than a step has
    layers, and more), and match the reference, called once and again."""
    from torch.profiler import ProfilerActivity, profile

    adapter = registry.fallback()
    g = torch.Generator(device="cuda").manual_seed(0)
    for sk in (1025, 1026, 1041):
        q = torch.randn(4, hq, sq, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(4, hkv, sk, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        mask = torch.ones(4, mask_heads, sq, sk, dtype=torch.bool, device="cuda")
        mask[1, ..., : sk // 5] = False  # left padding on one row
        mask[2] = False  # a batch row that sees no key: zeros, as the reference
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out = adapter(q, k, v, causal=False, scale=None, attn_mask=mask)
            torch.cuda.synchronize()
        kernels = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
        assert kernels and not [n for n in kernels if "cudnn" in n.lower()], kernels
        assert [n for n in kernels if "fmha" in n.lower() or "efficient" in n.lower()], kernels
        assert sdpa_module._REFUSED == {}  # the kernel took the prepared mask (a refusal goes to SDPA's choice)
        ref = reference_attention(q, k, v, causal=False, scale=None, attn_mask=mask)
        torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
        again = adapter(q, k, v, causal=False, scale=None, attn_mask=mask)
        torch.testing.assert_close(again.double(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(("b", "sk", "holes"), [(4, 4097, False), (1, 4097, False), (4, 4100, True)],
                         ids=["llama-padded-4k", "one-long-sequence", "not-one-run"])
@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events:UserWarning")  # torch 2.11's profiler, H200
def test_a_padded_decode_step_takes_flash_attention_2_varlen(b: int, sk: int, holes: bool) -> None:
    """A left-padded batch's decode step over many keys (one run of visible keys per row) runs FlashAttention-2's
    varlen split-KV kernel on views of the bhsd K/V (no cuDNN, no memory-efficient kernel), as the reference, called
    once per layer on one mask; a mask with holes in a row goes to the memory-efficient kernel. (At 1025 keys the
    masked decode test above holds the memory-efficient kernel.)"""
    from torch.profiler import ProfilerActivity, profile

    adapter = registry.fallback()
    g = torch.Generator(device="cuda").manual_seed(sk)
    q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(b, 8, sk, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    mask = torch.ones(b, 1, 1, sk, dtype=torch.bool, device="cuda")
    mask[-1, ..., : sk // 5] = False  # left padding on the last row
    if holes:
        mask[0, ..., 7:9] = False
    ref = reference_attention(q, k, v, causal=False, scale=None, attn_mask=mask)
    for _layer in range(3):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out = adapter(q, k, v, causal=False, scale=None, attn_mask=mask)
            torch.cuda.synchronize()
        kernels = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
        assert not [n for n in kernels if "cudnn" in n.lower()], kernels
        assert [n for n in kernels if ("fmha" if holes else "pytorch_flash::flash_fwd") in n], kernels
        torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
    assert sdpa_module._REFUSED == {}


@pytest.mark.parametrize(("b", "sk", "kernel"), [(4, 1025, "fmha"), (4, 4097, "pytorch_flash::flash_fwd"),
                                                 (1, 2049, "pytorch_flash::flash_fwd")])
@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events:UserWarning")  # torch 2.11's profiler, H200
def test_an_unmasked_decode_call_takes_the_split_kv_kernel_when_its_keys_are_many(b: int, sk: int,
                                                                                   kernel: str) -> None:
    """An unmasked decode step (Llama-3-8B's heads) runs no cuDNN kernel: the memory-efficient kernel while each of
    its thread blocks walks few keys, FlashAttention-2's split-KV kernel from ``_FLASH_FROM_KEYS`` on (SDPA's own
    copy, GQA native); both match the reference, and nothing is refused."""
    from torch.profiler import ProfilerActivity, profile

    adapter = registry.fallback()
    g = torch.Generator(device="cuda").manual_seed(sk)
    q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(b, 8, sk, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = adapter(q, k, v, causal=False, scale=None)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    assert not [n for n in kernels if "cudnn" in n.lower()], kernels
    assert [n for n in kernels if kernel in n], kernels
    assert sdpa_module._REFUSED == {}
    ref = reference_attention(q, k, v, causal=False, scale=None)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


def test_a_masked_decode_step_under_inference_mode_matches_the_reference() -> None:
    """Serving code runs under ``torch.inference_mode``: a padded decode step (two layers sharing the mask) and a
    padded prefill through the SDPA adapter return the reference's output (inference tensors have no version
    counter, so the adapter keeps nothing for them)."""
    adapter = registry.fallback()
    g = torch.Generator(device="cuda").manual_seed(7)
    with torch.inference_mode():
        for sq in (1, 64):
            q = torch.randn(4, 32, sq, 128, device="cuda", dtype=torch.bfloat16, generator=g)
            k, v = (torch.randn(4, 8, 1025, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            mask = torch.ones(4, 1, sq, 1025, dtype=torch.bool, device="cuda")
            mask[1, ..., :200] = False
            ref = reference_attention(q, k, v, causal=False, scale=None, attn_mask=mask)
            for _layer in range(2):
                out = adapter(q, k, v, causal=False, scale=None, attn_mask=mask)
                torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


def test_a_decode_steps_later_layers_take_the_lane_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama-3-8B's padded decode step through ``attention()`` (q a bhsd view of bshd memory, a bool padding mask
    shared by four layers, each with its own K/V): layers 2-4 are served by the lane (the real memory-efficient op
    on the batch fold, no refusal), and every layer's output is the reference's, for two steps."""
    import attnforge
    from attnforge.dispatch import features, runtime

    previous = runtime.set_dispatcher(None)
    runs: list[bool] = []
    real = sdpa_module.DecodeLane.__call__

    def spy(self: sdpa_module.DecodeLane, *args: object) -> object:
        out = real(self, *args)  # type: ignore[arg-type]
        runs.append(out is not None)
        return out

    monkeypatch.setattr(sdpa_module.DecodeLane, "__call__", spy)
    monkeypatch.setenv("ATTNFORGE_AUTOTUNE", "0")
    features._LANES.__dict__.clear()
    g = torch.Generator(device="cuda").manual_seed(11)
    try:
        for step, sk in enumerate((1025, 1026)):
            q = torch.randn(4, 1, 32, 128, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
            mask = torch.ones(4, 1, 1, sk, dtype=torch.bool, device="cuda")
            mask[1, ..., : sk // 5] = False
            for _layer in range(4):
                k, v = (torch.randn(4, 8, sk, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
                out = attnforge.attention(q, k, v, attn_mask=mask, scale=128 ** -0.5)
                ref = reference_attention(q, k, v, causal=False, scale=128 ** -0.5, attn_mask=mask)
                torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
            assert runs == [True] * 3 * (step + 1)
        assert sdpa_module._REFUSED == {}
    finally:
        features._LANES.__dict__.clear()
        runtime.set_dispatcher(previous)


@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
def test_the_exact_decode_math_takes_bf16_q_and_k_in_one_matmul_on_the_gpu(mask_kind: str) -> None:
    """Gemma-2-9B's decode call on the exact math (softcap 50, GQA 16/8, D256, a padding mask; a row that sees no
    key): CUDA's ``baddbmm(..., out_dtype=float32)`` serves the logits and their first multiply (no cast of q and
    K), and the output is the float64 reference's, zeros for the hidden row."""
    from attnforge.backends import exact

    g = torch.Generator(device="cuda").manual_seed(13)
    q = torch.randn(4, 1, 16, 256, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
    k, v = (torch.randn(4, 8, 1100, 256, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    hidden = torch.zeros(4, 1, 1, 1100, dtype=torch.bool, device="cuda")
    hidden[1, ..., :300] = True
    hidden[2] = True
    mask = ~hidden if mask_kind == "bool" else torch.zeros(
        hidden.shape, dtype=torch.bfloat16, device="cuda").masked_fill(hidden, torch.finfo(torch.bfloat16).min)
    with torch.no_grad():
        out = exact.exact_attention(q, k, v, attn_mask=mask, softcap=50.0, scale=256 ** -0.5)
    assert exact._MIXED_MATMUL.get("cuda") is True
    ref = reference_attention(q, k, v, attn_mask=mask, softcap=50.0, scale=256 ** -0.5)
    if mask_kind == "bool":
        assert out[2].abs().max() == 0
    # transformers' additive mask hides with finfo.min, not -inf: that row attends to every key evenly, as eager's
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
    assert exact._SCALED_MATMUL.get("cuda") is True  # baddbmm(..., out_dtype=) took the first multiply


@pytest.mark.parametrize("name", ["sdpa", "sdpa-cudnn", "sdpa-efficient", "sdpa-math"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_a_masked_prefill_on_the_gpu_gives_zeros_where_a_row_sees_no_key(name: str, head_dim: int) -> None:
    """A left-padded prefill's mask (more query rows than a decode step, no gradient): rows that see no key are
    zeros and the others match the reference, whether the adapter leaves them to the kernel (the kernels this GPU's
    probe found zeroing them) or opens and zeroes them."""
    adapter = registry.fallback() if name == "sdpa" else registry.adapters()[name]
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(2, 8, 96, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(2, 2, 96, head_dim, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    mask = torch.ones(96, 96, dtype=torch.bool, device="cuda").tril().expand(2, 1, 96, 96).clone()
    mask[1, :, :, :19] = False  # rows 0-18 of batch 1 see no key
    zeroing = sdpa_module._zeroing_kernels(q.device, q.dtype, head_dim, head_dim, False)
    assert zeroing <= frozenset(sdpa_module._MASK_KERNELS["cuda"])
    try:
        with torch.no_grad():
            out = adapter(q, k, v, causal=False, scale=None, attn_mask=mask)
    except RuntimeError as exc:
        if "No available kernel" in str(exc):
            pytest.skip(f"{name} does not take this call on this GPU")
        raise
    assert torch.equal(out[1, :, :19], torch.zeros_like(out[1, :, :19])), sorted(zeroing)
    ref = reference_attention(q, k, v, causal=False, scale=None, attn_mask=mask)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("name", ["sdpa", "sdpa-cudnn", "sdpa-efficient", "sdpa-math"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_a_padded_training_call_on_the_gpu_has_the_references_gradients(name: str, head_dim: int) -> None:
    """A left-padded batch's masked call that autograd records, an upstream gradient on every row (the hidden ones
    too): rows that see no key are zeros, their query gradients zero, and the gradients of Q, K and V match the
    reference's, whether the adapter leaves those rows to the kernel (the kernels this GPU's probe found right with
    gradients) or opens and zeroes them."""
    adapter = registry.fallback() if name == "sdpa" else registry.adapters()[name]
    g = torch.Generator(device="cuda").manual_seed(2)
    q = torch.randn(2, 8, 96, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(2, 8, 96, head_dim, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    upstream = torch.randn(2, 8, 96, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
    mask = torch.ones(96, 96, dtype=torch.bool, device="cuda").tril().expand(2, 1, 96, 96).clone()
    mask[1, :, :, :19] = False  # rows 0-18 of batch 1 see no key
    zeroing = sdpa_module._zeroing_kernels(q.device, q.dtype, head_dim, head_dim, True)
    assert zeroing <= frozenset(sdpa_module._MASK_KERNELS["cuda"])
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    try:
        out = adapter(q, k, v, causal=False, scale=None, attn_mask=mask)
    except RuntimeError as exc:
        if "No available kernel" in str(exc):
            pytest.skip(f"{name} does not take this call on this GPU")
        raise
    grads = torch.autograd.grad(out, (q, k, v), upstream)
    assert torch.equal(out[1, :, :19], torch.zeros_like(out[1, :, :19])), sorted(zeroing)
    assert all(bool(t.isfinite().all()) for t in grads), sorted(zeroing)
    assert not grads[0][1, :, :19].any(), sorted(zeroing)
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    ref = reference_attention(*leaves, causal=False, scale=None, attn_mask=mask)
    ref_grads = torch.autograd.grad(ref, leaves, upstream.double())
    for got, want in zip(grads, ref_grads, strict=True):
        assert float((got.double() - want).norm() / want.norm()) < 2e-2, sorted(zeroing)


def test_a_padded_prefills_offsets_go_up_and_are_checked_without_a_sync() -> None:
    """A left-padded prefill's varlen sequences: the mask's read back is the one sync; a host array goes up without
    one (pinned memory, ``non_blocking``) and the varlen call's check of the offsets reads nothing back
    (``torch.cuda.set_sync_debug_mode("error")`` raises on any sync)."""
    import numpy as np

    from attnforge.backends._base import host_to_device
    from attnforge.dispatch import inputs

    padding = torch.ones(4, 2048, dtype=torch.bool, device="cuda")
    padding[1, :292] = False
    seqs = inputs.prefill_sequences(padding)  # the mask's read: the one sync
    assert seqs is not None
    torch.cuda.synchronize()
    try:
        with warnings.catch_warnings():  # torch warns that the mode is a prototype (an error under -W error)
            warnings.simplefilter("ignore", UserWarning)
            torch.cuda.set_sync_debug_mode("error")  # inside the try: set before it warns, reset whatever happens
        up = host_to_device(np.arange(9, dtype=np.int64), "cuda")
        facts = inputs.check_offsets(seqs.cu_seqlens, seqs.cu_seqlens, rows_q=4 * 2048, rows_k=4 * 2048,
                                     device=padding.device)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(up.cpu(), torch.arange(9))
    assert facts[2:] == (seqs.longest, seqs.longest) == (2048, 2048)
    assert seqs.cu_seqlens.cpu().tolist() == [0, 2048, 2048 + 292, 2 * 2048, 3 * 2048, 4 * 2048]
    assert torch.equal(seqs.hidden_rows.cpu(), torch.arange(2048, 2048 + 292))


@pytest.mark.parametrize(("host_ms", "kernel_ms"), [(0.05, 1.0), (0.5, 0.1)], ids=["device-paced", "host-paced"])
def test_back_to_back_timing_on_the_device_is_the_longer_of_kernel_and_host_time(host_ms: float,
                                                                               kernel_ms: float) -> None:
    """The back-to-back timing with CUDA events (:class:`attnforge.bench.timing.CudaMarks`): a call of a kernel of
    known length (``torch.cuda._sleep``) after a host delay of known length (a busy wait) measures the longer of
    the two, as a model issuing it between other layers sees it; timed from the batch's start it also held half a
    call's host time (docs/benchmarks.md "twenty-first session")."""
    import time

    from attnforge.bench.timing import CudaMarks, TimerMethod, TimingConfig, measure

    def sleep_ms(cycles: int, n: int = 1) -> float:
        """CUDA-event ms of one ``_sleep(cycles)``, the mean of ``n`` back to back."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(n):
            torch.cuda._sleep(cycles)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / n

    # _sleep spins for clock cycles: calibrated on an idle GPU (its first launch loading the kernel, the SM clock
    # not yet boosted) a cycle count came out 2-16x short on the H200 (2026-11-30, twenty-second session: a 1 ms
    # kernel ran 0.06 and 0.50 ms). Calibrated after ~50 ms of load; the want is the kernel's own time, read after.
    sleep_ms(1_000_000, n=50)
    cycles = int(1_000_000 * kernel_ms / sleep_ms(1_000_000, n=5))  # the sleep's cycles for kernel_ms

    def step(_i: int) -> None:
        until = time.perf_counter() + host_ms / 1e3
        while time.perf_counter() < until:  # busy: time.sleep overshoots by its timer slack
            pass
        torch.cuda._sleep(cycles)

    config = TimingConfig(warmup_ms=2.0, rep_ms=40.0, min_reps=5, max_reps=50, method=TimerMethod.BACK_TO_BACK)
    t = measure(step, sets=1, config=config, sync=torch.cuda.synchronize, marks=CudaMarks(torch.device("cuda")))
    want = max(sleep_ms(cycles, n=10), host_ms)
    assert want * 0.9 < t.median_ms < want * 1.25, (t.median_ms, want)


def test_a_held_batch_times_sdpas_kernels_as_cuda_events_do() -> None:
    """:attr:`attnforge.bench.timing.TimerMethod.HELD` on the device: the sleep kernel's calibration holds the queue
    for about the time asked, and a held SDPA forward reads its CUDA-event kernel time (within 10 %), not less."""
    from attnforge.bench.timing import (
        TimerMethod,
        TimingConfig,
        hold_for,
        marks_for,
        measure,
    )

    dev = torch.device("cuda")
    hold = hold_for(dev)
    assert hold is not None
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    hold.hold(5.0)
    end.record()
    end.synchronize()
    assert 4.0 < begin.elapsed_time(end) < 7.5
    q = torch.randn(8, 16, 2048, 128, device=dev, dtype=torch.bfloat16)

    def step(_i: int) -> object:
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)

    config = TimingConfig(warmup_ms=5.0, rep_ms=40.0, min_reps=5, max_reps=200, method=TimerMethod.HELD)
    held = measure(step, sets=1, config=config, sync=torch.cuda.synchronize, marks=marks_for(dev), hold=hold)
    events = measure(step, sets=1, config=TimingConfig(warmup_ms=5.0, rep_ms=40.0, min_reps=5, max_reps=200,
                                                       method=TimerMethod.CUDA_EVENTS), sync=torch.cuda.synchronize)
    assert held.method is TimerMethod.HELD
    assert 0.9 * events.median_ms < held.median_ms < 1.1 * events.median_ms
