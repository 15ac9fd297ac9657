"""Shape grids: the papers' grid, the CPU grid, the user's model shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnforge.bench.grid import cpu_grid, model_shapes, paper_grid
from attnforge.bench.reference import load_reference, reference_shapes
from attnforge.errors import UsageError
from attnforge.types.shapes import Mode

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "h200_bench_2026-11-21.json"


def test_paper_grid_is_16k_tokens_hidden_2048_both_masks_both_modes() -> None:
    grid = paper_grid(dtype="bfloat16")
    assert len(grid) == 6 * 2 * 2 * 2
    assert {s.seqlen_q for s in grid} == {512, 1024, 2048, 4096, 8192, 16384}
    assert {s.head_dim for s in grid} == {64, 128}
    assert {(s.causal, s.mode) for s in grid} == {(c, m) for c in (False, True) for m in Mode}
    for s in grid:
        assert s.batch * s.seqlen_q == 16384
        assert s.heads_q * s.head_dim == 2048
        assert s.seqlen_q == s.seqlen_k
        assert s.heads_kv == s.heads_q


def test_the_h200_fixture_shapes_are_in_the_paper_grid() -> None:
    grid = set(paper_grid(dtype="bfloat16"))
    shapes = reference_shapes(load_reference(FIXTURE))
    assert len(shapes) == 3 * 2 * 2
    assert set(shapes) <= grid


def test_cpu_grid_keeps_the_structure_at_a_tiny_size() -> None:
    grid = cpu_grid(dtype="float32")
    assert {(s.causal, s.mode) for s in grid} == {(c, m) for c in (False, True) for m in Mode}
    assert max(s.batch * s.heads_q * s.seqlen_q * s.head_dim for s in grid) <= 64 * 1024


def test_model_shape_with_gqa_and_cross_lengths() -> None:
    shapes = model_shapes(batch=2, heads_q=32, heads_kv=8, head_dims=(128,), seqlens=(4096,), seqlen_k=8192,
                          dtype="bfloat16", causals=(True,), modes=(Mode.FWD,))
    [s] = shapes
    assert (s.batch, s.heads_q, s.heads_kv, s.head_dim, s.seqlen_q, s.seqlen_k) == (2, 32, 8, 128, 4096, 8192)
    assert s.label == "fwd causal D128 B2 H32/8 S4096x8192"


@pytest.mark.parametrize(("kwargs", "message"), [
    pytest.param({"batch": None}, "--shapes model needs --batch", id="no-batch"),
    pytest.param({"seqlens": ()}, "needs --seqlen", id="no-seqlen"),
    pytest.param({"heads_q": 6, "heads_kv": 4}, "not a multiple of --kv-heads 4", id="bad-gqa"),
    pytest.param({"batch": 0}, "sizes must be positive: --batch", id="zero-batch"),
    pytest.param({"head_dims": (64, -1)}, "--head-dim -1", id="negative-head-dim"),
])
def test_bad_model_shapes_are_usage_errors(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"batch": 1, "heads_q": 8, "heads_kv": None, "head_dims": (64,),
                               "seqlens": (128,), "seqlen_k": None, "dtype": "float32", "causals": (False,),
                               "modes": (Mode.FWD,)}
    with pytest.raises(UsageError, match=message):
        model_shapes(**{**base, **kwargs})  # type: ignore[arg-type]
