"""The report's outputs: JSON valid against the shipped schema, a PNG plot, comparison with a reference."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from attnforge.backends.registry import adapters, fallback
from attnforge.bench.flops import shape_flops
from attnforge.bench.grid import cpu_grid
from attnforge.bench.plot import write_plot
from attnforge.bench.reference import compare_to_reference, load_reference
from attnforge.bench.report import load_schema, report_json, shape_from_json
from attnforge.bench.run import BenchReport, run_bench
from attnforge.bench.timing import TimerMethod, TimingConfig
from attnforge.errors import UsageError
from attnforge.verify.device import current_device
from tests.verify.adapters import RaisingAdapter, SdpaMathAdapter

FAST = TimingConfig(warmup_ms=1.0, rep_ms=3.0, min_reps=2, max_reps=5, method=TimerMethod.PERF_COUNTER)
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "h200_bench_2026-11-21.json"
#: a recorded ``bench --json`` of schema 2 (head counts ``heads``/``kv_heads``), kept byte-identical
RECORDED_V2 = Path(__file__).resolve().parents[2] / "docs" / "data" / "h200_2026-11-22" / "bench-grid.json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report() -> BenchReport:
    shapes = [s for s in cpu_grid(dtype="float32") if s.head_dim == 32]
    return run_bench(shapes, adapters={"sdpa": fallback(), "sdpa-math": adapters()["sdpa-math"],
                                       "raising": RaisingAdapter(), "bf16-only": SdpaMathAdapter(
                                           name="bf16-only", dtypes=("bfloat16",))},
                     baseline="sdpa", device=current_device("cpu"), timing=FAST)


def test_json_validates_against_the_shipped_schema(report: BenchReport) -> None:
    envelope = {"schema_version": 1, "kind": "bench", **report_json(report)}
    doc = json.loads(json.dumps(envelope, allow_nan=False))
    assert doc["schema_version"] == 3  # the bench document's own version overrides the envelope's
    jsonschema.validate(doc, load_schema(), format_checker=jsonschema.FormatChecker())
    statuses = {c["status"] for row in doc["rows"] for c in row["cells"]}
    assert statuses == {"ok", "skipped", "error"}


@pytest.mark.parametrize(("path", "value"), [
    pytest.param(("rows", 0, "cells", 0, "status"), "fast", id="unknown-status"),
    pytest.param(("rows", 0, "shape", "batch"), 0, id="zero-batch"),
    pytest.param(("device", "type"), "tpu", id="unknown-device"),
    pytest.param(("rows", 0, "cells", 0, "ms"), None, id="ok-cell-without-time"),
    pytest.param(("schema_version",), 1, id="version-1-document"),
    pytest.param(("schema_version",), 2, id="version-2-document"),
    pytest.param(("rows", 0, "shape", "features"), ["telepathy"], id="unknown-feature"),
    pytest.param(("rows", 0, "margin"), "big", id="margin-not-a-number"),
])
def test_the_schema_rejects_broken_documents(report: BenchReport, path: tuple[object, ...],
                                             value: object) -> None:
    doc = json.loads(json.dumps({"schema_version": 1, "kind": "bench", **report_json(report)}))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, load_schema())


def test_rows_read_back_into_their_shapes(report: BenchReport) -> None:
    doc = json.loads(json.dumps(report_json(report)))
    assert [shape_from_json(row["shape"]) for row in doc["rows"]] == [row.shape for row in report.rows]


def test_a_recorded_schema_2_document_reads_with_its_old_head_keys() -> None:
    doc = json.loads(RECORDED_V2.read_text(encoding="utf-8"))
    assert doc["schema_version"] == 2 and "kv_heads" in doc["rows"][0]["shape"]
    shapes = [shape_from_json(row["shape"]) for row in doc["rows"]]
    assert [str(s.shape_class) for s in shapes] == [row["shape_class"] for row in doc["rows"]]
    assert {(s.heads_q, s.heads_kv) for s in shapes} >= {(32, 8)}  # the GQA rows keep Hq and Hkv apart


@pytest.mark.parametrize("shape", [
    pytest.param({"batch": 1}, id="no-sizes"),
    pytest.param({"batch": 1, "heads": 2, "heads_q": 2}, id="both-spellings"),
])
def test_a_broken_recorded_shape_is_a_value_error(shape: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"heads|not a bench shape"):
        shape_from_json(shape)


def test_plot_is_a_non_empty_png(report: BenchReport, tmp_path: Path) -> None:
    path = write_plot(report, tmp_path / "bench.png")
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000


def test_plot_into_a_missing_directory_is_a_clear_error(report: BenchReport, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot write the plot"):
        write_plot(report, tmp_path / "no" / "such" / "dir" / "bench.png")


def test_a_run_can_be_compared_with_the_h200_reference() -> None:
    rows = load_reference(FIXTURE)
    assert {r.backend for r in rows} >= {"sdpa", "sdpa-cudnn", "flash-attn", "flash-attn-4"}
    # A synthetic "measurement" of the reference's own shapes: twice the reference's cuDNN speed.
    from attnforge.bench.run import BenchCell, BenchRow, CellStatus

    cudnn = [r for r in rows if r.source_backend == "sdpa_cudnn"]
    rows_x2 = tuple(BenchRow(shape=r.shape, flops=shape_flops(r.shape), cells=(
        BenchCell(backend="sdpa-cudnn", status=CellStatus.OK, ms=r.ms / 2, tflops=2 * r.tflops),))
        for r in cudnn)
    fake = BenchReport(run_id="x", created_at="", device=current_device("cpu"), baseline="sdpa", backends=(),
                       timing=FAST, rows=rows_x2)
    agreement = compare_to_reference(fake, cudnn)
    assert len(agreement) == len(cudnn) == 12
    assert all(a.ratio == pytest.approx(2.0) for a in agreement)
    assert compare_to_reference(fake, [r for r in rows if r.backend == "flash-attn"]) == []
