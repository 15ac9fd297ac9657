"""Bench measures a quantized backend's error on the real shape; old records.db files gain the new columns and
keep their column names (``heads``/``kv_heads`` hold :class:`Dims`' ``heads_q``/``heads_kv``)."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import torch

from attnforge.backends.adapter import AttentionCall
from attnforge.backends.registry import fallback
from attnforge.bench.records import to_records
from attnforge.bench.run import CellStatus, run_bench
from attnforge.bench.timing import TimerMethod, TimingConfig
from attnforge.ranking import OutputError, fastest
from attnforge.records import BenchRecord, RecordStore
from attnforge.types.shapes import AttentionShape, Mode
from attnforge.verify.device import current_device

CPU = current_device("cpu")
FAST = TimingConfig(warmup_ms=1.0, rep_ms=3.0, min_reps=2, max_reps=4, method=TimerMethod.PERF_COUNTER, rounds=2)
SHAPE = AttentionShape(batch=1, heads_q=4, heads_kv=2, head_dim=16, seqlen_q=32, seqlen_k=64, causal=True,
                       mode=Mode.FWD, dtype="float32")


class Rounded:
    """SDPA on inputs rounded to ``step``: a stand-in for a quantized kernel with a known, shape-dependent error."""

    def __init__(self, name: str, step: float) -> None:
        self.name, self.step = name, step

    def load_error(self) -> str | None:
        return None

    def unsupported_reasons(self, call: AttentionCall) -> list[str]:
        return []

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
        r = [torch.round(t / self.step) * self.step for t in (q, k, v)]
        return fallback()(*r, causal=causal, scale=scale)


@pytest.mark.parametrize(("step", "accurate"), [
    pytest.param(1e-3, True, id="fine-quantization-passes-the-gate"),
    pytest.param(0.5, False, id="coarse-quantization-fails-the-gate"),
])
def test_quantized_cells_carry_rel_l1_and_cosine_into_the_records(step: float, accurate: bool) -> None:
    report = run_bench([SHAPE], adapters={"sdpa": fallback(), "q8": Rounded("q8", step)}, baseline="sdpa",
                       device=CPU, timing=FAST, quantized=["q8"])
    [row] = report.rows
    cell, base = row.cell("q8"), row.cell("sdpa")
    assert cell is not None and base is not None and cell.status is CellStatus.OK
    assert cell.error is not None
    assert base.error is None  # exact backends are not error-checked by bench
    assert (cell.error.rel_l1 <= 0.05 and cell.error.cosine >= 0.999) is accurate
    [stored] = [r for r in to_records(report) if r.backend == "q8"]
    assert OutputError(stored.rel_l1, stored.cosine) == cell.error
    m = fastest(to_records(report), SHAPE.shape_class).measurements["q8"]
    assert m.error == cell.error


_OLD_SCHEMA = """
CREATE TABLE bench (id INTEGER PRIMARY KEY AUTOINCREMENT, device_key TEXT NOT NULL, backend TEXT NOT NULL,
  backend_version TEXT, dtype TEXT NOT NULL, mode TEXT NOT NULL, causal INTEGER NOT NULL, batch INTEGER NOT NULL,
  heads INTEGER NOT NULL, kv_heads INTEGER NOT NULL, head_dim INTEGER NOT NULL, seqlen_q INTEGER NOT NULL,
  seqlen_k INTEGER NOT NULL, ms REAL NOT NULL, tflops REAL NOT NULL, peak_mem_bytes INTEGER, run_id TEXT NOT NULL,
  created_at TEXT NOT NULL);
INSERT INTO bench (device_key, backend, backend_version, dtype, mode, causal, batch, heads, kv_heads, head_dim,
  seqlen_q, seqlen_k, ms, tflops, peak_mem_bytes, run_id, created_at)
  VALUES ('k', 'sdpa-cudnn', NULL, 'bfloat16', 'fwd', 0, 16, 16, 16, 128, 1024, 1024, 0.5, 574.1, NULL, 'r0', 'x');
"""


def test_a_records_db_from_before_rounds_is_read_and_extended(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "records.db")
    conn.executescript(_OLD_SCHEMA)
    conn.close()
    store = RecordStore(tmp_path)
    [old] = store.bench_records("k")
    assert (old.backend, old.tflops, old.ms_lo, old.features, old.head_dim_v) == ("sdpa-cudnn", 574.1, None, "", None)
    assert old.layout == "bhsd" and old.shape.layout.value == "bhsd"  # stored before layouts were: contiguous bhsd
    new = BenchRecord(device_key="k", backend="sdpa", backend_version=None, dtype="bfloat16", mode="fwd",
                      causal=False, batch=16, heads_q=16, heads_kv=16, head_dim=128, seqlen_q=1024, seqlen_k=1024,
                      ms=0.5, tflops=580.0, peak_mem_bytes=None, run_id="r1", ms_lo=0.49, ms_hi=0.51,
                      features="window", head_dim_v=64, layout="bshd")
    store.add_bench([new])
    back = store.bench_records("k")
    assert back[-1] == dataclasses.replace(new, created_at=back[-1].created_at)
    assert back[-1].shape.layout.value == "bshd"
    assert back[-1].shape.shape_class != old.shape.shape_class  # features and Dv are part of the class


#: the columns an attnforge from before issue 23 selects (its fields were named as its columns)
_OLD_READER_COLUMNS = ("device_key", "backend", "dtype", "mode", "causal", "batch", "heads", "kv_heads", "head_dim",
                       "seqlen_q", "seqlen_k", "ms", "tflops", "run_id")


def test_the_head_counts_keep_their_columns_both_ways(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "records.db")
    conn.executescript(_OLD_SCHEMA.replace("16, 16, 16, 128", "2, 32, 8, 128"))  # B2 Hq32 Hkv8: GQA, not symmetric
    conn.close()
    store = RecordStore(tmp_path)
    [old] = store.bench_records("k")
    assert (old.batch, old.heads_q, old.heads_kv) == (2, 32, 8)
    assert (old.shape.heads_q, old.shape.heads_kv, old.shape.shape_class.gqa_ratio) == (32, 8, 4)
    new = dataclasses.replace(old, backend="sdpa", heads_q=12, heads_kv=3, run_id="r1")
    store.add_bench([new])
    conn = sqlite3.connect(tmp_path / "records.db")  # an old reader: the old column names, raw SQL
    try:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(bench)")]
        rows = conn.execute(f"SELECT {', '.join(_OLD_READER_COLUMNS)} FROM bench ORDER BY id").fetchall()  # noqa: S608 - constants
    finally:
        conn.close()
    assert {"heads", "kv_heads"} <= set(columns)
    assert not {"heads_q", "heads_kv"} & set(columns)
    read = [dict(zip(_OLD_READER_COLUMNS, row, strict=True)) for row in rows]
    assert [(r["backend"], r["heads"], r["kv_heads"]) for r in read] == [("sdpa-cudnn", 32, 8), ("sdpa", 12, 3)]
