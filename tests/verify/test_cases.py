"""The verify matrix: dtypes x head dims x causal, with GQA and Sq != Sk in every combination."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnforge.verify.cases import claimed_matrix, generate_cases


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32), max_seqlen=st.integers(1, 4096))
def test_every_combination_has_a_self_and_a_gqa_cross_case(seed: int, max_seqlen: int) -> None:
    cases = generate_cases(dtypes=("float16", "bfloat16"), head_dims=(64, 128), max_seqlen=max_seqlen,
                           seed=seed)
    assert len(cases) == 2 * 2 * 2 * 2
    combos = {(c.dtype, c.head_dim, c.causal) for c in cases}
    assert len(combos) == 8
    for c in cases:
        assert c.heads_q % c.heads_kv == 0
        assert 1 <= c.seqlen_q <= max(8, max_seqlen)
        assert 1 <= c.seqlen_k <= max(8, max_seqlen)
    assert sum(c.seqlen_q != c.seqlen_k for c in cases) == 8
    assert sum(c.heads_q != c.heads_kv for c in cases) == 8


def test_same_seed_same_cases_other_seed_other_cases() -> None:
    kw = {"dtypes": ("float32",), "head_dims": (32,), "max_seqlen": 100}
    assert generate_cases(seed=1, **kw) == generate_cases(seed=1, **kw)
    assert generate_cases(seed=1, **kw) != generate_cases(seed=2, **kw)


@pytest.mark.parametrize(("device", "dtypes", "max_head_dim", "want_dtypes", "want_dims"), [
    pytest.param("cuda", ("float16", "bfloat16", "float8_e4m3fn"), 256, ("float16", "bfloat16"),
                 (64, 96, 128, 256), id="fa3-on-cuda"),
    pytest.param("cuda", ("float16", "bfloat16"), 128, ("float16", "bfloat16"), (64, 96, 128),
                 id="cudnn-d128"),
    pytest.param("cpu", ("float16", "bfloat16", "float32", "float64"), 65536, ("float32", "bfloat16"),
                 (32, 64, 128), id="math-on-cpu"),
    pytest.param("cpu", ("float16",), 256, (), (32, 64, 128), id="fp16-only-on-cpu"),
])
def test_claimed_matrix_intersects_device_and_claims(
    device: str, dtypes: tuple[str, ...], max_head_dim: int, want_dtypes: tuple[str, ...],
    want_dims: tuple[int, ...],
) -> None:
    assert claimed_matrix(device_type=device, backend_dtypes=dtypes, max_head_dim=max_head_dim) == (
        want_dtypes, want_dims)
