"""torch.compile: a model calling attention() compiles into one graph, forward and backward correct."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import attnforge
from attnforge.backends.exact import reference_attention
from attnforge.dispatch import runtime
from attnforge.errors import DispatchError
from attnforge.records import RecordStore

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch internals imported by inductor


@pytest.fixture(autouse=True)
def empty_records(tmp_path: Path) -> Any:
    previous = runtime.set_dispatcher(runtime.Dispatcher(records=RecordStore(tmp_path)))
    torch._dynamo.reset()
    yield
    runtime.set_dispatcher(previous)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        a = attnforge.attention(q, k, v, causal=True, layout="bshd")
        b = attnforge.attention(a, k, v, causal=True, layout="bshd")
        return self.proj(b)


def _inputs(grad: bool) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(3)
    shapes = ((2, 6, 4, 16), (2, 9, 2, 16), (2, 9, 2, 16))  # bshd, GQA, Sq < Sk
    return tuple(torch.randn(*s, generator=g).requires_grad_(grad) for s in shapes)


def test_no_graph_break() -> None:
    explained = torch._dynamo.explain(Block())(*_inputs(grad=False))
    assert explained.graph_break_count == 0
    assert explained.graph_count == 1


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_fullgraph_compile_matches_eager(grad: bool) -> None:
    block = Block()
    q, k, v = _inputs(grad)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    out = compiled(q, k, v)
    eager = block(q, k, v)
    torch.testing.assert_close(out, eager)
    if grad:
        got = torch.autograd.grad(out.sum(), (q, k, v))
        want = torch.autograd.grad(eager.sum(), (q, k, v))
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)


def test_custom_op_backward_matches_reference() -> None:
    q, k, v = (t.transpose(1, 2) for t in _inputs(grad=True))
    out = torch.ops.attnforge.attention(q, k, v, True, 0.5, None, "exact", True)
    ref = reference_attention(q, k, v, causal=True, scale=0.5)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-4)
    got = torch.autograd.grad(out.sum(), (q, k, v))
    want = torch.autograd.grad(ref.sum(), (q, k, v))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), w.double(), atol=1e-5, rtol=1e-4)


def test_custom_op_passes_torch_library_checks() -> None:
    q, k, v = (t.transpose(1, 2).contiguous() for t in _inputs(grad=True))
    torch.library.opcheck(torch.ops.attnforge.attention.default, (q, k, v, True, None, None, "exact", True),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_a_value_head_dim_that_differs_compiles_and_matches() -> None:
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(1, 4, 5, 16, generator=g), torch.randn(1, 2, 7, 16, generator=g)
    v = torch.randn(1, 2, 7, 8, generator=g)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnforge.attention(q, k, v, causal=True)

    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v)
    assert out.shape == (1, 4, 5, 8)
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, causal=True), atol=1e-5, rtol=1e-4)
    torch.library.opcheck(torch.ops.attnforge.attention.default, (q, k, v, True, None, None, "exact", False),
                          test_utils=("test_schema", "test_faketensor"))


# the SDPA adapter asks a cached question on CPU (whether SDPA zeroes rows that see no key); Dynamo traces it through
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`-wrapped function:UserWarning")
def test_a_masked_decode_call_compiles_fullgraph_and_matches_eager() -> None:
    """A decode call with a padding mask and a scale (transformers' call of every layer, the one the decode lane
    serves in eager mode) compiles with ``fullgraph=True``, after eager calls have made a lane, and matches eager."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 1, 16, generator=g)
    k, v = torch.randn(2, 2, 9, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g)
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    mask[1, ..., :3] = False

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return attnforge.attention(q, k, v, attn_mask=mask, scale=0.25)

    eager = fn(q, k, v, mask)
    fn(q, k, v, mask)  # a repeat: the eager path's lane, if the backend offers one
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v, mask)
    torch.testing.assert_close(out, eager)


# -- a call with features whose class nobody decided yet, traced first -----------------------------------------
def _featured() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(7)
    q, k, v = torch.randn(2, 4, 6, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g), torch.randn(
        2, 2, 9, 16, generator=g)
    mask = torch.rand(2, 1, 6, 9, generator=g) > 0.3
    mask[..., -1] = True
    return q, k, v, mask


FEATURED = [
    pytest.param({"mask": True, "softcap": 3.0, "scale": 0.3}, id="mask-softcap"),
    pytest.param({"mask": "float"}, id="additive-mask"),
    pytest.param({"sinks": True, "causal": True}, id="sinks"),
    pytest.param({"window": (3, 0), "causal": True}, id="window"),
    pytest.param({"window": (10**30, 0), "causal": True}, id="window-unbounded"),
    pytest.param({"is_causal": True}, id="is-causal-top-left"),
    pytest.param({"causal": True, "causal_alignment": "top_left", "layout": "bshd"}, id="top-left-bshd"),
]


def _featured_call(case: dict[str, Any], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: torch.Tensor) -> Any:
    kwargs = dict(case)
    if kwargs.pop("sinks", None):
        kwargs["sinks"] = torch.linspace(-1.0, 1.0, q.shape[1])
    given = kwargs.pop("mask", None)
    if given is True:
        kwargs["attn_mask"] = mask
    elif given == "float":
        kwargs["attn_mask"] = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    if kwargs.get("layout") == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    return attnforge.attention(q, k, v, **kwargs)


def _compiled_matches_eager(fn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extra: torch.Tensor) -> None:
    """``fn(q, k, v, extra)`` traced with no graph break, compiled with ``fullgraph=True``: its output and the gradients
    of q, k and v are eager's."""
    explained = torch._dynamo.explain(fn)(q, k, v, extra)
    assert explained.graph_break_count == 0
    torch._dynamo.reset()
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v, extra)
    eager = fn(q, k, v, extra)
    torch.testing.assert_close(out, eager)
    got = torch.autograd.grad(out.square().sum(), (q, k, v))
    want = torch.autograd.grad(eager.square().sum(), (q, k, v))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("case", FEATURED)
def test_a_featured_call_first_traced_compiles_fullgraph_and_matches_eager(case: dict[str, Any]) -> None:
    """Nothing decided or recorded (a fresh dispatcher): the first call of the class is the traced one. The feature
    path decides a class under the records' lock and reads them from SQLite, which Dynamo cannot follow: a tiny
    Llama with ``attn_implementation="attnforge"`` compiled with ``fullgraph=True`` failed on its first layer
    ("Unsupported context manager"). The call is one ``attnforge::attention_features`` op now."""
    q, k, v, mask = (t.requires_grad_() if t.is_floating_point() else t for t in _featured())

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> Any:
        return _featured_call(case, q, k, v, mask)

    _compiled_matches_eager(fn, q, k, v, mask)


def _packed(grad: bool) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(3)
    q = torch.randn(15, 4, 16, generator=g, requires_grad=grad)
    k, v = (torch.randn(15, 2, 16, generator=g, requires_grad=grad) for _ in range(2))
    return q, k, v, torch.tensor([0, 5, 8, 15], dtype=torch.int32)  # sequences of 5, 3 and 7


@pytest.mark.parametrize("kwargs", [
    pytest.param({"max_seqlen_q": 7, "max_seqlen_k": 7}, id="max-given"),
    pytest.param({"window": (2, 0), "softcap": 5.0, "scale": 0.3}, id="window-softcap"),
])
def test_a_varlen_call_first_traced_compiles_fullgraph_and_matches_eager(kwargs: dict[str, Any]) -> None:
    """Packed sequences (``cu_seqlens``: padding-free training, a serving batch) traced on the class's first call
    with ``fullgraph=True``: traced, the feature path decided the class under the records' lock ("Unsupported
    context manager"), and a class decided by an eager call was traced through the dispatcher's state. The call is the
    ``attnforge::attention_varlen`` op, which checks the offsets at run time; forward and gradients are eager's."""
    q, k, v, cu = _packed(grad=True)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
        return attnforge.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True, **kwargs)

    _compiled_matches_eager(fn, q, k, v, cu)


def test_the_varlen_op_is_kept_out_of_cuda_graphs_and_the_masked_one_is_not() -> None:
    """A packed call reads its offsets on the host, which a CUDA graph capture forbids: its op carries
    ``torch.Tag.cudagraph_unsafe``, so Inductor's ``mode="reduce-overhead"`` runs it outside its graphs (where it ran
    eagerly before, at a graph break); the masked calls' op stays capturable (its feature path is capture-safe)."""
    unsafe = torch.Tag.cudagraph_unsafe
    assert unsafe in torch.ops.attnforge.attention_varlen.default.tags
    assert unsafe in torch.ops.attnforge.attention_varlen_backward.default.tags
    assert unsafe not in torch.ops.attnforge.attention_features.default.tags
    assert unsafe not in torch.ops.attnforge.attention_features_backward.default.tags


def test_bad_offsets_compiled_fullgraph_raise_eagers_dispatch_error() -> None:
    """Offsets that do not describe the packed tensors, or one of the two missing, under ``fullgraph=True``: eager's
    :class:`DispatchError` when the compiled code runs (the op checks them, as eager mode does)."""
    q, k, v, cu = _packed(grad=False)
    short = torch.tensor([0, 5, 8, 14], dtype=torch.int32)
    for call, words in ((lambda a, b, c: attnforge.attention(a, b, c, cu_seqlens_q=short, cu_seqlens_k=short),
                         "do not describe"),
                        (lambda a, b, c: attnforge.attention(a, b, c, cu_seqlens_q=cu), "needs both")):
        torch._dynamo.reset()
        with pytest.raises(DispatchError, match=words) as info:
            torch.compile(call, fullgraph=True, backend="aot_eager")(q, k, v)
        assert info.value.hint


def test_a_bad_window_or_softcap_traced_is_refused_as_in_eager_mode() -> None:
    q, k, v, _ = _featured()
    for kwargs in ({"window": (-5, 0)}, {"softcap": float("nan")}):
        torch._dynamo.reset()
        with pytest.raises(DispatchError):
            torch.compile(lambda a, b, c, kw=kwargs: attnforge.attention(a, b, c, **kw), backend="aot_eager")(q, k, v)


@pytest.mark.parametrize("decided", [False, True], ids=["undecided", "decided"])
def test_a_bad_mask_compiled_fullgraph_raises_the_dispatch_error(decided: bool) -> None:
    """A mask that does not broadcast to ``[B, Hq, Sq, Sk]`` (the batch of another tensor), or an integer mask,
    under ``torch.compile(fullgraph=True)``: the caller gets eager's :class:`DispatchError` and its hint, raised by
    the op at run time. Checked while Dynamo traced, it was Dynamo's ``Unsupported`` ("Attempted to call a super()
    attribute", "Observed exception"), the message lost."""
    q, k, v, mask = _featured()
    if decided:
        attnforge.attention(q, k, v, attn_mask=mask)
    for bad, words in ((torch.ones(4, 1, 6, 9, dtype=torch.bool), "does not broadcast"),
                       (mask.int(), "bool or floating-point")):
        torch._dynamo.reset()
        compiled = torch.compile(lambda a, b, c, m: attnforge.attention(a, b, c, attn_mask=m), fullgraph=True,
                                 backend="aot_eager")
        with pytest.raises(DispatchError, match=words) as info:
            compiled(q, k, v, bad)
        assert info.value.hint


BAD_TRACED = [
    pytest.param(lambda q, k, v: attnforge.attention(q, k[:, :3], v[:, :3]), "not a multiple", id="heads"),
    pytest.param(lambda q, k, v: attnforge.attention(q, k.double(), v), "dtypes differ", id="dtypes"),
    pytest.param(lambda q, k, v: attnforge.attention(q[0], k, v), "cu_seqlens", id="three-dims"),
    pytest.param(lambda q, k, v: attnforge.attention(q, k, v, scale=-1.0), "scale", id="scale"),
    pytest.param(lambda q, k, v: attnforge.attention(q, k, v, layout="sbhd"), "layout", id="layout"),
    pytest.param(lambda q, k, v: attnforge.attention(q, k, v, window=(-5, 0)), "window", id="window"),
    pytest.param(lambda q, k, v: attnforge.attention(q, k, v, window="left"), "window", id="window-type"),
    pytest.param(lambda q, k, v: attnforge.attention(q, k, v, causal=True, softcap=float("nan")), "softcap",
                 id="softcap"),
    # GQA turned off with Hq != Hkv (found by a runtime fuzz, 2026-12-03: Dynamo's "Observed exception", or
    # "Unsupported context manager" as a process's first call)
    pytest.param(lambda q, k, v: attnforge.attention(q, k[:, :2], v[:, :2], enable_gqa=False), "enable_gqa=False",
                 id="gqa-off"),
    # the model's code after the call traces on (the refusal's stand-in output has the call's shape)
    pytest.param(lambda q, k, v: attnforge.attention(q, k[:, :3], v[:, :3]).transpose(1, 2).reshape(2, 6, -1)
                 @ torch.ones(64, 3), "not a multiple", id="heads-then-a-projection"),
]


@pytest.mark.parametrize(("fn", "words"), BAD_TRACED)
@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
def test_a_bad_call_compiled_fullgraph_raises_eagers_dispatch_error(fn: Any, words: str, grad: bool) -> None:
    """Bad arguments under ``torch.compile(fullgraph=True)``: the caller gets the :class:`DispatchError` (message and
    hint) that eager mode raises, when the compiled code runs (``attnforge::refuse``). Raised while Dynamo traced,
    it was Dynamo's ``Unsupported`` ("Attempted to call a super() attribute that is not a function or method": the
    error's own ``__init__``; "Missing richcompare_impl override": a refused window's sentinel)."""
    q, k, v = (torch.randn(2, 4, 6, 16, requires_grad=grad), torch.randn(2, 4, 9, 16), torch.randn(2, 4, 9, 16))
    with pytest.raises(DispatchError, match=words) as eager:
        fn(q, k, v)
    torch._dynamo.reset()
    with pytest.raises(DispatchError, match=words) as compiled:
        torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v)
    assert (compiled.value.message, compiled.value.hint) == (eager.value.message, eager.value.hint)
    assert compiled.value.hint


def test_the_features_op_passes_torch_library_checks() -> None:
    q, k, v, mask = (t.requires_grad_() if t.is_floating_point() else t for t in _featured())
    sinks = torch.linspace(-1.0, 1.0, q.shape[1]).requires_grad_()
    torch.library.opcheck(torch.ops.attnforge.attention_features.default,
                          (q, k, v, mask, sinks, True, "top_left", None, [4, -1], 2.0, None, None, "exact"),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    out = torch.ops.attnforge.attention_features(q, k, v, mask, sinks, True, "top_left", None, [4, -1], 2.0, None,
                                                 None, "exact")
    eager = attnforge.attention(q, k, v, attn_mask=mask, sinks=sinks, causal=True, causal_alignment="top_left",
                                window=(4, -1), softcap=2.0)
    torch.testing.assert_close(out, eager)
    got = torch.autograd.grad(out.square().sum(), (q, k, v, sinks))
    want = torch.autograd.grad(eager.square().sum(), (q, k, v, sinks))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
    pq, pk, pv, cu = _packed(grad=True)  # packed sequences: the offsets and longest lengths after the other options
    torch.library.opcheck(torch.ops.attnforge.attention_varlen.default,
                          (pq, pk, pv, None, None, True, "bottom_right", None, None, None, None, None, "exact", cu, cu,
                           7, 7),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_a_featured_call_is_the_op_also_once_an_eager_call_decided_its_class() -> None:
    """Traced inline, a decided class's feature path read the device's name on a CUDA tensor
    (``torch.cuda.get_device_name``: Dynamo's "torch.* op returned non-Tensor", a masked call under
    ``torch.compile(mode="reduce-overhead", fullgraph=True)`` on an H200, 2026-12-01), and it traced the dispatcher's
    state (its shape counts, its plans). The op runs that path eagerly, decided or not; the graph holds nothing else
    of attnforge's, and the result is eager's."""
    q, k, v, mask = _featured()
    graphs: list[str] = []

    def capture(gm: torch.fx.GraphModule, example: Any) -> Any:
        graphs.append(gm.code)
        return gm.forward

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return attnforge.attention(q, k, v, attn_mask=mask, softcap=3.0)

    first = torch.compile(fn, fullgraph=True, backend=capture)(q, k, v, mask)
    assert "attention_features" in graphs[-1]
    eager = fn(q, k, v, mask)  # decides the class
    torch._dynamo.reset()
    again = torch.compile(fn, fullgraph=True, backend=capture)(q, k, v, mask)
    assert "attention_features" in graphs[-1]
    assert "scaled_dot_product" not in graphs[-1]  # no backend traced inline
    torch.testing.assert_close(first, eager)
    torch.testing.assert_close(again, eager)


@pytest.mark.parametrize("case", ["warmup", "recording", "other-stream", "cpu", "no-trees"])
def test_an_ops_real_run_in_cudagraph_warmup_keeps_nothing_as_under_capture(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside the warm-up of ``mode="reduce-overhead"``'s CUDA graph trees (the device's manager ``in_warmup``, the
    current stream its stream: torch/_inductor/cudagraph_trees.py, faked at that seam), an op's real run sees
    ``graph_capturing()`` True, so it keeps nothing it made (the warm-up's pool admits outputs only: "Detected 3
    tensor(s) in the cudagraph pool not tracked as outputs", H200, torch 2.11, 2026-12-01); recording (a real capture
    answers for itself), another stream, a CPU tensor or no trees module loaded change nothing, and the flag is
    gone after the scope."""
    import sys
    import types

    from attnforge.backends import _base

    stream = object()
    manager = types.SimpleNamespace(in_warmup=case != "recording", stream=stream)
    trees = types.ModuleType("torch._inductor.cudagraph_trees")
    trees.get_manager = lambda index, create_if_none_exists=True: manager if index == 0 else None  # type: ignore[attr-defined]
    if case == "no-trees":
        monkeypatch.delitem(sys.modules, "torch._inductor.cudagraph_trees", raising=False)
    else:
        monkeypatch.setitem(sys.modules, "torch._inductor.cudagraph_trees", trees)
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda index=None: object() if case == "other-stream" else stream)
    t = types.SimpleNamespace(device=torch.device("cpu" if case == "cpu" else "cuda", 0))
    assert not _base.graph_capturing()
    with _base.cudagraph_warmup(t):
        assert _base.graph_capturing() is (case == "warmup")
    assert not _base.graph_capturing()


# -- torch.autocast: a compiled call casts q, k, v as an eager one does -----------------------------------------
def _autocast_case(case: str) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    """float32 q, k, v (q, k float32 beside a bfloat16 v for ``"mixed"``: what RoPE leaves under autocast) and the
    call's keywords."""
    g = torch.Generator().manual_seed(11)
    q, k, v = torch.randn(1, 4, 5, 16, generator=g), torch.randn(1, 2, 7, 16, generator=g), torch.randn(
        1, 2, 7, 16, generator=g)
    kwargs: dict[str, Any] = {"causal": {"causal": True}, "masked": {"attn_mask": torch.rand(
        1, 1, 5, 7, generator=g) > 0.3}}.get(case, {})
    return (q, k, v.to(torch.bfloat16) if case == "mixed" else v), kwargs


@pytest.mark.parametrize("case", ["plain", "causal", "masked", "mixed"])
def test_a_compiled_call_under_autocast_casts_as_eager_does(case: str) -> None:
    """Under ``torch.autocast("cpu", bfloat16)`` eager attention() casts q, k, v to bfloat16 (SDPA's autocast rule);
    compiled, the cast was skipped: the op computed in float32 (a float32 output), and mixed q, k, v (RoPE's) were
    refused ("q, k, v dtypes differ") where SDPA and eager serve them."""
    (q, k, v), kwargs = _autocast_case(case)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnforge.attention(q, k, v, **kwargs)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = fn(q, k, v)
        out = torch.compile(fn, backend="aot_eager")(q, k, v)
    assert eager.dtype == out.dtype == torch.bfloat16
    torch.testing.assert_close(out, eager, atol=1e-2, rtol=1e-2)
    want = reference_attention(*(t.to(torch.bfloat16) for t in (q, k, v)), **kwargs)  # the inputs eager computes on
    torch.testing.assert_close(out.double(), want, atol=3e-2, rtol=3e-2)


def test_a_compiled_fullgraph_call_under_autocast_trains_as_eager_and_is_guarded_on_autocast() -> None:
    """RoPE's mixed q, k (float32) and v (bfloat16) under autocast, with ``fullgraph=True`` (no graph break for the
    cast): output and gradients are eager's (bfloat16 output, each gradient in its input's dtype); the same compiled
    function called with autocast off refuses them as eager does (Dynamo guards the graph on the autocast state)."""
    (q, k, v), _ = _autocast_case("mixed")
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnforge.attention(q, k, v, causal=True)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager, out = fn(q, k, v), compiled(q, k, v)
    assert eager.dtype == out.dtype == torch.bfloat16
    torch.testing.assert_close(out, eager, atol=1e-2, rtol=1e-2)
    got = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    want = torch.autograd.grad(eager.float().square().sum(), (q, k, v))
    for g, w, t in zip(got, want, (q, k, v), strict=True):
        assert g.dtype == w.dtype == t.dtype
        torch.testing.assert_close(g.float(), w.float(), atol=3e-2, rtol=3e-2)
    with pytest.raises(DispatchError, match="dtypes differ"):  # autocast off: refused, as eager refuses them
        compiled(q, k, v)
