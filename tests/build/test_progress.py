"""Ninja progress parsing on a real 73-step FlashAttention-2 build log, and the ETA estimate."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnforge.build.progress import EtaEstimator, parse_step
from tests.build._helpers import FA_LOG


def _steps() -> list:  # type: ignore[type-arg]
    lines = FA_LOG.read_text(encoding="utf-8").splitlines()
    return [s for s in map(parse_step, lines) if s is not None]


def test_real_flash_attn_log_has_73_ordered_steps_each_naming_its_source() -> None:
    steps = _steps()
    assert [s.done for s in steps] == list(range(1, 74))
    assert {s.total for s in steps} == {73}
    files = [s.file for s in steps]
    assert all(f is not None and f.endswith((".cu", ".cpp")) for f in files)
    assert len(set(files)) == 73, "every step compiles a different file"
    assert files[0] is not None
    assert files[0].endswith("csrc/flash_attn/flash_api.cpp")
    assert steps[-1].fraction == 1.0


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param("[3/10] c++ -c /s/a.cpp -o /b/a.o", (3, 10, "/s/a.cpp"), id="plain"),
        pytest.param("      [3/10] nvcc -c /s/k.cu -o /b/k.o", (3, 10, "/s/k.cu"), id="indented-by-pip"),
        pytest.param("[1/2] c++ -shared /b/a.o -o /b/_C.so", (1, 2, "/b/_C.so"), id="link-names-its-output"),
        pytest.param("[2/2] STAMP done", (2, 2, None), id="no-file"),
        pytest.param("[4/3] c++ -c a.cpp", None, id="done-above-total"),
        pytest.param("[0/0] nothing", None, id="zero-total"),
        pytest.param("building 'x' extension", None, id="not-a-step"),
        pytest.param("x [3/10] c++ -c a.cpp", None, id="not-at-line-start"),
        pytest.param("[1/1] c++ -c 'unbalanced.cpp", (1, 1, "unbalanced.cpp"), id="unbalanced-quote"),
    ],
)
def test_parse_step(line: str, expected: tuple[int, int, str | None] | None) -> None:
    step = parse_step(line)
    if expected is None:
        assert step is None
    else:
        assert step is not None
        assert (step.done, step.total, step.file) == expected


@given(total=st.integers(2, 500), seconds_per_step=st.floats(0.01, 600), first=st.integers(1, 5))
def test_eta_at_a_constant_rate_is_the_remaining_steps_times_the_rate(
    total: int, seconds_per_step: float, first: int
) -> None:
    first = min(first, total - 1)
    eta = EtaEstimator()
    assert eta.update(100.0, first, total) is None, "one step gives no rate"
    for done in range(first + 1, total + 1):
        estimate = eta.update(100.0 + (done - first) * seconds_per_step, done, total)
        assert estimate == pytest.approx((total - done) * seconds_per_step, rel=1e-6, abs=1e-6)


def test_eta_restarts_when_a_second_ninja_run_begins() -> None:
    eta = EtaEstimator()
    eta.update(0.0, 1, 4)
    assert eta.update(10.0, 4, 4) == 0.0
    assert eta.update(11.0, 1, 8) is None, "a new [1/8] series is a new build"
    assert eta.update(13.0, 2, 8) == pytest.approx(12.0)
