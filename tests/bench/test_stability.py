"""bench under a changing load (issue 31 item 10): each backend's child also times the baseline in the same
rounds; a baseline that moved against its own child's time is measured again, and a cell still moved, or whose
rounds spread too much, is NOISY: shown, never stored. The children are faked at their seam
(``run_in_child``) with planned timings: no wall clock, no subprocess."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from attnforge._system.isolate import ChildOutcome
from attnforge.bench import isolated
from attnforge.bench.grid import cpu_grid
from attnforge.bench.isolated import PairedCell, bench_in_children
from attnforge.bench.records import to_records
from attnforge.bench.run import BenchCell, CellStatus
from attnforge.bench.stability import MAX_ROUND_NOISE, drifted, judged
from attnforge.bench.timing import TimerMethod, Timing, TimingConfig
from attnforge.verify.device import current_device
from attnforge.verify.isolated import Isolation

CPU = current_device("cpu")
SHAPES = [s for s in cpu_grid(dtype="float32") if s.seqlen_q == 64 and s.head_dim == 32][:2]
FAST = TimingConfig(warmup_ms=1.0, rep_ms=3.0, min_reps=2, max_reps=5, method=TimerMethod.PERF_COUNTER)


def cell(backend: str, *rounds_ms: float) -> BenchCell:
    """An OK cell whose rounds had these medians."""
    mid = sorted(rounds_ms)[len(rounds_ms) // 2]
    timing = Timing(median_ms=mid, min_ms=min(rounds_ms), p20_ms=mid, p80_ms=mid, reps=10, warmup_calls=2,
                    first_call_s=0.01, input_sets=2, method=TimerMethod.PERF_COUNTER, rounds_ms=rounds_ms)
    return BenchCell(backend=backend, status=CellStatus.OK, ms=mid, tflops=1.0 / mid, timing=timing)


class PlannedChildren:
    """Stands in for ``run_in_child``: each call pops the next planned list of paired cells (one per shape the
    job asks for) and records which backend and how many shapes it was asked for."""

    def __init__(self, plans: list[list[PairedCell]]) -> None:
        self.plans: Iterator[list[PairedCell]] = iter(plans)
        self.calls: list[tuple[str, str | None, int]] = []

    def __call__(self, target: str, job: Any, **_kw: Any) -> ChildOutcome:
        self.calls.append((job.name, job.baseline, len(job.shapes)))
        items = next(self.plans)
        assert len(items) == len(job.shapes)
        return ChildOutcome(items=tuple(items), current=None, failure=None)


def bench(monkeypatch: pytest.MonkeyPatch, plans: list[list[PairedCell]]) -> tuple[Any, PlannedChildren]:
    children = PlannedChildren(plans)
    monkeypatch.setattr(isolated, "run_in_child", children)
    got = bench_in_children(SHAPES, adapters={"sdpa": object(), "x": object()}, baseline="sdpa", device=CPU,
                            timing=FAST, isolation=Isolation(timeout_s=60), runner=object(),  # type: ignore[arg-type]
                            environ={})
    return got.report, children


def test_each_backend_is_paired_with_the_baseline_and_its_ratio_comes_from_the_pair(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    report, children = bench(monkeypatch, [
        [PairedCell(cell=cell("sdpa", 1.0, 1.01, 0.99))] * 2,  # the baseline's own child
        [PairedCell(cell=cell("x", 0.5, 0.51, 0.49), baseline=cell("sdpa", 1.2, 1.21, 1.19))] * 2,  # 20 %: load
    ])
    assert children.calls == [("sdpa", None, 2), ("x", "sdpa", 2)]  # the baseline first, then paired
    for row in report.rows:
        assert row.cell("x").status is CellStatus.OK  # type: ignore[union-attr]
        assert row.cell("x").ratio_to_baseline == pytest.approx(1.2 / 0.5)  # type: ignore[union-attr]
        assert row.cell("sdpa").ratio_to_baseline == pytest.approx(1.0)  # type: ignore[union-attr]
    assert len(to_records(report)) == 4


def test_a_load_change_between_children_is_measured_again_and_the_steady_retry_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    report, children = bench(monkeypatch, [
        [PairedCell(cell=cell("sdpa", 3.0, 3.1, 2.9))] * 2,  # the baseline measured under load: 3 ms
        [PairedCell(cell=cell("x", 0.05, 0.05, 0.05), baseline=cell("sdpa", 1.0, 1.0, 1.0)),  # quiet now: 3x
         PairedCell(cell=cell("x", 0.9, 0.9, 0.9), baseline=cell("sdpa", 2.9, 2.9, 2.9))],
        [PairedCell(cell=cell("x", 0.8, 0.8, 0.8), baseline=cell("sdpa", 3.0, 3.0, 3.0))],  # the load is back
    ])
    assert children.calls == [("sdpa", None, 2), ("x", "sdpa", 2), ("x", "sdpa", 1)]  # only the moved shape
    first, second = (row.cell("x") for row in report.rows)
    assert first is not None and second is not None
    assert first.status is CellStatus.OK and first.ms == 0.8  # the retry's, not the 0.05 ms of the quiet spell
    assert second.status is CellStatus.OK and second.ratio_to_baseline == pytest.approx(2.9 / 0.9)


def test_a_load_that_keeps_moving_is_refused_and_said_so(monkeypatch: pytest.MonkeyPatch) -> None:
    moved = [PairedCell(cell=cell("x", 0.05, 0.05, 0.05), baseline=cell("sdpa", 1.0, 1.0, 1.0))]
    report, children = bench(monkeypatch, [
        [PairedCell(cell=cell("sdpa", 3.0, 3.0, 3.0))] * 2,
        moved * 2,
        moved * 2,  # measured again: still 3x off
    ])
    assert len(children.calls) == 3
    for row in report.rows:
        x = row.cell("x")
        assert x is not None and x.status is CellStatus.NOISY
        assert "not stored: the load changed between children" in x.detail and "0.33x" in x.detail
        assert row.best == "sdpa"  # a noisy cell never wins
    assert {r.backend for r in to_records(report)} == {"sdpa"}


def test_noisy_rounds_are_refused_even_in_the_baselines_own_child(monkeypatch: pytest.MonkeyPatch) -> None:
    report, _ = bench(monkeypatch, [
        [PairedCell(cell=cell("sdpa", 1.0, 2.0, 0.25))] * 2,  # MAD 0.75 ms of 1.0: 75 %
        [PairedCell(cell=cell("x", 0.5, 0.5, 0.5), baseline=cell("sdpa", 1.0, 1.0, 1.0))] * 2,
    ])
    for row in report.rows:
        base, x = row.cell("sdpa"), row.cell("x")
        assert base is not None and base.status is CellStatus.NOISY and "±75%" in base.detail
        assert x is not None and x.status is CellStatus.OK and x.ratio_to_baseline == pytest.approx(2.0)
    assert {r.backend for r in to_records(report)} == {"x"}


def test_the_bounds() -> None:
    ref = cell("sdpa", 1.0, 1.0, 1.0)
    assert not drifted(cell("sdpa", 1.4, 1.4, 1.4), ref)
    assert drifted(cell("sdpa", 1.6, 1.6, 1.6), ref) and drifted(cell("sdpa", 0.6, 0.6, 0.6), ref)
    assert not drifted(None, ref) and not drifted(ref, None)
    noisy_ref = cell("sdpa", 1.0, 1.3, 0.7)  # 30 % noise: the bound widens to 3x the combined noise
    assert not drifted(cell("sdpa", 1.8, 1.8, 1.8), noisy_ref)
    just = cell("x", 1.0, 1.0 + MAX_ROUND_NOISE, 1.0 - MAX_ROUND_NOISE)
    assert judged(just, paired=None, reference=None, baseline="sdpa").status is CellStatus.OK
    error = BenchCell(backend="x", status=CellStatus.ERROR, detail="boom")
    assert judged(error, paired=None, reference=ref, baseline="sdpa") is error


def test_a_noisy_cell_validates_against_the_shipped_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    import jsonschema

    from attnforge.bench.report import load_schema, report_json

    moved = [PairedCell(cell=cell("x", 0.05, 0.05, 0.05), baseline=cell("sdpa", 1.0, 1.0, 1.0))]
    report, _ = bench(monkeypatch, [[PairedCell(cell=cell("sdpa", 3.0, 3.0, 3.0))] * 2, moved * 2, moved * 2])
    doc = {"schema_version": 1, "kind": "bench", **report_json(report)}  # the envelope emit_json adds
    jsonschema.validate(doc, load_schema())
    assert {c["status"] for row in doc["rows"] for c in row["cells"]} == {"ok", "noisy"}


def test_the_cli_says_which_cells_are_noisy_and_stores_only_the_steady_ones(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], attnforge_home: Any
) -> None:
    from attnforge.cli import main
    from attnforge.records import RecordStore

    moved = [PairedCell(cell=cell("sdpa-math", 0.05, 0.05, 0.05), baseline=cell("sdpa", 1.0, 1.0, 1.0))]
    children = PlannedChildren([[PairedCell(cell=cell("sdpa", 3.0, 3.0, 3.0))], moved, moved])
    monkeypatch.setattr(isolated, "run_in_child", children)
    argv = ["bench", "sdpa-math", "--device", "cpu", "--head-dim", "32", "--seqlen", "64", "--mode", "fwd",
            "--causal", "on"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    flat = " ".join(out.split())
    assert "noisy sdpa-math fwd causal" in flat and "not stored: the load changed between children" in flat
    assert "stored 1 result(s)" in flat
    assert "1 too noisy to store" in err  # the per-backend line (not a terminal)
    stored = RecordStore(attnforge_home).bench_records(CPU.key)
    assert [r.backend for r in stored] == ["sdpa"]
