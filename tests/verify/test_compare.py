"""compare(): the worst element, both values and the failing fraction (as xformers' assert_allclose)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnforge.catalog.tolerances import PrecisionKind, Tolerance
from attnforge.verify.compare import compare

TOL = Tolerance(kind=PrecisionKind.EXACT, dtype="float32", atol=1e-3, rtol=1e-3, max_rel_l1=1e-2,
                sources=("t",))


def _ref(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_equal_outputs_pass_with_zero_error() -> None:
    ref = _ref((2, 3, 5, 8))
    res = compare(ref.float(), ref, TOL)
    assert res.ok
    assert res.nonfinite_count == 0
    assert res.failing_fraction == 0
    assert res.max_abs_err < 1e-6


@settings(max_examples=25, deadline=None)
@given(shape=st.tuples(*(st.integers(1, 4) for _ in range(3)), st.integers(1, 16)), data=st.data())
def test_the_single_bad_element_is_found_with_both_values(shape: tuple[int, int, int, int],
                                                          data: st.DataObject) -> None:
    ref = _ref(shape)
    out = ref.clone()
    index = tuple(data.draw(st.integers(0, n - 1)) for n in shape)
    out[index] += 0.5
    res = compare(out, ref, TOL)
    assert not res.ok
    assert res.worst_index == index
    assert res.worst_value == pytest.approx(float(ref[index]) + 0.5)
    assert res.worst_reference == pytest.approx(float(ref[index]))
    assert res.failing_fraction == pytest.approx(1 / ref.numel())
    assert res.max_abs_err == pytest.approx(0.5)
    assert str(list(index)) in res.describe()


def test_the_worst_is_measured_against_each_elements_own_tolerance() -> None:
    ref = torch.tensor([[[[1000.0, 0.0]]]], dtype=torch.float64)
    out = ref.clone()
    out[0, 0, 0, 0] += 0.5  # inside atol + rtol * 1000 = 1.001
    out[0, 0, 0, 1] += 0.01  # outside atol = 0.001
    res = compare(out, ref, TOL)
    assert res.worst_index == (0, 0, 0, 1)
    assert res.max_abs_err == pytest.approx(0.5)
    assert res.failing_fraction == pytest.approx(0.5)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_elements_fail(bad: float) -> None:
    ref = _ref((1, 2, 4, 4))
    out = ref.clone()
    out[0, 1, 2, 3] = bad
    res = compare(out, ref, TOL)
    assert not res.ok
    assert res.nonfinite_count == 1
    assert res.worst_index == (0, 1, 2, 3)
    assert "NaN/Inf" in res.describe()


def test_small_errors_everywhere_fail_on_relative_l1() -> None:
    tol = Tolerance(kind=PrecisionKind.QUANTIZED, dtype="float16", atol=1.0, rtol=1.0, max_rel_l1=0.05,
                    sources=("t",))
    ref = _ref((1, 1, 16, 16))
    res = compare(ref * 1.1, ref, tol)  # every element 10 % off: inside atol/rtol, outside rel L1
    assert res.failing_fraction == 0
    assert res.rel_l1 == pytest.approx(0.1)
    assert not res.ok


def test_wrong_shape_is_reported_not_raised() -> None:
    res = compare(_ref((1, 2, 3, 4)), _ref((1, 2, 4, 4)), TOL)
    assert not res.ok
    assert not res.shape_ok
    assert "shape" in res.describe()
