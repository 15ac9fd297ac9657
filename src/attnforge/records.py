"""Verification and benchmark records: what ``verify`` proved and ``bench`` measured on this machine.

``verify`` and ``bench`` write them; ``doctor`` and the dispatcher read them. They live in SQLite (WAL) at
``$ATTNFORGE_HOME/records.db``, keyed by a *device key* so results from one GPU/torch never steer another.

The state is optional (docs/reliability.md, "The runtime's state is optional"): a home that cannot be written
is read through a read-only connection (a shared team home is supported); a damaged or foreign file is refused
with a :class:`~attnforge.errors.CacheError` naming it and the recovery (``attnforge cache repair``), a newer
attnforge's file with a :class:`~attnforge._system.statedb.NewerDatabaseError` naming the upgrade (it is never
written, moved aside or migrated down here), and the runtime reads through
:class:`attnforge.dispatch.state.RuntimeRecords`, which never raises.
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import shutil
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from attnforge import _serde
from attnforge._system.statedb import (
    DamagedDatabaseError,
    SqliteKind,
    can_write,
    connect_reading,
    file_problem,
    home_problem,
    lacking_columns,
    move_aside,
    reject_newer,
    schema_problem,
    sqlite_kind,
)
from attnforge.errors import CacheError

# The one device-key constructor lives with the value types; re-exported for the runtime, verify and bench.
from attnforge.types.device import device_key as device_key  # noqa: PLC0414
from attnforge.types.shapes import AttentionShape, Dims, Feature, Layout, Mode

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
    ms_mad REAL,
    layout TEXT NOT NULL DEFAULT 'bhsd',
    rounds INTEGER
);
CREATE INDEX IF NOT EXISTS bench_device ON bench(device_key, backend);
"""
#: :data:`_SCHEMA`'s statements, run one by one inside the writer's transaction
_SCHEMA_STATEMENTS = tuple(f"{part.strip()};" for part in _SCHEMA.split(";") if part.strip())
#: ``PRAGMA user_version`` of records.db: 0 before versions were written (read as 1), 1 since; a newer one is refused
SCHEMA_VERSION = 1
_TABLES = ("verify", "bench")
#: columns added to ``bench`` after its first release: ``records.db`` files from before get them on open
_BENCH_ADDED = (("head_dim_v", "INTEGER"), ("features", "TEXT NOT NULL DEFAULT ''"), ("ms_lo", "REAL"),
                ("ms_hi", "REAL"), ("rel_l1", "REAL"), ("cosine", "REAL"),
                ("ms_mad", "REAL"), ("layout", "TEXT NOT NULL DEFAULT 'bhsd'"), ("rounds", "INTEGER"))
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
        layout: the memory layout of the timed tensors (:class:`attnforge.types.shapes.Layout`'s value; ``"bhsd"``
            for records from before it was stored, and for packed calls): a kernel's speed depends on it (H200,
            2026-11-29: FA3 on MHA 1k fwd+bwd 0.960x SDPA on ``[B, H, S, D]`` tensors, 1.080x on ``[B, S, H, D]``).
        rounds: how many interleaved rounds ``ms`` and ``ms_mad`` were taken over (the "fastest" rule narrows its
            margin as they accumulate: :func:`attnforge.ranking.rounds_factor`); None for records from before it
            was stored.
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
    layout: str = Layout.BHSD.value
    rounds: int | None = None

    @classmethod
    def measured(cls, shape: AttentionShape, *, device_key: str, backend: str, backend_version: str | None,
                 ms: float, tflops: float, run_id: str, created_at: str = "", peak_mem_bytes: int | None = None,
                 timing: Any = None, error: Any = None) -> BenchRecord:
        """The record of ``backend`` measured on ``shape`` (the inverse of :attr:`shape`), for ``bench`` and
        measure-on-first-use alike: ``timing`` gives the rounds' spread and count (``lo_ms``, ``hi_ms``, ``mad_ms``,
        ``round_count`` of :class:`attnforge.bench.timing.Timing`), ``error`` a quantized backend's output error
        (``rel_l1``, ``cosine`` of :class:`attnforge.ranking.OutputError`); None where not measured."""
        return cls(
            device_key=device_key, backend=backend, backend_version=backend_version, dtype=shape.dtype,
            mode=shape.mode.value, causal=shape.causal, batch=shape.batch, heads_q=shape.heads_q,
            heads_kv=shape.heads_kv, head_dim=shape.head_dim, seqlen_q=shape.seqlen_q, seqlen_k=shape.seqlen_k,
            ms=ms, tflops=tflops, peak_mem_bytes=peak_mem_bytes, run_id=run_id, created_at=created_at,
            head_dim_v=shape.head_dim_v if shape.dv != shape.head_dim else None,
            features=",".join(sorted(f.value for f in shape.features)),
            ms_lo=timing.lo_ms if timing else None, ms_hi=timing.hi_ms if timing else None,
            ms_mad=timing.mad_ms if timing else None,
            rounds=timing.round_count if timing else None,
            rel_l1=error.rel_l1 if error else None, cosine=error.cosine if error else None,
            layout=shape.layout.value)

    @property
    def shape(self) -> AttentionShape:
        """The measured shape."""
        return AttentionShape(batch=self.batch, heads_q=self.heads_q, heads_kv=self.heads_kv, head_dim=self.head_dim,
                              seqlen_q=self.seqlen_q, seqlen_k=self.seqlen_k, causal=self.causal,
                              mode=Mode(self.mode), dtype=self.dtype, head_dim_v=self.head_dim_v,
                              layout=Layout(self.layout),
                              features=frozenset(Feature(f) for f in self.features.split(",") if f))


#: the :class:`BenchRecord` fields of an exact shape and memory layout: a newer record of one backend supersedes an
#: older one where all of them are equal (:func:`attnforge.ranking.latest`, and the newest rows the runtime reads,
#: :meth:`RecordStore.bench_records`)
SUPERSEDED_WITHIN = ("dtype", "mode", "causal", "batch", "heads_q", "heads_kv", "head_dim", "head_dim_v", "seqlen_q",
                     "seqlen_k", "features", "layout")

#: The one field -> column map: the ``bench`` table keeps the head counts' first names, so ``records.db``
#: files written before issue 23 open as they are and older attnforge releases read new rows. Every other
#: :class:`BenchRecord` field is stored in the column of its own name.
_COLUMN_OF = {"heads_q": "heads", "heads_kv": "kv_heads"}
#: the :class:`BenchRecord` fields, and the ``bench`` columns in the same order
_BENCH_FIELDS = tuple(f.name for f in fields(BenchRecord))
_BENCH_COLUMNS = tuple(_COLUMN_OF.get(name, name) for name in _BENCH_FIELDS)


def _bench_row(rec: BenchRecord) -> tuple[Any, ...]:
    return tuple(getattr(rec, name) for name in _BENCH_FIELDS)


#: the values a row's enumerated columns may hold (what :attr:`BenchRecord.shape` reads them into)
_MODES = frozenset(m.value for m in Mode)
_LAYOUTS = frozenset(x.value for x in Layout)
_FEATURES = frozenset(f.value for f in Feature)


#: the ``bench`` fields by the Python type a row must give them (SQLite stores any value in any column: a text in a
#: REAL column comes back as a str); None is allowed in the optional ones only
_INTS = ("batch", "heads_q", "heads_kv", "head_dim", "seqlen_q", "seqlen_k")
_OPTIONAL_INTS = ("head_dim_v", "peak_mem_bytes", "rounds")
_REALS = ("ms", "tflops")
_OPTIONAL_REALS = ("ms_lo", "ms_hi", "rel_l1", "cosine", "ms_mad")
_TEXTS = ("device_key", "backend", "dtype", "mode", "run_id")
_OPTIONAL_TEXTS = ("backend_version", "created_at")


def _bench_record(row: tuple[Any, ...]) -> BenchRecord:
    """One ``bench`` row as a record. Raises ValueError for a value no release writes (a damaged or hand-edited
    file): a text where a number belongs, a mode, layout or feature that does not exist. Read later, such a row
    raised inside a decision, i.e. inside attention() (``TypeError: '>' not supported between 'str' and 'int'``)."""
    values = dict(zip(_BENCH_FIELDS, row, strict=True))
    wrong = ([n for n in _INTS if type(values[n]) is not int]
             + [n for n in _OPTIONAL_INTS if values[n] is not None and type(values[n]) is not int]
             + [n for n in _REALS if type(values[n]) not in (int, float)]
             + [n for n in _OPTIONAL_REALS if values[n] is not None and type(values[n]) not in (int, float)]
             + [n for n in _TEXTS if type(values[n]) is not str]
             + [n for n in _OPTIONAL_TEXTS if values[n] is not None and type(values[n]) is not str])
    if wrong:
        raise ValueError(f"the values of {', '.join(wrong)} are not of their column's type")
    rec = BenchRecord(**{**values, "causal": bool(values["causal"]), "features": values["features"] or "",
                         "layout": values["layout"] or Layout.BHSD.value})
    if (rec.mode not in _MODES or rec.layout not in _LAYOUTS
            or (rec.features and not _FEATURES.issuperset(rec.features.split(",")))):
        raise ValueError(f"unknown mode, layout or feature in ({rec.mode!r}, {rec.layout!r}, {rec.features!r})")
    return rec


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


#: what a damaged records.db costs and how it comes back, said by every error and warning about it
RECOVERY = ("`attnforge cache repair` moves it aside and starts an empty one (records are re-measurable: "
             "`attnforge verify` and `attnforge bench` write them again)")


class RecordStore:
    """SQLite-backed store of verify and bench records under ``home``.

    Args:
        home: the state directory (``$ATTNFORGE_HOME``); ``records.db`` lives in it.
        busy_timeout_s: how long a call waits for another process's write lock (the runtime waits less).

    Every method raises :class:`~attnforge.errors.CacheError` (never a ``sqlite3`` error) when the file is
    damaged, foreign, newer (:class:`~attnforge._system.statedb.NewerDatabaseError`: nothing is written into it),
    locked or cannot be written; readers of a home this user cannot write open the file read-only and create
    nothing.
    """

    def __init__(self, home: Path, *, busy_timeout_s: float = 30.0) -> None:
        self.path = home / "records.db"
        self._busy_timeout_s = busy_timeout_s

    @contextmanager
    def _reader(self, doing: str) -> Iterator[sqlite3.Connection | None]:
        """A connection that writes nothing (read-only where the home cannot be written); None: no file yet."""
        self._check_file()
        if not self.path.exists():
            yield None
            return
        reject_newer(self.path, version=SCHEMA_VERSION)  # before a read-write open could checkpoint its WAL
        try:  # read-only where the home cannot be written or the disk refuses a write (full): reads still work
            conn = connect_reading(self.path, timeout_s=self._busy_timeout_s)
            try:
                self._check_schema(conn)
                yield conn
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise self.error(exc, doing) from None

    @contextmanager
    def _writer(self, doing: str, *, lost: str = "the records were not saved") -> Iterator[sqlite3.Connection]:
        """One transaction on a writable records.db (created, and its schema brought up to date, here); a failure
        says ``lost`` first."""
        self._check_file()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self.error(exc, doing, lost=lost) from None
        if not can_write(self.path):
            raise self.error(PermissionError(errno.EACCES, "this user cannot write it (a read-only or shared home)"),
                             doing, lost=lost)
        reject_newer(self.path, version=SCHEMA_VERSION)  # before a read-write open could checkpoint its WAL
        try:
            # autocommit: the transaction is ours (BEGIN IMMEDIATE below), so nothing commits behind it
            conn = sqlite3.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None)
            try:
                self._check_schema(conn)
                conn.execute("PRAGMA journal_mode=WAL")  # not inside a transaction
                conn.execute("BEGIN IMMEDIATE")  # the write lock, then the version read again under it: a newer
                # attnforge that migrated the file while this one waited (the busy timeout) must not be written
                # into, nor its user_version set back (review, 2026-12-02: it was, after a 2 s wait)
                with conn:  # commits at the end, rolls back on an error (the caller's included)
                    found = self._check_schema(conn)
                    for statement in _SCHEMA_STATEMENTS:  # executescript would COMMIT first
                        conn.execute(statement)
                    have = _columns(conn, "bench")
                    for name, decl in _BENCH_ADDED:
                        if name not in have:
                            conn.execute(f"ALTER TABLE bench ADD COLUMN {name} {decl}")
                    if found < SCHEMA_VERSION:
                        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                    yield conn
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise self.error(exc, doing, lost=lost) from None

    def _check_file(self) -> None:
        why = home_problem(self.path)
        if why is not None:
            err = CacheError(f"the attnforge home {self.path.parent} cannot be used: it cannot hold records.db",
                             cause=why, hint="point ATTNFORGE_HOME at a real directory (e.g. `export ATTNFORGE_HOME="
                             "$HOME/.af`), or unset it to use the user cache dir")
            err.exit_code = 2  # ATTNFORGE_HOME names a file or a symlink loop: bad input
            raise err
        problem = file_problem(self.path)
        if problem is not None:
            raise self.damaged(problem)

    def _check_schema(self, conn: sqlite3.Connection) -> int:
        """The file's ``user_version`` once it is a sound records.db of this attnforge (else raises)."""
        if (problem := schema_problem(conn, self.path, ours=_TABLES, version=SCHEMA_VERSION)) is not None:
            raise self.damaged(problem)
        return int(conn.execute("PRAGMA user_version").fetchone()[0])

    def damaged(self, why: str) -> CacheError:
        """The error for a records.db that is not a sound records database of this attnforge."""
        return DamagedDatabaseError(f"the records database {self.path} is damaged", cause=why, hint=RECOVERY)

    def error(self, exc: BaseException, doing: str, *, lost: str = "") -> CacheError:
        """The user-facing error for a SQLite or OS failure while ``doing`` something with records.db, ``lost`` (what
        a failed write cost: "the records were not saved") first. SQLite reports a full disk under a WAL database as a
        "disk I/O error" (its ``-shm`` file cannot grow): the free space decides which it was."""
        kind = sqlite_kind(exc)
        text = getattr(exc, "strerror", None) or str(exc)
        if kind is SqliteKind.DAMAGED:
            return self.damaged(f"{type(exc).__name__}: {text}")
        first = f"{lost}: " if lost else ""
        if kind is SqliteKind.LOCKED:
            return CacheError(f"{first}the records database {self.path} is locked; could not {doing}",
                              cause=f"another process held it for over {self._busy_timeout_s:g} s: {text}",
                              hint="wait for the running `attnforge bench` or `verify` to finish, then retry")
        if kind is SqliteKind.FULL or self._disk_full():
            return CacheError(f"{first}not enough disk space to {doing} in {self.path}", cause=text,
                              hint="free space there, or point ATTNFORGE_HOME at a bigger disk (the records already "
                              "there are still read)")
        return CacheError(f"{first}could not {doing} in {self.path}", cause=text,
                          hint="point ATTNFORGE_HOME at a directory you can write to, on a sound disk (a read-only "
                          "home is still read: doctor and attention() use its records)")

    def _disk_full(self) -> bool:
        """Whether the disk under records.db has less than a SQLite page cache's worth of room (1 MiB) left."""
        try:
            return shutil.disk_usage(self.path.parent).free < 2**20
        except OSError:
            return False

    def check_writable(self) -> None:
        """Raise the error a write would raise, before a long job whose results go here (``verify``,
        ``bench``, ``warmup``); creates ``records.db`` with its schema when there is none.

        Raises:
            CacheError: the home cannot be written, or records.db is damaged or newer (it names the file and the
                fix).
        """
        with self._writer("store records", lost="the results could not be saved, so nothing was run"):
            pass

    def read_or_empty(self, device_key: str) -> tuple[dict[str, VerifyRecord], list[BenchRecord], CacheError | None]:
        """The verify and bench records of ``device_key`` for a report that goes on without them (``doctor``,
        ``plan``): empty ones and the error when records.db cannot be read."""
        try:
            return self.latest_verify(device_key), self.bench_records(device_key), None
        except CacheError as exc:
            return {}, [], exc

    def repair(self, now_s: float) -> Path | None:
        """Move a damaged records.db aside (to ``records.db.damaged-<time>``, never deleted) so the next write
        starts an empty one; returns where it went, or None when the file is sound or absent.

        Raises:
            NewerDatabaseError: a newer attnforge wrote it: it is left where it is, as it is.
            CacheError: it is damaged but cannot be moved (read-only home).
        """
        try:  # every page, as cache repair checks cache.db: a lookup by key reads only the index's pages
            with self._reader("check the records") as conn:
                if conn is None:
                    return None
                quick = [str(r[0]) for r in conn.execute("PRAGMA quick_check").fetchall()]
                lacking = lacking_columns(conn, _SCHEMA, optional=frozenset(dict(_BENCH_ADDED)))
            if quick == ["ok"] and not lacking:
                return None
        except DamagedDatabaseError:
            pass
        try:
            return move_aside(self.path, now_s)
        except OSError as exc:
            raise self.error(exc, "move the damaged records aside") from None

    # -- verify -------------------------------------------------------------------------------------------
    def add_verify(self, rec: VerifyRecord) -> None:
        with self._writer("store a verify record") as conn:
            conn.execute(
                "INSERT INTO verify (device_key, backend, backend_version, ok, summary, details, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (rec.device_key, rec.backend, rec.backend_version, int(rec.ok), rec.summary,
                 json.dumps(rec.details), rec.created_at or _now()),
            )

    def latest_verify(self, device_key: str) -> dict[str, VerifyRecord]:
        """The newest verify record per backend for ``device_key``."""
        with self._reader("read the verify records") as conn:
            if conn is None or not _columns(conn, "verify"):
                return {}
            rows = conn.execute(
                "SELECT device_key, backend, backend_version, ok, summary, details, created_at FROM verify"
                " WHERE device_key = ? ORDER BY id", (device_key,)).fetchall()
        out: dict[str, VerifyRecord] = {}
        try:
            for r in rows:
                details = _serde.loads(r[5])
                # what the dispatcher reads of it (features.py: the failed features): a dict, a list of names
                if not isinstance(details, dict) or not isinstance(details.get("failed_features", []), list):
                    raise ValueError(f"details of {r[1]!r} are not a mapping with a list of failed features")
                out[r[1]] = VerifyRecord(device_key=r[0], backend=r[1], backend_version=r[2], ok=bool(r[3]),
                                         summary=r[4], details=details, created_at=r[6])
        except (ValueError, TypeError) as exc:
            raise self.damaged(f"a verify row cannot be read: {exc}") from None
        return out

    # -- bench --------------------------------------------------------------------------------------------
    def add_bench(self, records: list[BenchRecord]) -> None:
        names = ", ".join(_BENCH_COLUMNS)
        marks = ", ".join("?" * len(_BENCH_COLUMNS))
        with self._writer("store bench records") as conn:
            conn.executemany(
                f"INSERT INTO bench ({names}) VALUES ({marks})",  # noqa: S608 - column names are constants
                [_bench_row(replace(r, created_at=r.created_at or _now())) for r in records],
            )

    def bench_records(self, device_key: str, *, newest: bool = False) -> list[BenchRecord]:
        """All bench records for ``device_key``, oldest first (later runs override earlier ones); with ``newest``,
        only the newest of each backend version, exact shape and memory layout, still oldest first: everything
        :func:`attnforge.ranking.latest` keeps of the records of any one installed version, so every ranking is the
        same (a property test holds it). The runtime reads this way: a home that ``bench`` ran in a dozen times
        holds a dozen rows per shape, and building every row into a record cost the first call of a process 70-110
        ms at 4622 rows on a CPU host (2026-11-29)."""
        with self._reader("read the bench records") as conn:
            have = set() if conn is None else _columns(conn, "bench")
            if conn is None or not have:
                return []
            lacking = [c for c in _BENCH_COLUMNS if c not in have and c not in dict(_BENCH_ADDED)]
            if lacking:
                raise self.damaged(f"its bench table lacks the columns {', '.join(lacking)}")
            # a read-only file from before a column was added is read as it is: the new fields are None
            wanted = ", ".join(c if c in have else "NULL" for c in _BENCH_COLUMNS)
            where, args = "WHERE device_key = ?", [device_key]
            if newest:
                group = ", ".join(c if c in have else "NULL" for c in _NEWEST_OF)
                where += f" AND id IN (SELECT MAX(id) FROM bench WHERE device_key = ? GROUP BY {group})"  # noqa: S608 - constants
                args.append(device_key)
            rows = conn.execute(f"SELECT {wanted} FROM bench {where} ORDER BY id", args).fetchall()  # noqa: S608 - constants
        try:
            return [_bench_record(tuple(row)) for row in rows]
        except (ValueError, TypeError) as exc:
            raise self.damaged(f"a bench row cannot be read: {exc}") from None


#: the columns ``bench_records(newest=True)`` keeps the newest row of each of: the backend, the version the
#: dispatcher filters on, and :data:`SUPERSEDED_WITHIN`
_NEWEST_OF = ("backend", "backend_version", *(_COLUMN_OF.get(name, name) for name in SUPERSEDED_WITHIN))


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {str(row[1]) for row in conn.execute(f"PRAGMA table_info({table})")}


def open_records(environ: Mapping[str, str] | None = None) -> RecordStore:
    """The records under ``$ATTNFORGE_HOME`` (else the platformdirs user cache), beside
    :func:`attnforge.cache.open_store` (the same root). Opening creates nothing; the first write creates
    ``records.db``."""
    import os

    from attnforge._system.paths import home_dir

    return RecordStore(home_dir(os.environ if environ is None else environ))
