"""run_bench on CPU: one harness for every backend, skips and errors as cells, ratios, records, fastest."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from attnforge.backends.registry import adapters, fallback
from attnforge.bench.flops import tflops
from attnforge.bench.grid import cpu_grid, model_shapes
from attnforge.bench.records import to_records
from attnforge.bench.run import CellStatus, random_inputs, run_bench, set_bytes
from attnforge.bench.timing import CPU_PERF_COUNTER, TimerMethod, TimingConfig
from attnforge.ranking import fastest
from attnforge.records import RecordStore
from attnforge.types.shapes import AttentionShape, Mode
from attnforge.verify.device import current_device
from tests.verify.adapters import RaisingAdapter, SdpaMathAdapter

CPU = current_device("cpu")
FAST = TimingConfig(warmup_ms=1.0, rep_ms=3.0, min_reps=2, max_reps=5, method=TimerMethod.PERF_COUNTER)


@dataclasses.dataclass
class InputSpy(SdpaMathAdapter):
    """Records the inputs it was called with."""

    name: str = "spy"
    seen: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
        self.seen.append((q, k, v))
        return super().__call__(q, k, v, causal=causal, scale=scale)


def _shapes() -> list[AttentionShape]:
    return [s for s in cpu_grid(dtype="float32") if s.seqlen_q == 64 and s.head_dim == 32]


def test_every_backend_goes_through_the_same_inputs_and_harness() -> None:
    spy = InputSpy()
    benched = {"sdpa": fallback(), "sdpa-math": adapters()["sdpa-math"], "spy": spy}
    report = run_bench(_shapes(), adapters=benched, baseline="sdpa", device=CPU, timing=FAST)
    assert len(report.rows) == 4  # fwd/fwd+bwd x causal on/off
    for row in report.rows:
        assert [c.backend for c in row.cells] == ["sdpa", "sdpa-math", "spy"]
        for cell in row.cells:
            assert cell.status is CellStatus.OK, cell.detail
            assert cell.timing is not None
            assert cell.timing.method is TimerMethod.PERF_COUNTER
            assert cell.timing.input_sets == 2
            assert cell.ms is not None
            assert cell.tflops == pytest.approx(tflops(row.flops, cell.ms))
        assert row.cell("sdpa").ratio_to_baseline == pytest.approx(1.0)  # type: ignore[union-attr]
        assert row.best in {"sdpa", "sdpa-math", "spy"}
    # fresh random inputs, never zeros, two distinct sets rotated
    distinct = {id(q) for q, _, _ in spy.seen}
    assert len(distinct) >= 2
    for q, k, v in spy.seen:
        for t in (q.detach(), k.detach(), v.detach()):
            # standard normal, not zero-filled: CPU randn can draw an exact 0.0 (about 1 in 10^7 elements)
            assert float((t == 0).float().mean()) < 1e-4
            assert float(t.std()) > 0.5


def test_unsupported_shapes_are_skipped_and_errors_are_cells() -> None:
    picky = SdpaMathAdapter(name="picky", dtypes=("bfloat16",))
    broken = RaisingAdapter()
    report = run_bench(_shapes()[:1], adapters={"sdpa": fallback(), "picky": picky, "raising": broken},
                       baseline="sdpa", device=CPU, timing=FAST)
    [row] = report.rows
    assert row.cell("picky").status is CellStatus.SKIPPED  # type: ignore[union-attr]
    assert "float32 not supported" in row.cell("picky").detail  # type: ignore[union-attr]
    err = row.cell("raising")
    assert err is not None
    assert err.status is CellStatus.ERROR
    assert "no kernel image" in err.detail
    assert err.ms is None
    assert row.best == "sdpa"


def test_backward_inputs_require_grad_and_carry_an_output_gradient() -> None:
    [shape] = model_shapes(batch=1, heads_q=4, heads_kv=2, head_dims=(16,), seqlens=(8,), seqlen_k=12,
                           dtype="float32", causals=(True,), modes=(Mode.FWD_BWD,))
    sets = random_inputs(shape, 3, "cpu")
    assert len(sets) == 3
    q, k, v, dout = sets[0]
    assert q.shape == (1, 4, 8, 16)
    assert k.shape == v.shape == (1, 2, 12, 16)
    assert dout.shape == q.shape
    assert all(t.requires_grad for t in (q, k, v))
    assert not torch.equal(sets[0][0], sets[1][0])
    assert set_bytes(shape) == 4 * (2 * 4 * 8 * 16 + 2 * 2 * 12 * 16)  # float32 q, dout, k, v


def test_records_round_trip_and_answer_which_backend_is_fastest(tmp_path: Path) -> None:
    report = run_bench(_shapes(), adapters={"sdpa": fallback(), "sdpa-math": adapters()["sdpa-math"]},
                       baseline="sdpa", device=CPU, timing=CPU_PERF_COUNTER,
                       versions={"sdpa": "2.13.0", "sdpa-math": "2.13.0"}, verified=["sdpa-math"])
    store = RecordStore(tmp_path)
    records = to_records(report)
    store.add_bench(records)
    back = store.bench_records(CPU.key)
    assert len(back) == len(records) == 8
    assert {r.run_id for r in back} == {report.run_id}
    assert {r.backend_version for r in back} == {"2.13.0"}
    for row in report.rows:
        cls = row.shape.shape_class
        assert fastest(back, cls).winner == row.best
        assert fastest(back, cls, among={"sdpa-math"}).winner == "sdpa-math"


def test_fwd_bwd_inputs_of_an_mla_shape_give_dout_the_outputs_shape() -> None:
    """Dv != D (DeepSeek-V2/V3's MLA): dout had q's shape, so every fwd+bwd cell of such a model failed in
    autograd ("Mismatch in shape: grad_output[0]"), in bench, warmup and ``attnforge warmup --model``."""
    from attnforge.bench.run import random_inputs
    from attnforge.dispatch.warmup import warmup
    from attnforge.types.shapes import AttentionShape, Mode

    shape = AttentionShape(batch=1, heads_q=4, heads_kv=4, seqlen_q=8, seqlen_k=8, head_dim=12, head_dim_v=6,
                           causal=True, mode=Mode.FWD_BWD, dtype="float32")
    (q, _k, v, dout), = random_inputs(shape, 1, "cpu")
    assert dout.shape == (*q.shape[:3], v.shape[-1])
    report = warmup([shape], device="cpu", budget_s=0.01, rounds=1)
    assert [c.error for c in report.classes] == [""] and report.classes[0].chosen
