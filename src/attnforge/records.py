"""Verification and benchmark records: what ``verify`` proved and ``bench`` measured on this machine.

``verify`` and ``bench`` write them; ``doctor`` and the dispatcher read them. They live in SQLite (WAL) at
``$ATTNFORGE_HOME/records.db``, keyed by a *device key* so results from one GPU/torch never steer another.
"""

from __future__ import annotations

import datetime as _dt
import json
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

# The one device-key constructor lives with the value types; re-exported for the runtime, verify and bench.
from attnforge.types.device import device_key as device_key  # noqa: PLC0414
from attnforge.types.shapes import AttentionShape, Dims, Feature, Mode

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
    created_at TEXT NOT NULL,
    head_dim_v INTEGER,
    features TEXT NOT NULL DEFAULT '',
    ms_lo REAL,
    ms_hi REAL,
    rel_l1 REAL,
    cosine REAL,
    ms_mad REAL
);
CREATE INDEX IF NOT EXISTS bench_device ON bench(device_key, backend);
"""
#: columns added to ``bench`` after its first release: ``records.db`` files from before get them on open
_BENCH_ADDED = (("head_dim_v", "INTEGER"), ("features", "TEXT NOT NULL DEFAULT ''"), ("ms_lo", "REAL"),
                ("ms_hi", "REAL"), ("rel_l1", "REAL"), ("cosine", "REAL"),
                ("ms_mad", "REAL"))
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
class BenchRecord(Dims):
    """One timed shape of one backend. ``tflops`` uses the formula documented in ``attnforge.bench``.

    Attributes:
        batch, heads_q, heads_kv, head_dim, seqlen_q, seqlen_k: the measured shape's sizes (:class:`Dims`);
            stored in the ``heads``/``kv_heads`` columns (:data:`_COLUMN_OF`).
        ms: the median of the rounds' medians; ``ms_lo``/``ms_hi`` the fastest and slowest round's median (the
            spread; None for records from before rounds).
        ms_mad: the median absolute deviation of the rounds' medians, ms (:attr:`attnforge.bench.timing.Timing.
            mad_ms`): the noise the "fastest" rule (:func:`attnforge.ranking.beats`) weighs; None for records
            from before it was stored (the rule then reads the noise off ``ms_lo``/``ms_hi``).
        head_dim_v: ``Dv`` when it differs from ``D``.
        features: the call's features (:class:`attnforge.types.shapes.Feature`), comma-separated.
        rel_l1, cosine: the output's error against the float32 reference on this shape (quantized backends).
    """

    device_key: str
    backend: str
    backend_version: str | None
    dtype: str
    mode: str  # "fwd" or "fwd+bwd"
    causal: bool
    ms: float
    tflops: float
    peak_mem_bytes: int | None
    run_id: str
    created_at: str = ""
    head_dim_v: int | None = None
    features: str = ""
    ms_lo: float | None = None
    ms_hi: float | None = None
    rel_l1: float | None = None
    cosine: float | None = None
    ms_mad: float | None = None

    @classmethod
    def measured(cls, shape: AttentionShape, *, device_key: str, backend: str, backend_version: str | None,
                 ms: float, tflops: float, run_id: str, created_at: str = "", peak_mem_bytes: int | None = None,
                 timing: Any = None, error: Any = None) -> BenchRecord:
        """The record of ``backend`` measured on ``shape`` (the inverse of :attr:`shape`), for ``bench`` and
        measure-on-first-use alike: ``timing`` gives the rounds' spread (``lo_ms``, ``hi_ms``, ``mad_ms`` of
        :class:`attnforge.bench.timing.Timing`), ``error`` a quantized backend's output error (``rel_l1``,
        ``cosine`` of :class:`attnforge.ranking.OutputError`); None where not measured."""
        return cls(
            device_key=device_key, backend=backend, backend_version=backend_version, dtype=shape.dtype,
            mode=shape.mode.value, causal=shape.causal, batch=shape.batch, heads_q=shape.heads_q,
            heads_kv=shape.heads_kv, head_dim=shape.head_dim, seqlen_q=shape.seqlen_q, seqlen_k=shape.seqlen_k,
            ms=ms, tflops=tflops, peak_mem_bytes=peak_mem_bytes, run_id=run_id, created_at=created_at,
            head_dim_v=shape.head_dim_v if shape.dv != shape.head_dim else None,
            features=",".join(sorted(f.value for f in shape.features)),
            ms_lo=timing.lo_ms if timing else None, ms_hi=timing.hi_ms if timing else None,
            ms_mad=timing.mad_ms if timing else None,
            rel_l1=error.rel_l1 if error else None, cosine=error.cosine if error else None)

    @property
    def shape(self) -> AttentionShape:
        """The measured shape."""
        return AttentionShape(batch=self.batch, heads_q=self.heads_q, heads_kv=self.heads_kv, head_dim=self.head_dim,
                              seqlen_q=self.seqlen_q, seqlen_k=self.seqlen_k, causal=self.causal,
                              mode=Mode(self.mode), dtype=self.dtype, head_dim_v=self.head_dim_v,
                              features=frozenset(Feature(f) for f in self.features.split(",") if f))


#: The one field -> column map: the ``bench`` table keeps the head counts' first names, so ``records.db``
#: files written before issue 23 open as they are and older attnforge releases read new rows. Every other
#: :class:`BenchRecord` field is stored in the column of its own name.
_COLUMN_OF = {"heads_q": "heads", "heads_kv": "kv_heads"}
#: the :class:`BenchRecord` fields, and the ``bench`` columns in the same order
_BENCH_FIELDS = tuple(f.name for f in fields(BenchRecord))
_BENCH_COLUMNS = tuple(_COLUMN_OF.get(name, name) for name in _BENCH_FIELDS)


def _bench_row(rec: BenchRecord) -> tuple[Any, ...]:
    return tuple(getattr(rec, name) for name in _BENCH_FIELDS)


def _bench_record(row: tuple[Any, ...]) -> BenchRecord:
    values = dict(zip(_BENCH_FIELDS, row, strict=True))
    return BenchRecord(**{**values, "causal": bool(values["causal"]), "features": values["features"] or ""})


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
            have = {row[1] for row in conn.execute("PRAGMA table_info(bench)")}
            for name, decl in _BENCH_ADDED:
                if name not in have:
                    conn.execute(f"ALTER TABLE bench ADD COLUMN {name} {decl}")
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
        names = ", ".join(_BENCH_COLUMNS)
        marks = ", ".join("?" * len(_BENCH_COLUMNS))
        with self._connect() as conn:
            conn.executemany(
                f"INSERT INTO bench ({names}) VALUES ({marks})",  # noqa: S608 - column names are constants
                [_bench_row(replace(r, created_at=r.created_at or _now())) for r in records],
            )

    def bench_records(self, device_key: str) -> list[BenchRecord]:
        """All bench records for ``device_key``, oldest first (later runs override earlier ones)."""
        if not self.path.exists():
            return []
        with self._connect() as conn:
            rows = conn.execute(f"SELECT {', '.join(_BENCH_COLUMNS)} FROM bench"  # noqa: S608 - constants
                                " WHERE device_key = ? ORDER BY id", (device_key,)).fetchall()
        return [_bench_record(row) for row in rows]


def open_records(environ: Mapping[str, str] | None = None) -> RecordStore:
    """The records under ``$ATTNFORGE_HOME`` (else the platformdirs user cache), beside
    :func:`attnforge.cache.open_store` (the same root). Opening creates nothing; the first write creates
    ``records.db``."""
    import os

    from attnforge._system.paths import home_dir

    return RecordStore(home_dir(os.environ if environ is None else environ))
