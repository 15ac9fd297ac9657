"""A home shared with a newer attnforge: a ``records.db`` or ``cache.db`` whose ``PRAGMA user_version`` is above
the schema this attnforge knows is the newer version's data, not damage. Nothing here moves it aside, writes,
migrates or deletes it: ``cache repair`` leaves it in place and names the fix (exit 1, as for an artifact it could
not make right), readers refuse it with that fix instead of "damaged ... cache repair", and writers refuse it too.

The databases are real ones, written by the code's own writers; only their ``user_version`` is raised, as a newer
release would leave it. The CLI runs through ``main()`` in this process (an uncaught exception fails the test).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from attnforge._system.statedb import DamagedDatabaseError, NewerDatabaseError
from attnforge.cache import Store
from attnforge.cache._base import SCHEMA_VERSION as CACHE_SCHEMA_VERSION
from attnforge.cli import main
from attnforge.errors import CacheError
from attnforge.records import SCHEMA_VERSION as RECORDS_SCHEMA_VERSION
from attnforge.records import BenchRecord, RecordStore, VerifyRecord
from tests.cache.conftest import inputs_for, put_wheels
from tests.cache.wheelmaker import make_wheel

CPU_SNAPSHOT = Path(__file__).resolve().parents[1] / "fixtures" / "snapshots" / "cpu_dev_torch2.13_cpu.json"
FIX = "upgrade attnforge (pip install -U attnforge) or use another ATTNFORGE_HOME"
DEVICE = "cpu|torch-2.13.0"


@dataclass(frozen=True)
class Home:
    root: Path
    store: Store
    keys: list[str]

    @property
    def records(self) -> Path:
        return self.root / "records.db"

    def state(self) -> dict[str, bytes | None]:
        """The state's files (the databases and their sidecars, the artifacts, the quarantine) by their path, with
        their bytes; None for a directory. (``doctor`` also makes the JIT compile caches' folders in the home.)"""
        return {str(p.relative_to(self.root)): None if p.is_dir() else p.read_bytes()
                for p in sorted(self.root.rglob("*"))
                if p.relative_to(self.root).parts[0] in ("artifacts", "quarantine")
                or p.name.startswith(("records.db", "cache.db"))}


def _raise_version(db: Path, version: int) -> None:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute(f"PRAGMA user_version = {version}")


BENCH = BenchRecord(device_key=DEVICE, backend="sdpa-math", backend_version=None, dtype="float32", mode="fwd",
                    causal=False, batch=1, heads_q=2, heads_kv=2, head_dim=16, seqlen_q=8, seqlen_k=8, ms=1.0,
                    tflops=1.0, peak_mem_bytes=None, run_id="r")


@pytest.fixture
def home(attnforge_home: Path, tmp_path: Path) -> Home:
    """This test's ATTNFORGE_HOME with two cache entries and a verify and a bench record, all written by
    attnforge's own writers (sound databases of this release)."""
    store = Store(attnforge_home)
    keys = put_wheels(store, tmp_path)
    records = RecordStore(attnforge_home)
    records.add_verify(VerifyRecord(device_key=DEVICE, backend="sdpa-math", backend_version=None, ok=True,
                                    summary="ok"))
    records.add_bench([BENCH])
    return Home(root=attnforge_home, store=store, keys=keys)


def _newer(home: Home, which: str) -> dict[str, int]:
    """Raise the user_version of ``which`` ("records", "cache" or "both") past this release's; the new versions."""
    raised = {}
    if which in ("records", "both"):
        raised["records.db"] = RECORDS_SCHEMA_VERSION + 1
        _raise_version(home.records, RECORDS_SCHEMA_VERSION + 1)
    if which in ("cache", "both"):
        raised["cache.db"] = CACHE_SCHEMA_VERSION + 3
        _raise_version(home.store.db_path, CACHE_SCHEMA_VERSION + 3)
    return raised


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    got = capsys.readouterr()
    return code, got.out, got.err


def _says_newer(text: str, db: Path, found: int, known: int) -> None:
    assert str(db) in text, text
    assert f"written by a newer attnforge (schema {found}; this one reads up to {known})" in text, text
    assert FIX in text, text
    assert "damaged" not in text and "cache repair" not in text, text
    assert "Traceback" not in text, text


@pytest.mark.parametrize("which", ["records", "cache", "both"])
def test_repair_leaves_a_newer_database_in_place_byte_identical_and_names_the_fix(
        which: str, home: Home, capsys: pytest.CaptureFixture[str]) -> None:
    raised = _newer(home, which)
    before = home.state()
    code, out, err = _cli(capsys, "cache", "repair")
    text = out + err
    assert code == 1, text  # as for an artifact it could not make right: the home needs the user
    assert home.state() == before  # nothing moved, written, quarantined or indexed
    assert not list(home.root.glob("*.damaged-*"))
    known = {"records.db": RECORDS_SCHEMA_VERSION, "cache.db": CACHE_SCHEMA_VERSION}
    for name, found in raised.items():
        _says_newer(text, home.root / name, found, known[name])
    if which == "records":  # the sound cache.db is still checked and kept
        assert "2 already indexed" in text, text
    code, out, _ = _cli(capsys, "cache", "repair", "--json")
    assert code == 1
    doc = json.loads(out)
    assert sorted(d["path"] for d in doc["left_in_place"]) == sorted(str(home.root / n) for n in raised)
    assert {d["schema_version"] for d in doc["left_in_place"]} == set(raised.values())
    assert home.state() == before


@pytest.mark.parametrize("argv", [["cache", "list"], ["cache", "show", "KEY"], ["cache", "verify"]])
def test_cache_readers_refuse_a_newer_cache_db_with_the_upgrade_fix(
        argv: list[str], home: Home, capsys: pytest.CaptureFixture[str]) -> None:
    found = _newer(home, "cache")["cache.db"]
    before = home.state()
    code, out, err = _cli(capsys, *(home.keys[0] if a == "KEY" else a for a in argv))
    assert code == 1, out + err
    _says_newer(err, home.store.db_path, found, CACHE_SCHEMA_VERSION)
    assert "empty" not in out
    assert home.state() == before


def test_doctor_reports_without_the_newer_records_and_names_the_fix(
        home: Home, capsys: pytest.CaptureFixture[str]) -> None:
    found = _newer(home, "records")["records.db"]
    before = home.state()
    code, out, err = _cli(capsys, "doctor", "--json", "--snapshot", str(CPU_SNAPSHOT))
    assert code == 1  # the CPU snapshot's verdict: only the CPU fallback runs there
    doc = json.loads(out)
    assert doc["kind"] == "doctor"
    assert doc["records_problem"]["path"] == str(home.records)  # a JSON reader sees it too, not only stderr
    _says_newer(doc["records_problem"]["message"] + " " + doc["records_problem"]["hint"], home.records, found,
                RECORDS_SCHEMA_VERSION)
    assert err.startswith("warning:"), err
    _says_newer(err, home.records, found, RECORDS_SCHEMA_VERSION)
    assert home.state() == before


def test_the_records_writers_refuse_a_newer_records_db_and_leave_it_byte_identical(home: Home) -> None:
    found = _newer(home, "records")["records.db"]
    before = home.state()
    store = RecordStore(home.root)
    writes = {
        "add_verify": lambda: store.add_verify(VerifyRecord(device_key=DEVICE, backend="flex", backend_version=None,
                                                            ok=True, summary="ok")),
        "add_bench": lambda: store.add_bench([replace(BENCH, seqlen_q=16, seqlen_k=16)]),
        "check_writable": store.check_writable,
        "latest_verify": lambda: store.latest_verify(DEVICE),
    }
    for name, write in writes.items():
        with pytest.raises(NewerDatabaseError) as info:
            write()
        assert not isinstance(info.value, DamagedDatabaseError), name
        _says_newer(str(info.value), home.records, found, RECORDS_SCHEMA_VERSION)
    assert store.read_or_empty(DEVICE)[:2] == ({}, [])  # a report goes on without them
    with pytest.raises(NewerDatabaseError):
        store.repair(1_800_000_000.0)  # the library's repair refuses too: never moved aside
    assert home.state() == before


@pytest.mark.parametrize("verb", [["verify", "sdpa-math"], ["bench", "--seqlen", "64"]])
def test_verify_and_bench_refuse_before_the_work_to_write_into_a_newer_records_db(
        verb: list[str], home: Home, capsys: pytest.CaptureFixture[str]) -> None:
    found = _newer(home, "records")["records.db"]
    before = home.state()
    code, out, err = _cli(capsys, *verb)
    assert code == 1, out + err
    _says_newer(err, home.records, found, RECORDS_SCHEMA_VERSION)
    assert home.state() == before


def test_the_cache_writers_refuse_a_newer_cache_db_and_store_nothing(
        home: Home, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    found = _newer(home, "cache")["cache.db"]
    before = home.state()
    wheel = make_wheel(tmp_path / "new", version="7.0")
    with pytest.raises(CacheError) as info:
        Store(home.root).put(wheel, inputs_for(wheel))
    assert isinstance(info.value, NewerDatabaseError) and not isinstance(info.value, DamagedDatabaseError)
    other = Store(tmp_path / "other")
    put_wheels(other, tmp_path / "other-wheels", count=1)
    for argv in (["cache", "import", str(other.root)], ["cache", "prune", "--max-size", "0"],
                 ["cache", "rm", home.keys[0]]):
        code, out, err = _cli(capsys, *argv)
        assert code == 1, out + err
        _says_newer(err, home.store.db_path, found, CACHE_SCHEMA_VERSION)
    assert home.state() == before  # nothing stored, removed or quarantined


def test_a_writer_waiting_on_a_newer_attnforges_migration_neither_writes_nor_sets_the_version_back(
        tmp_path: Path) -> None:
    """A newer attnforge migrates records.db (schema up, in one transaction) while this one waits to write: once the
    migration commits, this writer must find the newer schema under its write lock and refuse, not insert its row
    and set ``user_version`` back (review, 2026-12-02: it waited the lock out, then did both). Two real processes."""
    import subprocess
    import sys
    import textwrap
    import time

    store = RecordStore(tmp_path)
    store.add_verify(VerifyRecord(device_key=DEVICE, backend="sdpa", backend_version=None, ok=True, summary="ok"))
    newer = RECORDS_SCHEMA_VERSION + 1
    with subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sqlite3, sys, time
        c = sqlite3.connect({str(store.path)!r}, isolation_level=None)
        c.execute("BEGIN IMMEDIATE")
        c.execute("ALTER TABLE verify ADD COLUMN newer_col TEXT")
        c.execute("PRAGMA user_version = {newer}")
        print("migrating", flush=True)
        time.sleep(1.5)
        c.execute("COMMIT")
    """)], stdout=subprocess.PIPE, text=True) as migrating:
        assert migrating.stdout is not None and migrating.stdout.readline().strip() == "migrating"
        t0 = time.monotonic()
        with pytest.raises(NewerDatabaseError, match="newer attnforge"):
            store.add_verify(VerifyRecord(device_key=DEVICE, backend="flex", backend_version=None, ok=True,
                                          summary="ok"))
        assert time.monotonic() - t0 > 0.5  # it did wait for the migration (the test raced nothing otherwise)
        assert migrating.wait(timeout=30) == 0
    with contextlib.closing(sqlite3.connect(store.path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == newer
        assert [r[0] for r in conn.execute("SELECT backend FROM verify")] == ["sdpa"]


#: a newer attnforge's writes left in an uncheckpointed ``-wal``: argv database path, schema version
_NEWER_WITH_A_WAL = """
import os, sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("PRAGMA journal_mode=WAL")
c.execute("PRAGMA wal_autocheckpoint=0")
c.execute(f"PRAGMA user_version = {int(sys.argv[2])}")
c.execute("CREATE TABLE IF NOT EXISTS newer_things (x)")
c.execute("INSERT INTO newer_things VALUES ('the newer release data')")
os._exit(0)
"""


def _newer_with_a_wal(db: Path, version: int) -> None:
    """``db`` at schema ``version`` with its last rows still in an uncheckpointed ``-wal``, as a newer attnforge
    killed mid-run (or still running) leaves it: a real process ends without closing its connection."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", _NEWER_WITH_A_WAL, str(db), str(version)], check=True)
    assert db.with_name(db.name + "-wal").stat().st_size > 0


@pytest.mark.parametrize("argv", [["cache", "repair"], ["cache", "list"], ["doctor", "--json"],
                                  ["verify", "sdpa-math"]])
def test_a_newer_database_with_an_uncheckpointed_wal_keeps_its_bytes_and_its_wal(
        argv: list[str], home: Home, capsys: pytest.CaptureFixture[str]) -> None:
    """A read-write open (a reader's or a writer's) checkpointed the newer file's WAL into it and deleted the
    ``-wal`` when it closed, before the version check refused the file (review, 2026-12-02). The version is now read
    through a read-only connection first; only SQLite's ``-shm`` index may be rebuilt."""
    _newer_with_a_wal(home.records, RECORDS_SCHEMA_VERSION + 1)
    _newer_with_a_wal(home.store.db_path, CACHE_SCHEMA_VERSION + 1)

    def files() -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(home.root.iterdir())
                if p.name.startswith(("records.db", "cache.db")) and not p.name.endswith("-shm")}

    before = files()
    assert {"records.db-wal", "cache.db-wal"} <= before.keys()
    _, out, err = _cli(capsys, *argv)
    assert "Traceback" not in out + err
    assert files() == before, argv


def test_an_export_from_a_newer_cache_db_makes_nothing_at_its_destination(
        home: Home, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The export read the store only after making ``DEST/artifacts`` and its lock file, which it then left behind
    (review, 2026-12-02)."""
    found = _newer(home, "cache")["cache.db"]
    dest = tmp_path / "export"
    code, out, err = _cli(capsys, "cache", "export", str(dest))
    assert code == 1
    _says_newer(out + err, home.store.db_path, found, CACHE_SCHEMA_VERSION)
    assert not dest.exists()
