"""A damaged, foreign, empty or missing cache.db while the artifacts lie on disk (issue 31 items 6 and 9), and
the CLI verbs in a home whose records.db is damaged (item 1): every path names the damaged file and the
recovery, exits 1 without a traceback, and `attnforge cache repair` brings every intact artifact back
without a rebuild, moving the damaged file aside (never deleting it).

The CLI runs through ``main()`` in this process (an uncaught exception fails the test) and, for the
traceback check, as one real subprocess.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from attnforge._system.statedb import DamagedDatabaseError
from attnforge.cache import Store
from attnforge.cache.prune import prune
from attnforge.cli import main
from attnforge.records import RecordStore, VerifyRecord
from tests.cache.conftest import inputs_for, put_wheels
from tests.cache.wheelmaker import flip_byte, make_wheel
from tests.hostile_homes import DAMAGED, HOMES

SRC = Path(__file__).resolve().parents[2] / "src"
CPU_SNAPSHOT = Path(__file__).resolve().parents[1] / "fixtures" / "snapshots" / "cpu_dev_torch2.13_cpu.json"


def _clear(db: Path) -> None:
    for path in (db, *db.parent.glob(db.name + "-*")):
        path.unlink()


def _sqlite(db: Path, *sql: str) -> None:
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        for statement in sql:
            conn.execute(statement)


def _garbage(db: Path) -> None:
    db.write_bytes(random.Random(5).randbytes(8192))


def _truncated(db: Path) -> None:
    with db.open("r+b") as f:
        f.truncate(db.stat().st_size // 2)


def _directory(db: Path) -> None:
    _clear(db)
    db.mkdir()


def _foreign(db: Path) -> None:
    _clear(db)
    _sqlite(db, "CREATE TABLE users (name TEXT)")


DB_DAMAGE: dict[str, Callable[[Path], None]] = {
    "garbage": _garbage,
    "truncated": _truncated,
    "zero-length": lambda db: db.write_bytes(b""),
    "no-tables": lambda db: _clear(db) or _sqlite(db, "PRAGMA user_version = 0"),
    "directory": _directory,
    "foreign": _foreign,
    "deleted": _clear,
    # a column dropped (another program, a hand edit): quick_check passes it, so repair kept it while every read said
    # "damaged, run cache repair", and verify crashed on the missing key (CLI fuzz, 2026-12-03)
    "lacks-a-column": lambda db: _sqlite(db, "ALTER TABLE artifacts DROP COLUMN has_log"),
}


@pytest.fixture
def filled(attnforge_home: Path, tmp_path: Path) -> tuple[Store, list[str]]:
    """Two entries in this test's ATTNFORGE_HOME (the CLI's store)."""
    store = Store(attnforge_home)
    return store, put_wheels(store, tmp_path)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    got = capsys.readouterr()
    return code, got.out + got.err


@pytest.mark.parametrize("damage", sorted(DB_DAMAGE))
def test_a_damaged_cache_db_is_named_and_repaired_from_the_artifacts_on_disk(
        damage: str, filled: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    store, keys = filled
    DB_DAMAGE[damage](store.db_path)
    for verb in ("list", "verify"):
        code, text = _cli(capsys, "cache", verb)
        assert code == 1, text
        assert str(store.db_path) in text and "attnforge cache repair" in text, text
        assert f"the cache at {store.root} is empty" not in text and "database: ok" not in text
    code, text = _cli(capsys, "cache", "repair")
    assert code == 0, text
    assert "indexed 2 artifacts" in text, text
    code, text = _cli(capsys, "cache", "list", "--json")
    assert code == 0 and sorted(e["key"] for e in json.loads(text)["entries"]) == sorted(keys)
    assert _cli(capsys, "cache", "verify")[0] == 0
    moved = sorted(p.name for p in store.root.glob("cache.db.damaged-*") if not p.name.endswith(("-wal", "-shm")))
    assert len(moved) == (0 if damage == "deleted" else 1), moved  # moved aside, never deleted
    assert Store(store.root).get(keys[0]).is_file()  # installable again, with no rebuild


def test_install_refuses_instead_of_rebuilding_and_no_writer_deletes_the_unindexed_artifacts(
        filled: tuple[Store, list[str]], tmp_path: Path) -> None:
    store, _ = filled
    _foreign(store.db_path)
    dirs = sorted(d.name for d in store.entry_dirs())
    fresh = Store(store.root)
    with pytest.raises(DamagedDatabaseError, match="cache repair"):
        fresh.cached_artifacts()  # what `install` and `plan` read: they stop with the hint, no source build
    other = make_wheel(tmp_path / "w9", version="9.0")
    with pytest.raises(DamagedDatabaseError):
        fresh.put(other, inputs_for(other))  # a writer must not take the entries for debris
    with pytest.raises(DamagedDatabaseError):
        prune(fresh, max_size_bytes=0)
    assert sorted(d.name for d in store.entry_dirs()) == dirs
    with contextlib.closing(sqlite3.connect(store.db_path)) as conn:
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["users"]  # not written into


def test_an_entry_whose_row_was_lost_is_kept_reported_and_indexed_again(
        filled: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    store, keys = filled
    with contextlib.closing(sqlite3.connect(store.db_path)) as conn, conn:
        conn.execute("DELETE FROM artifacts WHERE key = ?", (keys[0],))
    code, text = _cli(capsys, "cache", "verify")
    assert code == 1 and "1 artifacts on disk have no row" in text and "cache repair" in text, text
    assert _cli(capsys, "cache", "prune")[0] == 0  # clears debris; a complete entry is not debris
    assert (store.artifacts_dir / keys[0].removeprefix("sha256:")).is_dir()
    code, text = _cli(capsys, "cache", "repair")
    assert code == 0 and "indexed 1 artifacts from disk, 1 already indexed" in text, text
    assert not list(store.root.glob("cache.db.damaged-*"))  # a sound database is kept
    assert _cli(capsys, "cache", "verify")[0] == 0


def _tamper_provenance(folder: Path) -> None:
    doc = json.loads((folder / "provenance.json").read_text())
    doc["inputs"]["torch_version"] = "2.12.0"  # relabelled: the key is no longer the hash of the inputs
    (folder / "provenance.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("tamper", [
    pytest.param(lambda folder: flip_byte(next(folder.glob("*.whl"))), id="flipped-wheel"),
    pytest.param(_tamper_provenance, id="relabelled-provenance"),
    pytest.param(lambda folder: (folder / "provenance.json").unlink(), id="no-provenance"),
])
def test_repair_indexes_only_artifacts_whose_key_and_hash_check_out(
        tamper: Callable[[Path], Any], filled: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    store, keys = filled
    bad = store.artifacts_dir / keys[1].removeprefix("sha256:")
    tamper(bad)
    _garbage(store.db_path)
    code, text = _cli(capsys, "cache", "repair")
    assert code == 1, text
    assert "indexed 1 artifacts" in text and "1 quarantined" in text, text
    assert [e.key for e in Store(store.root).list()] == [keys[0]]
    assert not bad.exists()
    reasons = [p.read_text() for p in store.quarantine_dir.rglob("reason.txt")]
    assert len(reasons) == 1 and "repair:" in reasons[0]


def _crafted_entry(store: Store, tmp_path: Path, *, version: str, filename: str | None = None) -> Path:
    """An entry folder whose key is the hash of its recorded inputs (so only the field under test is wrong): a
    hand-edited or hostile provenance.json."""
    import hashlib

    from attnforge.cache.key import CacheKey, CacheKeyInputs

    wheel = make_wheel(tmp_path / f"crafted-{len(version)}-{filename is None}", name="af-evil", version="1.0.0")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    inputs = CacheKeyInputs(name="af-evil", version=version, source_sha256=sha, python_tag="py3", platform_tag="any")
    key = CacheKey.of(inputs)
    folder = store.artifacts_dir / key.digest
    folder.mkdir(parents=True)
    (folder / wheel.name).write_bytes(wheel.read_bytes())
    doc = {"schema": 1, "key": str(key), "inputs": inputs.to_json(), "filename": filename or wheel.name,
           "sha256": sha, "size_bytes": wheel.stat().st_size, "created_at": "2026-12-03T00:00:00+00:00", "details": {}}
    (folder / "provenance.json").write_text(json.dumps(doc))
    return folder


def test_repair_quarantines_a_bad_version_or_file_name_and_indexes_the_rest(
        filled: tuple[Store, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A recorded version that is not a version (``packaging``'s InvalidVersion) or a file name with a NUL byte
    (``os.lstat``'s ValueError) crashed ``cache repair`` ("internal error") on every run, the good entries left
    without rows (CLI fuzz, 2026-12-03): each is now that entry's problem, quarantined with its reason."""
    store, keys = filled
    bad = [_crafted_entry(store, tmp_path, version="not a version!"),
           _crafted_entry(store, tmp_path, version="1.0.0", filename="af_evil-1.0.0-py3-none-any\x00.whl")]
    _clear(store.db_path)
    code, text = _cli(capsys, "cache", "repair")
    assert code == 1 and "internal error" not in text, text
    assert "indexed 2 artifacts" in text and "2 quarantined" in text, text
    assert sorted(e.key for e in Store(store.root).list()) == sorted(keys)
    assert not any(folder.exists() for folder in bad)
    reasons = " ".join(p.read_text() for p in store.quarantine_dir.rglob("reason.txt"))
    assert "is not a version" in reasons and "NUL" in reasons


def test_a_cache_lock_that_is_a_directory_is_named_with_the_fix(
        filled: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    store, keys = filled
    (store.root / "cache.lock").unlink(missing_ok=True)
    (store.root / "cache.lock").mkdir()
    assert Store(store.root).get(keys[0]).is_file()  # readers and installs need no lock
    export = store.root.parent / "export"
    assert _cli(capsys, "cache", "export", str(export))[0] == 0
    for argv in (("cache", "prune"), ("cache", "repair"), ("cache", "import", str(export)), ("cache", "rm", "sha256:")):
        code, text = _cli(capsys, *argv)
        if argv[-1] == "sha256:":
            assert code == 2  # bad input is checked before the lock
            continue
        assert code == 1, text
        assert "cache.lock" in text and "is a directory" in text and "rm -r" in text, text
    assert not store.quarantine_dir.exists()  # the import's entries were not blamed for the store's lock


@pytest.mark.parametrize("folder", ["artifacts", "quarantine"])
def test_a_store_folder_that_is_a_file_is_named_with_the_fix(
        folder: str, attnforge_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    attnforge_home.mkdir()
    (attnforge_home / folder).write_text("x")
    for verb in ("list", "verify", "repair"):
        code, text = _cli(capsys, "cache", verb)
        assert code == 1 and f"{attnforge_home / folder} is not a directory" in text and "hint:" in text, text


@pytest.mark.parametrize("damage", ["garbage", "verify-lacks-a-column", "bench-lacks-a-column"])
def test_repair_moves_a_damaged_records_db_aside_and_records_work_again(
        attnforge_home: Path, capsys: pytest.CaptureFixture[str], damage: str) -> None:
    """A records.db whose table lacks a column passed ``PRAGMA quick_check``: repair kept it while every read said
    "damaged, run cache repair" (CLI fuzz, 2026-12-03). A column a later version added (``_BENCH_ADDED``) is no
    damage: an older file is read without it and migrated on its next write."""
    if damage == "garbage":
        HOMES["records-garbage"](attnforge_home)
    else:
        table = damage.split("-", maxsplit=1)[0]
        RecordStore(attnforge_home).add_verify(VerifyRecord(device_key="k", backend="sdpa", backend_version=None,
                                                            ok=True, summary="ok"))
        _sqlite(attnforge_home / "records.db", f"DROP TABLE {table}", f"CREATE TABLE {table} (id INTEGER)")
    code, text = _cli(capsys, "cache", "repair")
    assert code == 0 and "records.db was damaged; moved to" in text, text
    assert len(list(attnforge_home.glob("records.db.damaged-*"))) == 1
    store = RecordStore(attnforge_home)
    store.add_verify(VerifyRecord(device_key="k", backend="sdpa", backend_version=None, ok=True, summary="ok"))
    assert list(store.latest_verify("k")) == ["sdpa"]
    assert "records.db" not in _cli(capsys, "cache", "repair")[1]  # sound now: nothing moved


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_doctor_reports_from_a_home_whose_records_cannot_be_read(
        case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ATTNFORGE_HOME", str(HOMES[case](tmp_path / "home")))
    code = main(["doctor", "--json", "--snapshot", str(CPU_SNAPSHOT)])
    got = capsys.readouterr()
    assert code == 1  # the CPU snapshot's verdict: only the CPU fallback runs there
    assert json.loads(got.out)["kind"] == "doctor"
    assert "warning:" in got.err and "hint:" in got.err, got.err
    assert "records.db" in got.err or "attnforge home" in got.err, got.err


@pytest.mark.parametrize("verb", [["verify", "sdpa-math"], ["bench", "--seqlen", "64"]])
@pytest.mark.parametrize("case", ["records-garbage", "records-directory", "home-is-a-file"])
def test_verify_and_bench_say_before_the_work_that_they_cannot_store_and_where(
        verb: list[str], case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ATTNFORGE_HOME", str(home := HOMES[case](tmp_path / "home")))
    code, text = _cli(capsys, *verb)
    assert code == (2 if case == "home-is-a-file" else 1), text
    assert "error:" in text and "hint:" in text, text
    assert str(home) in text


def test_no_traceback_from_a_real_process_in_a_damaged_home(filled: tuple[Store, list[str]]) -> None:
    store, _ = filled
    _garbage(store.db_path)
    HOMES["records-directory"](store.root)
    env = {**os.environ, "ATTNFORGE_HOME": str(store.root), "PYTHONPATH": str(SRC), "NO_COLOR": "1"}
    for argv in (["cache", "list"], ["cache", "verify"], ["doctor", "--snapshot", str(CPU_SNAPSHOT)]):
        done = subprocess.run([sys.executable, "-m", "attnforge", *argv], capture_output=True, text=True, env=env,
                              timeout=120, check=False)
        text = done.stdout + done.stderr
        assert "Traceback" not in text, text
        assert "hint:" in text, text


def test_repair_finds_damage_that_a_lookup_by_key_does_not_read(attnforge_home: Path) -> None:
    """A probe lookup reads only the index's pages; repair checks every page (``PRAGMA quick_check``), so a records.db
    whose table pages are garbled is moved aside, not called sound while every read says "run cache repair"."""
    store = RecordStore(attnforge_home)
    for i in range(400):
        store.add_verify(VerifyRecord(device_key=f"k{i % 7}", backend=f"b{i}", backend_version=None, ok=True,
                                      summary="x" * 200))
    with contextlib.closing(sqlite3.connect(store.path)) as conn:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'verify'").fetchone()[0]
    with store.path.open("r+b") as fh:
        fh.seek((root - 1) * page_size)
        fh.write(b"\xff" * page_size)
    moved = store.repair(1_800_000_000.0)
    assert moved is not None and moved.exists() and not store.path.exists()


@pytest.mark.parametrize("db_first", [False, True], ids=["no-cache-db-yet", "a-cache-db-without-its-table-yet"])
def test_a_reader_meeting_a_writers_first_entry_does_not_call_the_index_damaged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db_first: bool) -> None:
    """A reader takes no lock. In a fresh home a writer may make ``cache.db``, its table and the first entry while a
    reader looks: the reader counted that entry after finding no table (or no file) and called the index damaged
    ("it has no table of entries while 1 artifacts lie", one of eight concurrent installs, 2026-12-01). Here the
    writer's first entry is made at the moment the reader counts the entries on disk."""
    home = tmp_path / "home"
    wheel = make_wheel(tmp_path / "dist")
    writer = Store(home)
    if db_first:  # a writer's connection made the file, not yet its table
        home.mkdir(parents=True)
        sqlite3.connect(writer.db_path).close()
    real = Store.entry_dirs
    made: list[str] = []

    def entry_dirs(self: Store) -> list[Path]:
        if self is not writer and not made:
            made.append(writer.put(wheel, inputs_for(wheel), provenance={"host": "test"}).entry.key)
        return real(self)

    monkeypatch.setattr(Store, "entry_dirs", entry_dirs)
    entries = Store(home).list()
    assert [e.key for e in entries] == made


def test_repair_keeps_a_records_db_from_before_a_column_was_added(
        attnforge_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A records.db written before ``rounds`` and ``layout`` were added to its bench table is an older file, not a
    damaged one: repair leaves it, and its rows are still read."""
    store = RecordStore(attnforge_home)
    store.add_verify(VerifyRecord(device_key="k", backend="sdpa", backend_version=None, ok=True, summary="ok"))
    _sqlite(attnforge_home / "records.db", "ALTER TABLE bench DROP COLUMN rounds",
            "ALTER TABLE bench DROP COLUMN layout")
    code, text = _cli(capsys, "cache", "repair")
    assert code == 0 and "records.db was damaged" not in text, text
    assert not list(attnforge_home.glob("records.db.damaged-*"))
    assert list(RecordStore(attnforge_home).latest_verify("k")) == ["sdpa"]
