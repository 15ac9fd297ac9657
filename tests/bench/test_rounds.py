"""Interleaved rounds and honest ties, with a fake clock at the timing seam (no timing assertions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnforge.backends.adapter import AttentionCall
from attnforge.bench.records import to_records
from attnforge.bench.run import run_bench
from attnforge.bench.timing import TimerMethod, TimingConfig, round_order
from attnforge.ranking import fastest
from attnforge.types.shapes import AttentionShape, Mode
from attnforge.verify.device import current_device
from tests._fakes import FakeClock

CPU = current_device("cpu")
ROUNDS = TimingConfig(warmup_ms=1.0, rep_ms=30.0, min_reps=3, max_reps=5, method=TimerMethod.PERF_COUNTER,
                      rounds=3)
SHAPE = AttentionShape(batch=1, heads_q=2, heads_kv=2, head_dim=8, seqlen_q=4, seqlen_k=4, causal=False,
                       mode=Mode.FWD, dtype="float32")


@dataclass
class CostAdapter:
    """Advances the fake clock by ``cost_ms[round]`` per call; ``log`` holds one entry per measurement (round)."""

    name: str
    clock: FakeClock
    cost_ms: tuple[float, ...]
    log: list[str]
    calls: list[int] = field(default_factory=list)

    def load_error(self) -> str | None:
        return None

    def unsupported_reasons(self, call: AttentionCall) -> list[str]:
        return []

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
        rnd = self.log.count(self.name) - 1
        self.clock.now += self.cost_ms[min(rnd, len(self.cost_ms) - 1)] / 1e3
        return q


def _inputs(shape: AttentionShape, sets: int, device: str) -> list[tuple[Any, ...]]:
    return [(torch.ones(1), torch.ones(1), torch.ones(1), None) for _ in range(sets)]


def _run(costs: dict[str, tuple[float, ...]]) -> tuple[Any, list[str]]:
    clock, log = FakeClock(), []
    adapters = {n: CostAdapter(name=n, clock=clock, cost_ms=c, log=log) for n, c in costs.items()}
    report = run_bench([SHAPE], adapters=adapters, baseline="sdpa", device=CPU, timing=ROUNDS,
                       make_inputs=_inputs, clock=clock, progress=lambda _shape, name: log.append(name))
    return report, log


def test_rounds_interleave_backends_and_keep_each_rounds_median() -> None:
    report, log = _run({"sdpa": (1.0, 1.1, 0.9), "sdpa-cudnn": (2.0, 2.0, 2.0), "flash-attn": (3.0, 3.0, 3.0)})
    assert log == ["sdpa", "sdpa-cudnn", "flash-attn", "sdpa-cudnn", "flash-attn", "sdpa", "flash-attn", "sdpa",
                   "sdpa-cudnn"]  # every backend once per round, the order rotated
    [row] = report.rows
    cell = row.cell("sdpa")
    assert cell is not None and cell.timing is not None
    assert cell.timing.rounds_ms == pytest.approx((1.0, 1.1, 0.9))
    assert (cell.timing.lo_ms, cell.ms, cell.timing.hi_ms) == pytest.approx((0.9, 1.0, 1.1))
    assert row.best == "sdpa"


@pytest.mark.parametrize(("costs", "best", "tied"), [
    pytest.param({"sdpa": (1.00, 1.02, 0.98), "sdpa-cudnn": (0.995, 1.01, 0.985)}, "sdpa", {"sdpa", "sdpa-cudnn"},
                 id="forced-cudnn-within-the-spread-is-a-tie-plain-sdpa-wins"),
    pytest.param({"sdpa": (1.00, 1.01, 0.99), "sdpa-cudnn": (0.80, 0.81, 0.79)}, "sdpa-cudnn", {"sdpa-cudnn"},
                 id="faster-beyond-the-spread-wins"),
    pytest.param({"sdpa": (1.0, 1.3, 0.7), "flex": (0.8, 1.1, 0.6)}, "sdpa", {"sdpa", "flex"},
                 id="noisy-cpu-keeps-plain-sdpa"),
])
def test_ties_within_the_spread_go_to_plain_sdpa_and_records_agree(costs: dict[str, tuple[float, ...]],
                                                                   best: str, tied: set[str]) -> None:
    report, _ = _run(costs)
    [row] = report.rows
    assert row.best == best
    assert set(row.ranking.tied) == tied
    assert fastest(to_records(report), SHAPE.shape_class).winner == best  # the stored spread gives the same answer


@given(n=st.integers(min_value=1, max_value=24), rounds=st.integers(min_value=1, max_value=15))
def test_round_order_times_every_candidate_once_a_round(n: int, rounds: int) -> None:
    names = [f"b{i}" for i in range(n)]
    for r in range(rounds):
        assert sorted(round_order(names, r, rounds)) == sorted(names)


def test_round_order_spreads_a_long_list_over_early_middle_and_late_places() -> None:
    # the GPU check's fourteen candidates in three rounds: attention() is listed tenth (index 10)
    names = [f"b{i}" for i in range(14)]
    places = [round_order(names, r, 3).index("b10") for r in range(3)]
    assert min(places) <= 4 and max(places) >= 9  # one place a round gave 10, 9, 8: always late
    # a short list alternates as before (bench's and first use's few candidates)
    assert [round_order(["a", "b"], r, 3) for r in range(3)] == [["a", "b"], ["b", "a"], ["a", "b"]]
    assert round_order([], 0, 3) == []
