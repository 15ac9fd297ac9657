"""Bench records as the dispatcher reads them: every measured shape class is found and ordered by the one rule."""

from __future__ import annotations

from pathlib import Path

from attnforge.backends.registry import adapters, fallback
from attnforge.bench.grid import cpu_grid, to_call
from attnforge.bench.records import to_records
from attnforge.bench.run import run_bench
from attnforge.bench.timing import TimerMethod, TimingConfig
from attnforge.dispatch.policy import class_of_call, decide, measurements
from attnforge.records import RecordStore, VerifyRecord
from attnforge.verify.device import current_device

FAST = TimingConfig(warmup_ms=1.0, rep_ms=3.0, min_reps=2, max_reps=5, method=TimerMethod.PERF_COUNTER)


def test_the_dispatcher_orders_by_what_bench_stored(tmp_path: Path) -> None:
    cpu = current_device("cpu")
    registry = adapters()
    benched = {"sdpa": fallback(), "sdpa-math": registry["sdpa-math"], "flex": registry["flex"]}
    shapes = [s for s in cpu_grid(dtype="float32") if s.seqlen_q == 64 and s.head_dim == 32 and not s.causal]
    report = run_bench(shapes, adapters={k: benched[k] for k in ("sdpa", "sdpa-math")}, baseline="sdpa",
                       device=cpu, timing=FAST)
    store = RecordStore(tmp_path)
    store.add_bench(to_records(report))
    for name in ("sdpa-math", "flex"):
        store.add_verify(VerifyRecord(device_key=cpu.key, backend=name, backend_version=None, ok=True,
                                      summary="ok"))
    records = store.bench_records(cpu.key)
    for row in report.rows:
        call = to_call(row.shape, device_type="cpu", compute_capability=None)
        assert class_of_call(call) == row.shape.shape_class  # one class for bench and dispatch
        measured = measurements(records, class_of_call(call))
        assert set(measured) == {"sdpa", "sdpa-math"}  # every stored cell is found for its class
        decision = decide(call, {"sdpa-math": registry["sdpa-math"], "flex": registry["flex"]},
                          priorities={"sdpa-math": 90, "flex": 50}, verified=store.latest_verify(cpu.key),
                          measured=measured, broken={})
        assert decision.ranking is not None
        assert decision.order[0] == decision.ranking.winner == row.best  # bench's best is the dispatcher's choice
        if "flex" in decision.order:  # unmeasured: after every measured backend
            assert decision.order.index("flex") > max(decision.order.index(n) for n in measured)
        else:  # fwd+bwd on a CPU: flex has no CPU backward (runtime.toml), so it is rejected with that reason
            assert [r.backend for r in decision.rejected] == ["flex"] and "backward" in decision.rejected[0].reasons[0]
