"""On a CUDA GPU: the FA3/FA4 direct entries against their public functions, and ``attention()`` captured in a
CUDA graph and replayed against eager (skipped without a GPU; each backend skipped where it does not import)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import attnforge
from attnforge.backends import registry
from attnforge.backends.adapter import AttentionCall
from attnforge.backends.bound import bound_call
from attnforge.backends.exact import reference_attention
from attnforge.dispatch import runtime
from attnforge.records import RecordStore

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:Argument aux_data:UserWarning")]  # FA4's first compile

CASES = [
    pytest.param(8, 8, 128, 128, 64, False, id="plain"),
    pytest.param(8, 8, 256, 256, 128, True, id="causal"),
    pytest.param(8, 2, 96, 160, 128, True, id="gqa-sq<sk"),
    pytest.param(4, 4, 1, 300, 256, True, id="decode-d256"),
]


@pytest.fixture(autouse=True)
def own_dispatcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNFORGE_AUTOTUNE", "0")  # the capture test needs a decision, not a measurement
    # through monkeypatch, so a test that replaces it the same way (fa4_only_dispatcher) is undone first
    monkeypatch.setattr(runtime, "_DISPATCHER", runtime.Dispatcher(records=RecordStore(tmp_path)))


def _usable(name: str) -> Any:
    adapter = registry.adapters()[name]
    problem = adapter.load_error()
    if problem:
        pytest.skip(problem)
    return adapter


def _qkv(hq: int, hkv: int, sq: int, sk: int, d: int, *, grad: bool) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(0)
    return tuple(torch.randn(2, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(grad)
                 for h, s in ((hq, sq), (hkv, sk), (hkv, sk)))


def _call(q: torch.Tensor, k: torch.Tensor, *, causal: bool, grad: bool) -> AttentionCall:
    cc = torch.cuda.get_device_capability()
    return AttentionCall(device_type="cuda", compute_capability=(cc[0], cc[1]), dtype="bfloat16",
                         batch=q.shape[0], heads_q=q.shape[1], heads_kv=k.shape[1], seqlen_q=q.shape[2],
                         seqlen_k=k.shape[2], head_dim=q.shape[3], causal=causal, needs_grad=grad)


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
@pytest.mark.parametrize(("hq", "hkv", "sq", "sk", "d", "causal"), CASES)
def test_fa3_direct_equals_the_public_function(hq: int, hkv: int, sq: int, sk: int, d: int,  # noqa: PLR0917
                                               causal: bool, bshd: bool) -> None:
    fa3 = _usable("flash-attn-3")
    assert fa3.direct_entry() is not None, "this FA3 build registers other op schemas: the direct entry is off"
    q, k, v = _qkv(hq, hkv, sq, sk, d, grad=True)
    if fa3.unsupported_reasons(_call(q, k, causal=causal, grad=True)):
        pytest.skip("; ".join(fa3.unsupported_reasons(_call(q, k, causal=causal, grad=True))))
    args = tuple(t.transpose(1, 2) for t in (q, k, v)) if bshd else (q, k, v)
    public = fa3.module().flash_attn_func
    want = public(*(a if bshd else a.transpose(1, 2) for a in args), causal=causal)
    want = want if bshd else want.transpose(1, 2)
    with torch.no_grad():
        out = bound_call(fa3, _call(q, k, causal=causal, grad=False), causal=causal, scale=None, bshd=bshd)(*args)
    assert torch.equal(out, want)  # the same kernel with the same arguments
    trained = bound_call(fa3, _call(q, k, causal=causal, grad=True), causal=causal, scale=None, bshd=bshd)(*args)
    assert torch.equal(trained, want)
    grad = torch.randn_like(want)
    got = torch.autograd.grad(trained, (q, k, v), grad)
    expected = torch.autograd.grad(want, (q, k, v), grad)
    for g, w in zip(got, expected, strict=True):  # dq accumulates atomically: equal up to the order of sums
        torch.testing.assert_close(g, w, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(("hq", "hkv", "sq", "sk", "d", "causal"), CASES)
def test_fa4_direct_equals_the_public_function(hq: int, hkv: int, sq: int, sk: int, d: int,  # noqa: PLR0917
                                               causal: bool) -> None:
    fa4 = _usable("flash-attn-4")
    q, k, v = _qkv(hq, hkv, sq, sk, d, grad=False)
    call = _call(q, k, causal=causal, grad=False)
    if fa4.unsupported_reasons(call):
        pytest.skip("; ".join(fa4.unsupported_reasons(call)))
    qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))
    want = fa4.module().flash_attn_func(qs, ks, vs, causal=causal)
    want = want[0] if isinstance(want, tuple) else want
    bound = bound_call(fa4, call, causal=causal, scale=None, bshd=True)
    assert torch.equal(bound(qs, ks, vs), want)  # first call: _flash_attn_fwd
    assert torch.equal(bound(qs, ks, vs), want)  # second call (a binding records there, _fa4_direct.bind): recording
    # and checking the replay
    assert getattr(bound, "replay", None) is not None, "the compiled call was not replayable (see _fa4_direct)"
    g = torch.Generator(device="cuda").manual_seed(9)
    qs2, ks2, vs2 = (torch.randn(t.transpose(1, 2).shape, device="cuda", dtype=t.dtype, generator=g).transpose(1, 2)
                     for t in (qs, ks, vs))  # the same strides as the recorded call
    want2 = fa4.module().flash_attn_func(qs2, ks2, vs2, causal=causal)
    want2 = want2[0] if isinstance(want2, tuple) else want2
    assert torch.equal(bound(qs2, ks2, vs2), want2)  # replayed on new tensors


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
@pytest.mark.parametrize(("hq", "hkv", "sq", "sk", "d", "causal"), CASES)
def test_fa4_train_route_equals_the_public_function(hq: int, hkv: int, sq: int, sk: int, d: int,  # noqa: PLR0917
                                                    causal: bool, bshd: bool) -> None:
    """A call that needs a gradient: the lean autograd.Function (the forward replayed with its lse,
    _flash_attn_bwd called directly) against flash_attn_func, on new tensors after the recording."""
    fa4 = _usable("flash-attn-4")
    if fa4.direct_entry() is None or fa4.direct_backward() is None:
        pytest.skip("this FlashAttention-4 is not a version _fa4_direct mirrors")
    q, k, v = _qkv(hq, hkv, sq, sk, d, grad=True)
    call = _call(q, k, causal=causal, grad=True)
    if fa4.unsupported_reasons(call):
        pytest.skip("; ".join(fa4.unsupported_reasons(call)))
    bound = bound_call(fa4, call, causal=causal, scale=None, bshd=bshd)
    assert bound.__name__ in ("train_bshd", "train_bhsd"), "the train route is not the lean autograd.Function"
    public = fa4.module().flash_attn_func
    g = torch.Generator(device="cuda").manual_seed(9)
    for i in range(3):  # the first call plain, the second recorded and checked, the third replayed
        leaves = tuple(torch.randn(t.shape, device="cuda", dtype=t.dtype, generator=g).requires_grad_(True)
                       for t in (q, k, v))
        args = tuple(t.transpose(1, 2) for t in leaves) if bshd else leaves
        out = bound(*args)
        want = public(*(a if bshd else a.transpose(1, 2) for a in args), causal=causal)
        want = want[0] if isinstance(want, tuple) else want
        want = want if bshd else want.transpose(1, 2)
        assert torch.equal(out, want), i  # the same kernel with the same arguments
        dout = torch.randn(out.shape, device="cuda", dtype=out.dtype, generator=g)
        got = torch.autograd.grad(out, leaves, dout)
        expected = torch.autograd.grad(want, leaves, dout)
        for a, b in zip(got, expected, strict=True):  # dq accumulates with reduce-adds: equal up to their order
            torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)
    assert bound.replayer.replay is not None, "the forward with its lse was not replayable (see _fa4_direct)"  # type: ignore[attr-defined]


@pytest.mark.parametrize("softcap", [None, 50.0], ids=["plain", "softcap"])
def test_fa4_padded_decode_steps_run_the_replayed_varlen_kernel(softcap: float | None) -> None:
    """Gemma-2-9B's padded decode step (``q [4, 16, 1, 256]``, K/V ``[4, 8, Sk, 256]`` slices of a longer cache,
    left padding on two rows), two layers sharing each step's mask: through ``attention(backend="flash-attn-4")``
    over four steps, each against the float64 reference, every call on the kernel (none on the exact math), the
    compiled call recorded once and replayed after."""
    from attnforge.backends import exact as exact_module

    fa4 = _usable("flash-attn-4")
    if fa4.direct_entry() is None:
        pytest.skip("flash-attn-4 is not a version the direct entry mirrors")
    exact_calls: list[int] = []
    real_exact = exact_module.exact_attention

    def counting(*args: Any, **kwargs: Any) -> Any:
        exact_calls.append(1)
        return real_exact(*args, **kwargs)

    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(4, 16, 1, 256, device="cuda", dtype=torch.bfloat16, generator=g)
    cache = torch.randn(2, 4, 8, 600, 256, device="cuda", dtype=torch.bfloat16, generator=g)
    steps = []
    for sk in (500, 501, 502, 503):
        k, v = cache[0, :, :, :sk], cache[1, :, :, :sk]
        mask = torch.ones(4, 1, 1, sk, dtype=torch.bool, device="cuda")
        mask[1, ..., :37] = False
        mask[3, ..., :200] = False
        # the references first: reference_attention is the exact math too, which the count below must not see
        steps.append((k, v, mask, reference_attention(q, k, v, attn_mask=mask, softcap=softcap)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(exact_module, "exact_attention", counting)
        for k, v, mask, want in steps:
            for _layer in range(2):
                out = attnforge.attention(q, k, v, attn_mask=mask, softcap=softcap, backend="flash-attn-4")
                torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    assert exact_calls == [], "a padded decode step went to the exact math"
    adapter = runtime.get_dispatcher().adapter("flash-attn-4")
    runs = list(adapter.varlen_replays.values())  # type: ignore[attr-defined]
    assert runs and all(r.replay is not None for r in runs), "the varlen call was not replayable (see _fa4_direct)"


def test_fa4_padded_decode_later_layers_take_its_lane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemma-2-9B's padded decode call (``q [4, 16, 1, 256]``, softcap 50) unforced, on a dispatcher whose only
    backend is FlashAttention-4 (verified in its own home, as after ``attnforge install flash-attn-4``): four layers
    per step share the mask; each step's first layer goes through the adapter, the other three take its lane
    (:class:`attnforge.backends.flash.Fa4DecodeLane`); every output within bf16 of the float64 reference."""
    from tests.dispatch._padded_steps import fa4_only_dispatcher

    fa4 = _usable("flash-attn-4")
    if fa4.direct_entry() is None:
        pytest.skip("flash-attn-4 is not a version the direct entry mirrors")
    masked = fa4_only_dispatcher(fa4, tmp_path / "fa4-only", monkeypatch, device="cuda",
                                 version=str(fa4.installed_version()))
    g = torch.Generator(device="cuda").manual_seed(2)
    cache = torch.randn(2, 4, 8, 600, 256, device="cuda", dtype=torch.bfloat16, generator=g)
    for step, sk in enumerate((500, 501, 502)):
        q = torch.randn(4, 16, 1, 256, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = cache[0, :, :, :sk], cache[1, :, :, :sk]
        mask = torch.ones(4, 1, 1, sk, dtype=torch.bool, device="cuda")
        mask[1, ..., : 37 + step] = False
        want = reference_attention(q, k, v, attn_mask=mask, scale=256 ** -0.5, softcap=50.0)
        for _layer in range(4):
            out = attnforge.attention(q, k, v, attn_mask=mask, scale=256 ** -0.5, softcap=50.0)
            torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    assert len(masked) == 3, masked  # one a step; its other three layers took the lane


@pytest.mark.parametrize("backend", [None, "sdpa", "flash-attn-3", "flash-attn-4"],
                         ids=["choice", "sdpa", "fa3", "fa4"])
def test_attention_captured_in_a_cuda_graph_replays_as_eager(backend: str | None) -> None:
    if backend is not None and backend != "sdpa":
        _usable(backend)
    q, k, v = _qkv(8, 2, 256, 256, 128, grad=False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture: the decision, imports, JIT compiles
        for _ in range(3):
            attnforge.attention(q, k, v, causal=True, backend=backend)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = attnforge.attention(q, k, v, causal=True, backend=backend)
    for seed in (1, 2):
        g = torch.Generator(device="cuda").manual_seed(seed)
        for t in (q, k, v):
            t.copy_(torch.randn(t.shape, device="cuda", dtype=t.dtype, generator=g))
        graph.replay()
        torch.testing.assert_close(static_out, attnforge.attention(q, k, v, causal=True, backend=backend),
                                   atol=0, rtol=0)


def test_a_mask_first_prepared_inside_capture_serves_eager_calls_right() -> None:
    """The SDPA adapter keeps its preparation of a caller's mask (additive, empty rows opened) per mask object;
    one made inside CUDA graph capture holds nothing until the graph replays, so it is not kept: an eager call
    with the same mask object before any replay must still be exact."""
    q, k, v = _qkv(8, 2, 1, 300, 128, grad=False)
    mask = torch.ones(2, 1, 1, 300, dtype=torch.bool, device="cuda")
    mask[1, ..., :120] = False
    mask[0] = False  # a row that sees no key: zeros
    warm = mask.clone()  # the decision and imports, on another mask object
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            attnforge.attention(q, k, v, attn_mask=warm, backend="sdpa")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = attnforge.attention(q, k, v, attn_mask=mask, backend="sdpa")
    eager = attnforge.attention(q, k, v, attn_mask=mask, backend="sdpa")  # before any replay
    ref = reference_attention(q, k, v, attn_mask=mask).to(q.dtype)
    torch.testing.assert_close(eager, ref, atol=2e-2, rtol=2e-2)
    assert torch.equal(eager[0], torch.zeros_like(eager[0]))
    graph.replay()
    torch.testing.assert_close(static_out, eager, atol=0, rtol=0)


def _replays_match_eager(block: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: Any) -> None:
    """``block(q, k, v, *rest)`` compiled with ``mode="reduce-overhead", fullgraph=True``: after its warm-up, record
    and replay, new values in q, k and v (the same buffers: a replay that skipped attention would be stale) give
    eager's output exactly."""
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    with warnings.catch_warnings():
        # Inductor's graph partitions may hold an empty CUDA graph (no kernel before the op): torch warns, the
        # replays below are what must hold (seen on an H200, torch 2.11, docs/benchmarks.md 2026-11-27)
        warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
        for _ in range(3):  # warm-up, record, replay
            compiled(q, k, v, *rest)
        for seed in range(2):
            with torch.no_grad():
                for t in (q, k, v):
                    t.copy_(torch.randn(t.shape, generator=torch.Generator(device="cuda").manual_seed(seed),
                                        device="cuda", dtype=t.dtype))
            out = compiled(q, k, v, *rest).clone()
            torch.testing.assert_close(out, block(q, k, v, *rest), atol=0, rtol=0)


def test_attention_under_reduce_overhead_compile_matches_eager() -> None:
    """``torch.compile(mode="reduce-overhead")`` captures the graph around the ``attnforge::attention`` op in a
    CUDA graph after its warm-up runs; replays must match eager."""
    torch._dynamo.reset()
    q, k, v = _qkv(8, 2, 256, 256, 128, grad=False)

    def block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnforge.attention(q, k, v, causal=True) * 2

    _replays_match_eager(block, q, k, v)


def test_a_varlen_call_under_reduce_overhead_compile_matches_eager() -> None:
    """Packed sequences under ``torch.compile(mode="reduce-overhead", fullgraph=True)``: the
    ``attnforge::attention_varlen`` op reads its offsets on the host, which a capture forbids, so it carries
    ``torch.Tag.cudagraph_unsafe`` and Inductor runs it outside its CUDA graphs (since 2026-12-01, the tag CPU-tested
    only); replays with new values must match eager."""
    torch._dynamo.reset()
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(600, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(600, 2, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    cu = torch.tensor([0, 200, 350, 600], dtype=torch.int32, device="cuda")

    def block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
        return attnforge.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=250, max_seqlen_k=250,
                                   causal=True) * 2

    _replays_match_eager(block, q, k, v, cu)


@pytest.mark.parametrize("softcap", [None, 30.0], ids=["mask", "mask-softcap"])
def test_a_masked_call_under_reduce_overhead_compile_matches_eager(softcap: float | None) -> None:
    """A masked call (transformers' every layer; with Gemma-2's softcap) under ``torch.compile(mode="reduce-overhead",
    fullgraph=True)`` is the ``attnforge::attention_features`` op, whose real implementation runs the feature path
    eagerly inside Inductor's CUDA graph (since 2026-12-01): its warm-up runs decide and keep what the captured
    replays then serve; replays with new values must match eager."""
    torch._dynamo.reset()
    q, k, v = _qkv(4, 2, 256, 256, 128, grad=False)  # q [2, 4, 256, 128]: 4 query heads, 2 K/V heads
    mask = torch.ones(q.shape[0], 1, 256, 256, dtype=torch.bool, device="cuda").tril()  # [B, 1, Sq, Sk]
    mask[1, ..., :40] = False  # left padding of the second sequence

    def block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return attnforge.attention(q, k, v, attn_mask=mask, softcap=softcap) * 2

    _replays_match_eager(block, q, k, v, mask)
