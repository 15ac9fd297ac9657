"""nvcc arch flags from compute capabilities; sccache stats parsing on real recorded outputs."""

from __future__ import annotations

import pytest

from attnforge.build.archs import gencode_flags
from attnforge.build.sccache import SccacheStats, difference, parse_stats
from tests._fakes import recorded


@pytest.mark.parametrize(
    ("archs", "expected"),
    [
        pytest.param(
            ((9, 0),),
            ("-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90"),
            id="one",
        ),
        pytest.param(
            ((12, 0), (8, 0), (12, 0)),
            (
                "-gencode=arch=compute_80,code=sm_80",
                "-gencode=arch=compute_120,code=sm_120",
                "-gencode=arch=compute_120,code=compute_120",
            ),
            id="sorted-deduplicated-ptx-for-highest",
        ),
    ],
)
def test_gencode_flags(archs: tuple[tuple[int, int], ...], expected: tuple[str, ...]) -> None:
    assert gencode_flags(archs) == expected


def test_gencode_without_archs_is_an_error() -> None:
    with pytest.raises(ValueError, match="no target"):
        gencode_flags(())


def test_parse_real_sccache_stats() -> None:
    assert parse_stats(recorded("sccache_0.16.0_stats_fresh.json")) == SccacheStats(
        compile_requests=0, hits=0, misses=0
    )
    assert parse_stats(recorded("sccache_0.16.0_stats_after.json")) == SccacheStats(
        compile_requests=2, hits=1, misses=1
    )


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("{}", id="no-stats"),
        pytest.param('{"stats": {"compile_requests": "x"}}', id="bad-field"),
    ],
)
def test_unparseable_stats_are_none(text: str) -> None:
    assert parse_stats(text) is None


def test_difference_handles_a_restarted_server() -> None:
    before = SccacheStats(compile_requests=10, hits=4, misses=6)
    after = SccacheStats(compile_requests=3, hits=1, misses=2)
    assert difference(before, after) == after
    assert difference(after, before) == SccacheStats(compile_requests=7, hits=3, misses=4)
    assert difference(before, None) is None
