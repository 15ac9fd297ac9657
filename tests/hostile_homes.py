"""Hostile ``ATTNFORGE_HOME`` states for the runtime and CLI tests (issue 31 item 1): every way ``records.db`` or
the home itself was found broken, built for real on disk (real SQLite files, real truncation, a real lock).

Each builder takes the home directory (not yet created) and returns the value to give ``ATTNFORGE_HOME``
(the home itself, or a path that cannot be a directory). ``DAMAGED`` lists the cases that must warn once;
``records-empty`` (a zero-length file is an empty SQLite database) and ``home-missing`` must serve silently.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

from attnforge.records import BenchRecord, RecordStore, VerifyRecord

#: a device key no machine has: records under it never change a decision, so attention() must equal SDPA
#: exactly even where a damaged file is still partly readable
OTHER_DEVICE = "cuda:Imaginary GPU|sm_99|torch-0.0"


def _sound(home: Path, rows: int = 300) -> Path:
    """A real records.db with a verify record and ``rows`` bench rows (several pages) of another device."""
    store = RecordStore(home)
    store.add_verify(VerifyRecord(device_key=OTHER_DEVICE, backend="sdpa-math", backend_version=None, ok=True,
                                  summary="ok"))
    store.add_bench([BenchRecord(device_key=OTHER_DEVICE, backend="sdpa-math", backend_version=None,
                                 dtype="float32", mode="fwd", causal=False, batch=1, heads_q=2, heads_kv=2,
                                 head_dim=16, seqlen_q=8 + i, seqlen_k=8 + i, ms=1.0, tflops=1.0,
                                 peak_mem_bytes=None, run_id=f"r{i}" * 20) for i in range(rows)])
    return store.path


def garbage(home: Path) -> Path:
    home.mkdir()
    (home / "records.db").write_bytes(random.Random(7).randbytes(16384))
    return home


def truncated(home: Path) -> Path:
    db = _sound(home)
    with db.open("r+b") as f:
        f.truncate(db.stat().st_size // 3)
    return home


def garbled_pages(home: Path) -> Path:
    """The header kept, every page after the first overwritten with noise."""
    db = _sound(home)
    data = bytearray(db.read_bytes())
    data[4096:] = random.Random(11).randbytes(len(data) - 4096)
    db.write_bytes(bytes(data))
    return home


def empty(home: Path) -> Path:
    home.mkdir()
    (home / "records.db").write_bytes(b"")
    return home


def directory(home: Path) -> Path:
    (home / "records.db").mkdir(parents=True)
    return home


def foreign(home: Path) -> Path:
    home.mkdir()
    with contextlib.closing(sqlite3.connect(home / "records.db")) as conn, conn:
        conn.execute("CREATE TABLE users (name TEXT)")
    return home


def newer(home: Path) -> Path:
    db = _sound(home, rows=1)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA user_version = 99")
    return home


def wrong_columns(home: Path) -> Path:
    home.mkdir()
    with contextlib.closing(sqlite3.connect(home / "records.db")) as conn, conn:
        conn.execute("CREATE TABLE bench (id INTEGER PRIMARY KEY, device_key TEXT)")
        conn.execute("CREATE TABLE verify (id INTEGER PRIMARY KEY)")
    return home


def home_is_a_file(home: Path) -> Path:
    home.write_text("not a directory\n")
    return home


def home_under_a_file(home: Path) -> Path:
    home.write_text("not a directory\n")
    return home / "attnforge"


def home_missing(home: Path) -> Path:
    return home / "not" / "created" / "yet"


HOMES: dict[str, Callable[[Path], Path]] = {
    "records-garbage": garbage,
    "records-truncated": truncated,
    "records-garbled-pages": garbled_pages,
    "records-empty": empty,
    "records-directory": directory,
    "records-foreign": foreign,
    "records-newer-schema": newer,
    "records-wrong-columns": wrong_columns,
    "home-is-a-file": home_is_a_file,
    "home-under-a-file": home_under_a_file,
    "home-missing": home_missing,
}
#: the cases where records.db cannot be used at all: exactly one warning, and the CLI names the file
DAMAGED = frozenset(HOMES) - {"records-empty", "home-missing"}


@contextlib.contextmanager
def locked(home: Path) -> Iterator[Path]:
    """A sound records.db in rollback-journal mode that another connection holds an exclusive lock on."""
    db = _sound(home, rows=1)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA journal_mode=DELETE")
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        yield home
    finally:
        holder.close()
