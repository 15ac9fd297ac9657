"""Verification and benchmark records: what ``verify`` proved and ``bench`` measured on this machine.

``verify`` and ``bench`` write them; ``doctor`` and the dispatcher read them. They live in SQLite (WAL) at
``$ATTNFORGE_HOME/records.db``, keyed by a *device key* so results from one GPU/torch never steer another.
"""

from __future__ import annotations

import datetime as _dt
import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The one device-key constructor lives with the value types; re-exported for the runtime, verify and bench.
from attnforge.types.device import device_key as device_key  # noqa: PLC0414

_SCHEMA = """
CREATE TABLE IF NOT EXISTS verify (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    device_key TEXT NOT NULL,
    backend TEXT NOT NULL,
    backend_version TEXT,
    ok INTEGER NOT NULL,
    summary TEXT NOT NULL,
    details TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS verify_device ON verify(device_key, backend);
CREATE TABLE IF NOT EXISTS bench (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    device_key TEXT NOT NULL,
    backend TEXT NOT NULL,
    backend_version TEXT,
    dtype TEXT NOT NULL,
    mode TEXT NOT NULL,
    causal INTEGER NOT NULL,
    batch INTEGER NOT NULL,
    heads INTEGER NOT NULL,
    kv_heads INTEGER NOT NULL,
    head_dim INTEGER NOT NULL,
    seqlen_q INTEGER NOT NULL,
    seqlen_k INTEGER NOT NULL,
    ms REAL NOT NULL,
    tflops REAL NOT NULL,
    peak_mem_bytes INTEGER,
    run_id TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS bench_device ON bench(device_key, backend);
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyRecord:
    """The outcome of ``attnforge verify`` for one backend on one device.

    Attributes:
        summary: one line for people ("42 cases passed", "bf16 causal d=128: max abs err 0.3 > 0.02").
        details: the per-case results, JSON-ready.
    """

    device_key: str
    backend: str
    backend_version: str | None
    ok: bool
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchRecord:
    """One timed shape of one backend. ``tflops`` uses the formula documented in ``attnforge.bench``."""

    device_key: str
    backend: str
    backend_version: str | None
    dtype: str
    mode: str  # "fwd" or "fwd+bwd"
    causal: bool
    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    seqlen_q: int
    seqlen_k: int
    ms: float
    tflops: float
    peak_mem_bytes: int | None
    run_id: str
    created_at: str = ""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class RecordStore:
    """SQLite-backed store of verify and bench records under ``home``."""

    def __init__(self, home: Path) -> None:
        self.path = home / "records.db"

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=30)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)
            with conn:
                yield conn
        finally:
            conn.close()

    # -- verify -------------------------------------------------------------------------------------------
    def add_verify(self, rec: VerifyRecord) -> None:
        with self._connect() as conn:
            conn.execute(
                "INSERT INTO verify (device_key, backend, backend_version, ok, summary, details, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (rec.device_key, rec.backend, rec.backend_version, int(rec.ok), rec.summary,
                 json.dumps(rec.details), rec.created_at or _now()),
            )

    def latest_verify(self, device_key: str) -> dict[str, VerifyRecord]:
        """The newest verify record per backend for ``device_key``."""
        if not self.path.exists():
            return {}
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT device_key, backend, backend_version, ok, summary, details, created_at FROM verify"
                " WHERE device_key = ? ORDER BY id", (device_key,)).fetchall()
        out: dict[str, VerifyRecord] = {}
        for r in rows:
            out[r[1]] = VerifyRecord(device_key=r[0], backend=r[1], backend_version=r[2], ok=bool(r[3]),
                                     summary=r[4], details=json.loads(r[5]), created_at=r[6])
        return out

    # -- bench --------------------------------------------------------------------------------------------
    def add_bench(self, records: list[BenchRecord]) -> None:
        with self._connect() as conn:
            conn.executemany(
                "INSERT INTO bench (device_key, backend, backend_version, dtype, mode, causal, batch, heads,"
                " kv_heads, head_dim, seqlen_q, seqlen_k, ms, tflops, peak_mem_bytes, run_id, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(r.device_key, r.backend, r.backend_version, r.dtype, r.mode, int(r.causal), r.batch, r.heads,
                  r.kv_heads, r.head_dim, r.seqlen_q, r.seqlen_k, r.ms, r.tflops, r.peak_mem_bytes, r.run_id,
                  r.created_at or _now()) for r in records],
            )

    def bench_records(self, device_key: str) -> list[BenchRecord]:
        """All bench records for ``device_key``, oldest first (later runs override earlier ones)."""
        if not self.path.exists():
            return []
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT device_key, backend, backend_version, dtype, mode, causal, batch, heads, kv_heads,"
                " head_dim, seqlen_q, seqlen_k, ms, tflops, peak_mem_bytes, run_id, created_at FROM bench"
                " WHERE device_key = ? ORDER BY id", (device_key,)).fetchall()
        return [BenchRecord(device_key=r[0], backend=r[1], backend_version=r[2], dtype=r[3], mode=r[4],
                            causal=bool(r[5]), batch=r[6], heads=r[7], kv_heads=r[8], head_dim=r[9],
                            seqlen_q=r[10], seqlen_k=r[11], ms=r[12], tflops=r[13], peak_mem_bytes=r[14],
                            run_id=r[15], created_at=r[16]) for r in rows]
