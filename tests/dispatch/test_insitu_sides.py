"""An in-situ revert supersedes only its own side's records: an exact route's revert leaves a quantized kernel's.

Replays the H200's records of the 16k forward class (2026-12-02, docs/benchmarks.md "thirty-ninth session";
tests/fixtures/gpu/h200_16k_insitu_records.json): first use timed FlashAttention-3 4.61 ms, SDPA 5.09 and, for the
``allow_quantized`` class, SageAttention 2 4.40 against FA3 4.53 and SDPA 5.06; then the in-situ check timed FA3 4.49
against SDPA 5.04 and reverted it. Every older record was superseded, SageAttention's too, so the ``allow_quantized``
calls ran SDPA: 0.97x of SDPA where SageAttention alone had run 1.18x.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from attnforge.dispatch.policy import measurements
from attnforge.ranking import class_measurements, fastest
from attnforge.records import BenchRecord

FIXTURE = Path(__file__).parents[1] / "fixtures" / "gpu" / "h200_16k_insitu_records.json"
SAGE = "sageattention-2"


def _records() -> list[BenchRecord]:
    rows = json.loads(FIXTURE.read_text(encoding="utf-8"))["rows"]
    fields = set(BenchRecord.__dataclass_fields__)
    out = []
    for raw in rows:
        row = {**raw, "heads_q": raw["heads"], "heads_kv": raw["kv_heads"], "causal": bool(raw["causal"])}
        out.append(BenchRecord(**{k: v for k, v in row.items() if k in fields}))
    return out


def test_the_fixture_holds_the_revert() -> None:
    runs = {r.run_id.split("-")[0] for r in _records()}
    assert runs == {"autotune", "insitu"}


def test_an_exact_routes_revert_leaves_the_quantized_kernels_record() -> None:
    records = _records()
    cls = records[0].shape.shape_class
    measured = class_measurements(records, cls, quantized={SAGE})
    assert set(measured) == {"flash-attn-3", "sdpa", SAGE}
    assert measured["flash-attn-3"].rounds == 3 == measured["sdpa"].rounds  # the live check's, not first use's
    assert fastest(records, cls).winner != SAGE  # without knowing which kernels quantize: every record superseded
    assert SAGE not in class_measurements(records, cls)


def test_the_quantized_class_keeps_sageattention_after_the_exact_revert() -> None:
    records = _records()
    cls = records[0].shape.shape_class
    evidence = measurements(records, cls, "bhsd", quantized={SAGE})
    assert evidence[SAGE].tflops > evidence["sdpa"].tflops * 1.1  # 4.40 against 5.04 ms


@pytest.mark.parametrize("side", ["quantized", "exact"])
def test_a_live_run_clears_its_own_side_and_sdpa(side: str) -> None:
    """A check of the quantized route (SageAttention against SDPA) supersedes the quantized records and SDPA's, and
    leaves the exact kernels' first-use records; an exact route's check the reverse."""
    records = [r for r in _records() if not r.run_id.startswith("insitu-")]
    cls = records[0].shape.shape_class
    route = SAGE if side == "quantized" else "flash-attn-3"
    live = [BenchRecord(**{**{f: getattr(r, f) for f in BenchRecord.__dataclass_fields__}, "run_id": "insitu-test",
                           "ms": r.ms * 1.5, "tflops": r.tflops / 1.5})
            for r in records if r.run_id == "autotune-729c81e5" and r.backend in (route, "sdpa")]
    measured = class_measurements([*records, *live], cls, quantized={SAGE})
    other = "flash-attn-3" if side == "quantized" else SAGE
    assert set(measured) == {route, "sdpa", other}
    assert measured[route].rounds == measured["sdpa"].rounds == live[0].rounds  # the live timings alone
    newest = [r for r in records if r.backend == other][-1]  # first use's newest record at that shape stands
    assert measured[other].tflops == pytest.approx(newest.tflops)


def test_the_dispatcher_serves_the_quantized_class_with_sageattention_after_the_revert(tmp_path: Path) -> None:
    """The whole decision (:meth:`Dispatcher._decide`) on a record store holding the H200's records: the exact class
    follows the revert (SDPA), the ``allow_quantized`` class keeps SageAttention (which quantizes: the adapter's
    capabilities say so, the dispatcher passes it on)."""
    from attnforge.backends.adapter import AttentionCall
    from attnforge.dispatch.runtime import Dispatcher
    from attnforge.records import RecordStore, VerifyRecord
    from tests.dispatch.test_policy import Adapter

    records = _records()
    key = records[0].device_key
    store = RecordStore(tmp_path / "home")
    store.add_bench(records)
    adapters = {"flash-attn-3": Adapter("flash-attn-3"), SAGE: Adapter(SAGE, quantized=True)}
    for name in adapters:
        store.add_verify(VerifyRecord(device_key=key, backend=name, backend_version=None, ok=True, summary="ok"))
    dispatcher = Dispatcher(adapters, fallback=Adapter("sdpa"), records=store)  # type: ignore[arg-type]
    call = AttentionCall(device_type="cuda", compute_capability=(9, 0), dtype="bfloat16", batch=1, heads_q=24,
                         heads_kv=24, seqlen_q=16384, seqlen_k=16384, head_dim=128, causal=False, needs_grad=False)
    assert dispatcher._decide(call, key).order[0] == "sdpa"
    quantized = dispatcher._decide(dataclasses.replace(call, precision="allow_quantized"), key)
    assert quantized.order[0] == SAGE, quantized.rejected
