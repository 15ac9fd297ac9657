"""The FLOP convention: a hand-computed case, the causal pair count, and the H200 fixture's own numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnforge.bench.flops import attended_pairs, attention_flops, causal_pairs, shape_flops, tflops
from attnforge.bench.reference import load_reference
from attnforge.types.shapes import Mode

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "h200_bench_2026-11-21.json"


@pytest.mark.parametrize(("sq", "sk", "causal", "mode", "want"), [
    # B=2, H=3, D=8: 4 * 2 * 3 * 8 = 192 FLOPs per attended (query, key) pair
    pytest.param(4, 4, False, Mode.FWD, 192 * 16, id="full-fwd"),
    pytest.param(4, 4, True, Mode.FWD, 192 * 8, id="causal-square-is-half"),
    pytest.param(4, 4, False, Mode.FWD_BWD, 192 * 16 * 3.5, id="full-fwd+bwd"),
    # Sq=2, Sk=5, bottom-right: query 0 sees keys 0..3 (4), query 1 sees 0..4 (5) -> 9 pairs
    pytest.param(2, 5, True, Mode.FWD, 192 * 9, id="causal-sq<sk"),
    # Sq=5, Sk=2: queries 0..2 see nothing, query 3 sees key 0, query 4 sees 0..1 -> 3 pairs
    pytest.param(5, 2, True, Mode.FWD_BWD, 192 * 3 * 3.5, id="causal-sq>sk-bwd"),
    pytest.param(5, 2, False, Mode.FWD, 192 * 10, id="full-sq>sk"),
])
def test_hand_computed_flops(sq: int, sk: int, causal: bool, mode: Mode, want: float) -> None:
    got = attention_flops(batch=2, heads_q=3, seqlen_q=sq, seqlen_k=sk, head_dim=8, causal=causal, mode=mode)
    assert got == pytest.approx(want)


@given(sq=st.integers(0, 300), sk=st.integers(0, 300))
def test_causal_pairs_counts_the_bottom_right_mask(sq: int, sk: int) -> None:
    brute = sum(1 for i in range(sq) for j in range(sk) if j <= i + sk - sq)
    assert causal_pairs(sq, sk) == brute
    assert causal_pairs(sq, sk) <= sq * sk


@given(s=st.integers(1, 10_000))
def test_square_causal_is_exactly_half_by_convention(s: int) -> None:
    assert attended_pairs(s, s, causal=True) == s * s / 2
    assert causal_pairs(s, s) == s * (s + 1) // 2  # the true count differs by the diagonal only


def test_negative_lengths_are_rejected() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        causal_pairs(-1, 3)


def test_tflops_of_a_known_rate() -> None:
    assert tflops(2e12, 1000.0) == pytest.approx(2.0)
    assert tflops(1e12, 0.0) == 0.0


def test_the_h200_fixture_agrees_with_the_formula() -> None:
    raw = json.loads(FIXTURE.read_text(encoding="utf-8"))["rows"]
    rows = load_reference(FIXTURE)
    assert len(rows) == len(raw)
    for row in rows:
        # the fixture prints TFLOP/s to 0.1 and ms to 0.1 us: agreement within 0.1 % is exact enough
        assert tflops(shape_flops(row.shape), row.ms) == pytest.approx(row.tflops, rel=1e-3), row
