"""Faults injected for real: hostile exports and imports, a damaged database, a read-only or unusable home,
a full disk, and a second user on a shared export directory. Each ends with nothing lost or corrupted and
an ``error:``/``hint:`` message (never a traceback).

"Another user" is this process without the capabilities that let root ignore file permissions
(``setpriv`` drops CAP_DAC_OVERRIDE), so the tests need root and util-linux; they are skipped otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnforge.cache import CacheKey, Store
from attnforge.cache._provenance import MAX_PROVENANCE_BYTES, MAX_WHEEL_BYTES
from attnforge.cache.share import export
from attnforge.errors import CacheError
from tests.cache.conftest import inputs_for, mounted_tmpfs
from tests.cache.wheelmaker import make_wheel

SRC = Path(__file__).resolve().parents[2] / "src"
_NO_DAC = "-dac_override,-dac_read_search,-fowner"
needs_root = pytest.mark.skipif(
    os.name != "posix" or os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to act as a user that file permissions apply to",
)


def cli(home: Path, *args: str, unprivileged: bool = False) -> subprocess.CompletedProcess[str]:
    """``attnforge ARGS`` in a real process with ``ATTNFORGE_HOME=home`` (optionally without root's powers)."""
    prefix = ["setpriv", f"--bounding-set={_NO_DAC}", f"--inh-caps={_NO_DAC}"] if unprivileged else []
    env = {**os.environ, "ATTNFORGE_HOME": str(home), "PYTHONPATH": str(SRC), "NO_COLOR": "1"}
    return subprocess.run([*prefix, sys.executable, "-m", "attnforge", *args], capture_output=True, text=True,
                          env=env, timeout=120, check=False)


def assert_clean_error(done: subprocess.CompletedProcess[str], code: int = 1) -> None:
    text = done.stdout + done.stderr
    assert done.returncode == code, text
    assert "Traceback" not in text, text
    assert "error:" in text and "hint:" in text, text


@pytest.fixture
def filled(tmp_path: Path) -> Store:
    store = Store(tmp_path / "home")
    wheel = make_wheel(tmp_path / "dist")
    store.put(wheel, inputs_for(wheel), log_path=_log(tmp_path))
    return store


def _log(tmp_path: Path) -> Path:
    log = tmp_path / "build.log"
    log.write_text("compiled\n")
    return log


def _exported(store: Store, dest: Path) -> Path:
    export(store, dest)
    (entry_dir,) = (dest / "artifacts").iterdir()
    return entry_dir


# -- export into a shared directory ---------------------------------------------------------------------------


@pytest.mark.parametrize("planted", ["simple", "simple/af-pure-fixture", "artifacts"])
def test_export_refuses_a_planted_symlinked_dir(filled: Store, tmp_path: Path, planted: str) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / ".bashrc").write_text("mine\n")
    dest = tmp_path / "shared"
    (dest / planted).parent.mkdir(parents=True, exist_ok=True)
    (dest / planted).symlink_to(victim)
    with pytest.raises(CacheError, match="symlink"):
        export(filled, dest)
    assert sorted(p.name for p in victim.iterdir()) == [".bashrc"]
    assert (victim / ".bashrc").read_text() == "mine\n"


def test_export_refuses_a_planted_symlink_at_an_entry_dir(filled: Store, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (entry,) = filled.list()
    dest = tmp_path / "shared"
    (dest / "artifacts").mkdir(parents=True)
    (dest / "artifacts" / CacheKey.parse(entry.key).digest).symlink_to(victim)
    done = cli(filled.root, "cache", "export", str(dest))
    assert_clean_error(done)
    assert "symlink" in done.stderr and list(victim.iterdir()) == []


def test_export_replaces_a_planted_index_symlink_without_writing_through_it(filled: Store, tmp_path: Path) -> None:
    victim = tmp_path / "bashrc"
    victim.write_text("mine\n")
    dest = tmp_path / "shared"
    (dest / "simple").mkdir(parents=True)
    (dest / "simple" / "index.html").symlink_to(victim)
    for pid in range(os.getpid() - 2, os.getpid() + 3):  # the old predictable temp names
        (dest / "simple" / f".index.html.tmp-{pid}").symlink_to(victim)
    export(filled, dest)
    assert victim.read_text() == "mine\n"
    assert not (dest / "simple" / "index.html").is_symlink()
    assert "af-pure-fixture" in (dest / "simple" / "index.html").read_text()


def test_export_lock_held_elsewhere_times_out_with_a_message(filled: Store, tmp_path: Path) -> None:
    dest = tmp_path / "shared"
    dest.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import filelock,sys,time; l=filelock.FileLock(sys.argv[1]); l.acquire();"
         "print('held', flush=True); time.sleep(60)", str(dest / ".attnforge-export.lock")],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(CacheError, match="held its lock") as info:
            export(filled, dest, lock_timeout_s=0.5)
        assert "stale" in (info.value.hint or "")
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()


@needs_root
def test_stale_export_lock_of_another_user_is_a_clean_error(filled: Store, tmp_path: Path) -> None:
    dest = tmp_path / "shared"
    dest.mkdir()
    lock = dest / ".attnforge-export.lock"
    lock.write_text("")
    os.chown(lock, 65534, 65534)  # left behind by user "nobody"
    os.chmod(lock, 0o600)
    done = cli(filled.root, "cache", "export", str(dest), unprivileged=True)
    assert_clean_error(done)
    assert "lock" in done.stderr and "nobody" in done.stderr


# -- hostile imports ------------------------------------------------------------------------------------------


def _reject(store: Store, source: Path, home: Path, reason: str) -> None:
    before = store.list()
    done = cli(home, "cache", "import", str(source))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "rejected" in done.stdout and reason in done.stdout, done.stdout
    assert store.list() == before
    assert any((home / "quarantine").iterdir())


def test_import_refuses_a_symlinked_log_and_does_not_copy_what_it_points_at(filled: Store, tmp_path: Path) -> None:
    entry = _exported(filled, tmp_path / "out")
    secret = tmp_path / "secret"
    secret.write_text("private key\n")
    os.chmod(secret, 0o600)
    (entry / "build.log").unlink()
    (entry / "build.log").symlink_to(secret)
    fresh = Store(tmp_path / "fresh")
    _reject(fresh, tmp_path / "out", fresh.root, "symlink")
    for path in fresh.root.rglob("*"):
        assert not path.is_file() or "private key" not in path.read_text(errors="replace")


@pytest.mark.parametrize("what", ["wheel", "dir"])
def test_import_refuses_symlinked_wheels_and_entry_dirs(filled: Store, tmp_path: Path, what: str) -> None:
    entry = _exported(filled, tmp_path / "out")
    if what == "wheel":
        wheel = next(entry.glob("*.whl"))
        real = tmp_path / "elsewhere.whl"
        shutil.move(wheel, real)
        wheel.symlink_to(real)
    else:
        real = tmp_path / "elsewhere"
        shutil.move(entry, real)
        entry.symlink_to(real)
    fresh = Store(tmp_path / "fresh")
    _reject(fresh, tmp_path / "out", fresh.root, "symlink")


def test_import_refuses_oversized_files_without_reading_them(filled: Store, tmp_path: Path) -> None:
    entry = _exported(filled, tmp_path / "out")
    wheel = next(entry.glob("*.whl"))
    with wheel.open("r+b") as f:
        f.truncate(MAX_WHEEL_BYTES + 1)  # sparse: nothing is written
    fresh = Store(tmp_path / "fresh")
    _reject(fresh, tmp_path / "out", fresh.root, "over the limit")
    quarantined = next((fresh.root / "quarantine").iterdir())
    assert not (quarantined / wheel.name).exists()  # named in reason.txt, not copied
    assert wheel.name in (quarantined / "reason.txt").read_text()


def test_import_refuses_huge_provenance_and_bad_json(filled: Store, tmp_path: Path) -> None:
    entry = _exported(filled, tmp_path / "out")
    with (entry / "provenance.json").open("ab") as f:
        f.truncate(MAX_PROVENANCE_BYTES + 1)
    fresh = Store(tmp_path / "fresh")
    _reject(fresh, tmp_path / "out", fresh.root, "over the limit")
    (entry / "provenance.json").write_text("{not json")
    _reject(fresh, tmp_path / "out", fresh.root, "unreadable")


def test_import_refuses_a_wheel_with_dotdot_members_before_anything_is_stored(tmp_path: Path) -> None:
    src = Store(tmp_path / "src")
    wheel = make_wheel(tmp_path / "dist")
    src.put(wheel, inputs_for(wheel))
    entry = _exported(src, tmp_path / "out")
    evil = next(entry.glob("*.whl"))
    with zipfile.ZipFile(evil, "a") as zf:
        zf.writestr("../../evil.pth", "import os\n")
    doc = json.loads((entry / "provenance.json").read_text())
    from attnforge.cache._files import sha256_file

    doc["sha256"] = sha256_file(evil)
    (entry / "provenance.json").write_text(json.dumps(doc))
    fresh = Store(tmp_path / "fresh")
    _reject(fresh, tmp_path / "out", fresh.root, "outside its install dir")
    with pytest.raises(CacheError, match="outside its install dir"):
        fresh.put(evil, doc_inputs(doc))


def doc_inputs(doc: dict[str, object]):  # type: ignore[no-untyped-def]
    from attnforge.cache import CacheKeyInputs

    return CacheKeyInputs.from_json(doc["inputs"])  # type: ignore[arg-type]


# -- damaged metadata -----------------------------------------------------------------------------------------


def test_a_relabelled_torch_in_the_db_is_refused_at_install_time_and_by_verify(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    wheel = make_wheel(tmp_path / "dist")
    key = store.put(wheel, inputs_for(wheel, torch_version="2.12.0+cu130")).entry.key
    with sqlite3.connect(store.db_path) as conn:  # one byte: 2.12 -> 2.13
        conn.execute("UPDATE artifacts SET inputs = replace(inputs, '2.12.0', '2.13.0')")
    (entry,) = store.list()
    assert entry.inputs.torch_version == "2.13.0+cu130" and entry.problem is not None
    with pytest.raises(CacheError, match="not the hash of its recorded inputs"):
        store.get(key)
    assert store.list() == []  # quarantined on the way, never installed
    assert any((store.root / "quarantine").iterdir())


def test_verify_finds_flipped_wheels_bad_provenance_and_altered_keys(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    keys = []
    for v in ("1.0", "2.0", "3.0", "4.0"):
        w = make_wheel(tmp_path / v, version=v)
        keys.append(store.put(w, inputs_for(w)).entry.key)
    e2, e3 = store.show(keys[1]), store.show(keys[2])
    data = bytearray(Path(e2.path).read_bytes())
    data[len(data) // 2] ^= 0x01
    Path(e2.path).write_bytes(bytes(data))
    (Path(e3.path).parent / "provenance.json").write_text("{")
    with sqlite3.connect(store.db_path) as conn:
        conn.execute("UPDATE artifacts SET inputs = replace(inputs, 'cp311', 'cp312') WHERE version = '4.0'")
    done = cli(store.root, "cache", "verify")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "checked 4 entries" in done.stdout and "1 ok, 3 bad" in done.stdout, done.stdout
    assert [e.key for e in store.list()] == [keys[0]]
    assert cli(store.root, "cache", "verify").returncode == 0


def test_export_of_an_entry_with_corrupt_provenance_is_an_error(filled: Store, tmp_path: Path) -> None:
    (entry,) = filled.list()
    (Path(entry.path).parent / "provenance.json").write_text("{")
    done = cli(filled.root, "cache", "export", str(tmp_path / "out"))
    assert done.returncode == 1
    assert "exported 0 new" in done.stdout and "provenance.json" in done.stdout, done.stdout


@pytest.mark.slow
def test_random_byte_flips_in_the_db_never_give_a_traceback(filled: Store, tmp_path: Path) -> None:
    pristine = filled.db_path.read_bytes()
    size = len(pristine)
    for i, offset in enumerate(range(17, size, max(1, size // 12))):
        home = tmp_path / f"h{i}"
        shutil.copytree(filled.root, home)
        data = bytearray(pristine)
        data[offset] ^= 0xFF
        (home / "cache.db").write_bytes(bytes(data))
        for verb in (["cache", "list"], ["cache", "verify"]):
            done = cli(home, *verb)
            text = done.stdout + done.stderr
            assert "Traceback" not in text, (offset, text)
            assert done.returncode in (0, 1), (offset, text)
            if done.returncode == 1 and verb[1] == "list":
                assert "hint:" in text


# -- the state directory --------------------------------------------------------------------------------------


@needs_root
def test_a_read_only_home_lists_exports_and_verifies(filled: Store, tmp_path: Path) -> None:
    for path in [filled.root, *filled.root.rglob("*")]:
        os.chmod(path, 0o555 if path.is_dir() else 0o444)
    before = {p: p.stat().st_mtime_ns for p in filled.root.rglob("*")}
    try:
        listed = cli(filled.root, "cache", "list", "--json", unprivileged=True)
        assert listed.returncode == 0, listed.stderr
        assert len(json.loads(listed.stdout)["entries"]) == 1
        out = tmp_path / "out"
        out.mkdir()
        exported = cli(filled.root, "cache", "export", str(out), unprivileged=True)
        assert exported.returncode == 0, exported.stdout + exported.stderr
        assert "exported 1 new" in exported.stdout
        assert cli(filled.root, "cache", "verify", unprivileged=True).returncode == 0
        pruned = cli(filled.root, "cache", "prune", "--max-size", "0B", unprivileged=True)
        assert_clean_error(pruned)
        assert "ATTNFORGE_HOME" in pruned.stderr
    finally:
        for path in [filled.root, *filled.root.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
    assert {p: p.stat().st_mtime_ns for p in filled.root.rglob("*")} == before
    assert not (filled.root / "cache.db-shm").exists() or (filled.root / "cache.db-shm") in before


@needs_root
def test_a_read_only_home_reads_the_rows_a_killed_writer_left_in_its_wal(tmp_path: Path) -> None:
    """A writer killed before its checkpoint leaves ``cache.db-wal`` holding its committed rows; read through a
    read-only home (immutable) they were missed: ``cache list`` said the cache is empty, exit 0, and ``cache verify``
    called every entry unindexed (CLI fuzz, 2026-12-03)."""
    store = Store(tmp_path / "home")
    first = make_wheel(tmp_path / "first", name="af-first")
    keys = [store.put(first, inputs_for(first)).entry.key]  # the schema and a row, checkpointed at close
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1]); c.execute('select count(*) from artifacts')"
        ".fetchall(); print('holding', flush=True); time.sleep(120)"), str(store.db_path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        wheel = make_wheel(tmp_path / "dist")
        keys.append(store.put(wheel, inputs_for(wheel)).entry.key)  # its connection closes, the holder's keeps the WAL
    finally:
        holder.kill()  # as a crash: no checkpoint
        holder.communicate()
    assert (store.root / "cache.db-wal").stat().st_size > 0
    for path in [store.root, *store.root.rglob("*")]:
        os.chmod(path, 0o555 if path.is_dir() else 0o444)
    try:
        listed = cli(store.root, "cache", "list", "--json", unprivileged=True)
        assert listed.returncode == 0, listed.stderr
        assert sorted(e["key"] for e in json.loads(listed.stdout)["entries"]) == sorted(keys)
        verified = cli(store.root, "cache", "verify", unprivileged=True)
        assert verified.returncode == 0 and "unindexed" not in verified.stdout, verified.stdout + verified.stderr
    finally:
        for path in [store.root, *store.root.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)


@pytest.mark.parametrize("verb", [["cache", "list"], ["cache", "verify"], ["cache", "prune", "--older-than", "1d"],
                                  ["cache", "export", "OUT"], ["cache", "rm", "abcd"], ["verify"]])
def test_a_home_that_is_a_file_is_a_clean_error(tmp_path: Path, verb: list[str]) -> None:
    home = tmp_path / "home"
    home.write_text("not a directory\n")
    done = cli(home, *[str(tmp_path / "out") if v == "OUT" else v for v in verb])
    assert_clean_error(done, code=2)  # ATTNFORGE_HOME naming a file is bad input
    assert "is a file" in done.stderr


# -- a full disk ----------------------------------------------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "small", "400k") as mount:
        yield mount


def _fill(mount: Path, leave_bytes: int) -> None:
    """Fill the filesystem until at most ``leave_bytes`` are free."""
    st = os.statvfs(mount)
    free = st.f_bavail * st.f_frsize
    with (mount / "filler").open("wb") as f:
        try:
            f.write(b"\0" * max(0, free - leave_bytes))
            f.flush()
        except OSError:
            pass
    while os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize > leave_bytes:
        with (mount / "filler").open("ab") as f:
            try:
                f.write(b"\0" * 4096)
            except OSError:
                break


@pytest.mark.parametrize("free_kib", [0, 8, 24])
def test_list_prune_rm_work_on_a_full_disk(small_tmpfs: Path, tmp_path: Path, free_kib: int) -> None:
    home = small_tmpfs / "home"
    store = Store(home)
    keys = []
    for v in ("1.0", "2.0"):
        w = make_wheel(tmp_path / v, version=v, padding_bytes=64 << 10)  # removing one frees room for SQLite
        keys.append(store.put(w, inputs_for(w)).entry.key)
    _fill(small_tmpfs, free_kib * 1024)
    listed = cli(home, "cache", "list")
    assert listed.returncode == 0 and "2 entries" in listed.stdout, listed.stdout + listed.stderr
    # a prune that removes nothing opened a write transaction all the same: "disk I/O error", exit 1, while the
    # disk-full message itself recommends this very command (a CLI fuzz, 2026-12-03)
    nothing = cli(home, "cache", "prune", "--max-size", "20GB")
    assert nothing.returncode == 0 and "freed 0" in nothing.stdout, nothing.stdout + nothing.stderr
    removed = cli(home, "cache", "rm", keys[0])
    assert removed.returncode == 0, removed.stdout + removed.stderr
    pruned = cli(home, "cache", "prune", "--max-size", "0B")
    assert pruned.returncode == 0, pruned.stdout + pruned.stderr
    (small_tmpfs / "filler").unlink()
    assert Store(home).list() == []
    assert CacheKey.parse(keys[0]).digest not in {p.name for p in (home / "artifacts").iterdir()}


@pytest.mark.parametrize("free_kib", [0, 4, 16])
def test_export_onto_a_full_disk_is_a_clean_error_and_leaves_no_partial_index(
    small_tmpfs: Path, tmp_path: Path, free_kib: int
) -> None:
    store = Store(tmp_path / "home")
    for v in ("1.0", "2.0"):
        w = make_wheel(tmp_path / v, version=v, padding_bytes=32 << 10)
        store.put(w, inputs_for(w))
    _fill(small_tmpfs, free_kib * 1024)
    done = cli(store.root, "cache", "export", str(small_tmpfs / "out"))
    assert_clean_error(done)
    assert "disk space" in done.stderr
    leftovers = [p.name for p in (small_tmpfs / "out").rglob("*") if ".tmp" in p.name or ".staging-" in p.name]
    assert leftovers == []


def test_a_symlink_given_by_its_owner_is_stored_under_its_own_name(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "dist")
    link = tmp_path / "links" / wheel.name
    link.parent.mkdir()
    link.symlink_to(wheel)
    store = Store(tmp_path / "home")
    entry = store.put(link, inputs_for(wheel)).entry
    assert Path(entry.path).name == wheel.name and not Path(entry.path).is_symlink()
    with pytest.raises(CacheError, match="symlink"):  # an import never follows one
        Store(tmp_path / "home2").put(link, inputs_for(wheel), follow_symlinks=False)
