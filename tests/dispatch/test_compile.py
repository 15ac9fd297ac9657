"""torch.compile: a model calling attention() compiles into one graph, forward and backward correct."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import attnforge
from attnforge.backends.exact import reference_attention
from attnforge.dispatch import runtime
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
