"""Error paths of the command line that ended as tracebacks, internal errors or wrong records (review of 2026-12-02):
a file-system fault under any verb (F1), torch that does not import (F5), a shape that does not fit in memory (F3),
a full disk under records.db (F6), a home that is a symlink loop (F7). Each ends in ``error:`` + ``hint:``, never a
traceback or "internal error", and under ``--json`` as a JSON error document on stdout."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from attnforge.cli import main
from attnforge.errors import AttnforgeError, CacheError, UsageError
from attnforge.records import BenchRecord, RecordStore, VerifyRecord
from tests.conftest import REPO, SRC

CPU_SNAPSHOT = str(REPO / "tests" / "fixtures" / "snapshots" / "cpu_dev_torch2.13_cpu.json")
EXT_PKG = str(REPO / "tests" / "fixtures" / "ext_pkg")  # C++ only: passes the CPU snapshot's preflight
_NO_DAC = "-dac_override,-dac_read_search,-fowner"
needs_root = pytest.mark.skipif(
    os.name != "posix" or os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to act as a user that file permissions apply to",
)


def run_cli(home: Path, *args: str, pythonpath: str = str(SRC), python_c: str | None = None,
            unprivileged: bool = False) -> subprocess.CompletedProcess[str]:
    """``python -m attnforge ARGS`` (or ``python -c PYTHON_C ARGS``) in a real process with ``ATTNFORGE_HOME=home``."""
    prefix = ["setpriv", f"--bounding-set={_NO_DAC}", f"--inh-caps={_NO_DAC}"] if unprivileged else []
    env = {**os.environ, "ATTNFORGE_HOME": str(home), "PYTHONPATH": pythonpath, "NO_COLOR": "1"}
    entry = ["-c", python_c] if python_c is not None else ["-m", "attnforge"]
    return subprocess.run([*prefix, sys.executable, *entry, *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def assert_clean(done: subprocess.CompletedProcess[str], code: int = 1) -> str:
    text = done.stdout + done.stderr
    assert done.returncode == code, text
    assert "Traceback" not in text, text
    assert "internal error" not in text and "a bug in attnforge" not in text, text
    assert "error:" in done.stderr and "hint:" in done.stderr, text
    return text


def json_error(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    doc = json.loads(done.stdout)
    assert (doc["schema_version"], doc["kind"]) == (1, "error"), doc
    assert doc["error"]["hint"], doc
    error: dict[str, Any] = doc["error"]
    return error


# -- F1: a file-system fault under any verb ---------------------------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_build_with_a_file_where_the_logs_folder_goes_names_it_and_the_fix(as_json: bool, tmp_path: Path) -> None:
    """``<home>/logs`` a file: ``FileExistsError`` was re-raised by ``main`` as a raw traceback (nothing on stdout
    under ``--json``)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "logs").write_text("not a folder\n")
    done = run_cli(home, "build", "--source", EXT_PKG, "--snapshot", CPU_SNAPSHOT, *(["--json"] if as_json else []))
    text = assert_clean(done)
    assert f"{home / 'logs'} is a file where attnforge needs a folder" in text
    assert f"mv {home / 'logs'}" in text
    if as_json:
        assert "is a file where attnforge needs a folder" in json_error(done)["message"]


@needs_root
def test_build_in_a_read_only_home_says_the_home_is_not_writable(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o555)
    try:
        done = run_cli(home, "build", "--source", EXT_PKG, "--snapshot", CPU_SNAPSHOT, "--json", unprivileged=True)
    finally:
        home.chmod(0o755)
    assert_clean(done)
    error = json_error(done)
    assert error["message"].startswith(f"ATTNFORGE_HOME {home} is not writable"), error
    assert "set ATTNFORGE_HOME to a writable folder" in error["hint"]


def _fault(home: Path, tmp_path: Path, case: str) -> tuple[OSError, type[Exception], int, str]:
    """An OSError as the OS raises it for ``case`` (made for real on disk where that is cheap), the error type, exit
    code and words the user must see."""
    if case == "file-in-place-of-a-folder":
        home.mkdir()
        (home / "staging").write_text("x")
        try:
            (home / "staging" / "0123").mkdir(parents=True)
        except OSError as exc:
            return exc, AttnforgeError, 1, f"{home / 'staging'} is a file where attnforge needs a folder"
    if case == "home-symlink-loop":
        home.symlink_to(home)
        try:
            (home / "logs").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return exc, UsageError, 2, "is a symlink loop"
    if case == "permission-in-home":
        exc = PermissionError(errno.EACCES, "Permission denied", str(home / "build"))
        return exc, AttnforgeError, 1, f"ATTNFORGE_HOME {home} is not writable"
    if case == "permission-elsewhere":
        exc = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "plot.png"))
        return exc, AttnforgeError, 1, f"cannot use {tmp_path / 'plot.png'}: Permission denied"
    if case == "no-space":
        return OSError(errno.ENOSPC, "No space left on device", str(home / "x")), CacheError, 1, "disk space"
    if case == "read-only-fs":
        return OSError(errno.EROFS, "Read-only file system", str(home / "x")), CacheError, 1, "read-only"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["file-in-place-of-a-folder", "home-symlink-loop", "permission-in-home",
                                  "permission-elsewhere", "no-space", "read-only-fs"])
def test_every_os_error_is_a_named_error_with_a_hint(case: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from attnforge.cli._output import os_error

    home = tmp_path / "home"
    monkeypatch.setenv("ATTNFORGE_HOME", str(home))
    exc, kind, code, words = _fault(home, tmp_path, case)
    err = os_error(exc)
    assert type(err) is kind, (type(err), err)
    assert err.exit_code == code
    assert words in err.message, err.message
    assert err.hint and "internal error" not in err.message


# -- F5: torch that does not import -------------------------------------------------------------------------------

VERBS = [["verify", "sdpa-math"], ["bench", "sdpa-math", "--seqlen", "64"],
         ["warmup", "--shapes", "model", "--batch", "1", "--heads", "2", "--head-dim", "16", "--seqlen", "16"]]


@pytest.fixture
def broken_torch(tmp_path: Path) -> str:
    """A PYTHONPATH whose first ``torch`` package raises on import (torch as a broken install leaves it)."""
    fake = tmp_path / "fake-site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("libtorch_cpu.so: cannot open shared object file")\n')
    return os.pathsep.join([str(fake.parent), str(SRC)])


@pytest.mark.parametrize("verb", VERBS, ids=[v[0] for v in VERBS])
def test_a_torch_that_fails_to_import_is_named_with_its_error_and_the_install(
        verb: list[str], broken_torch: str, attnforge_home: Path) -> None:
    done = run_cli(attnforge_home, *verb, "--json", pythonpath=broken_torch)
    assert_clean(done)
    error = json_error(done)
    assert f"`attnforge {verb[0]}` needs torch, and torch fails to import" in error["message"], error
    assert "libtorch_cpu.so: cannot open shared object file" in error["message"]
    assert "pip install torch" in error["hint"]


def test_torch_that_is_not_installed_says_so(attnforge_home: Path) -> None:
    no_torch = "import sys; sys.modules['torch'] = None; from attnforge.cli import main; sys.exit(main(sys.argv[1:]))"
    done = run_cli(attnforge_home, "verify", "sdpa-math", python_c=no_torch)
    text = assert_clean(done)
    assert f"torch is not installed in {sys.executable}" in text
    assert f"{sys.executable} -m pip install torch" in text


# -- F3: a shape that does not fit --------------------------------------------------------------------------------


def test_a_shape_too_large_for_memory_is_a_bench_error_never_a_verify_record(attnforge_home: Path) -> None:
    """``--seqlen 100000000``: the child raised UnboundLocalError, which the parent stored as a failed verify of
    every backend (doctor then said sdpa-math "verified: NO")."""
    done = run_cli(attnforge_home, "bench", "sdpa-math", "--device", "cpu", "--shapes", "model", "--batch", "1",
                   "--heads", "8", "--head-dim", "64", "--seqlen", "100000000", "--mode", "fwd", "--causal", "off",
                   "--json")
    text = done.stdout + done.stderr
    assert done.returncode == 1, text  # nothing measured
    assert "Traceback" not in text and "UnboundLocalError" not in text and "crashed" not in text, text
    doc = json.loads(done.stdout)
    cells = [c for row in doc["rows"] for c in row["cells"]]
    assert cells and all(c["status"] == "error" and c["detail"].startswith("does not fit") for c in cells), cells
    assert all("--seqlen" in c["detail"] for c in cells)
    store = RecordStore(attnforge_home)
    assert all(not store.latest_verify(key) for key in _keys(store))  # no verdict was recorded


@pytest.mark.parametrize(("raised", "detail"), [
    pytest.param(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you "
                              "tried to allocate 25600000000 bytes."), "does not fit: ", id="allocator"),
    pytest.param(MemoryError(), "does not fit: ", id="memory-error"),
    pytest.param(TypeError("randn(): unsupported dtype"), "its inputs could not be made: ", id="other"),
])
def test_inputs_that_cannot_be_made_are_error_cells_of_the_shape(raised: Exception, detail: str) -> None:
    """``run_bench`` raised UnboundLocalError (``inputs``) where the shape's inputs could not be allocated."""
    from attnforge.backends.registry import adapters, fallback
    from attnforge.bench.grid import model_shapes
    from attnforge.bench.run import CellStatus, run_bench
    from attnforge.bench.timing import TimerMethod, TimingConfig
    from attnforge.types.shapes import Mode
    from attnforge.verify.device import current_device

    def make_inputs(*args: object) -> list[tuple[Any, ...]]:
        raise raised

    [shape] = model_shapes(batch=1, heads_q=2, heads_kv=2, head_dims=(16,), seqlens=(8,), seqlen_k=None,
                           dtype="float32", causals=(False,), modes=(Mode.FWD,))
    report = run_bench([shape], adapters={"sdpa": fallback(), "sdpa-math": adapters()["sdpa-math"]}, baseline="sdpa",
                       device=current_device("cpu"), make_inputs=make_inputs,
                       timing=TimingConfig(warmup_ms=1.0, rep_ms=2.0, min_reps=1, max_reps=2,
                                           method=TimerMethod.PERF_COUNTER))
    cells = report.rows[0].cells
    assert [c.status for c in cells] == [CellStatus.ERROR, CellStatus.ERROR]
    assert all(c.detail.startswith(detail) for c in cells), [c.detail for c in cells]


def _keys(store: RecordStore) -> list[str]:
    import contextlib
    import sqlite3

    if not store.path.exists():
        return []
    with contextlib.closing(sqlite3.connect(store.path)) as conn:
        return [str(r[0]) for r in conn.execute("SELECT DISTINCT device_key FROM verify")]


# -- F6: a full disk under records.db ----------------------------------------------------------------------------


@pytest.fixture
def full_disk_home(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A home on a real 1 MiB tmpfs with a sound records.db (a verdict of this CPU), then the disk filled to the
    last byte: SQLite's normal open of the WAL database then fails with "disk I/O error" (its -shm cannot grow)."""
    from attnforge.verify.device import current_device
    from tests.cache.conftest import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "mnt", "1m") as mount:
        home = mount / "home"
        key = current_device("cpu").key
        RecordStore(home).add_verify(VerifyRecord(device_key=key, backend="sdpa-math", backend_version=None, ok=True,
                                                  summary="ok"))
        assert _fill(mount / "fill") == errno.ENOSPC
        yield home, key


def _fill(path: Path) -> int | None:
    """Write ``path`` until the disk refuses; the errno it refused with."""
    with path.open("wb", buffering=0) as f:
        while True:
            try:
                f.write(b"x" * 4096)
            except OSError as exc:
                return exc.errno


def test_records_on_a_full_disk_are_still_read_and_a_write_says_why_it_failed(
        full_disk_home: tuple[Path, str]) -> None:
    home, key = full_disk_home
    store = RecordStore(home)
    assert list(store.latest_verify(key)) == ["sdpa-math"]  # was: CacheError "disk I/O error", read as empty
    assert store.bench_records(key) == []
    with pytest.raises(CacheError, match="not enough disk space") as caught:
        store.add_bench([BenchRecord(device_key=key, backend="sdpa", backend_version=None, dtype="float32",
                                     mode="fwd", causal=False, batch=1, heads_q=2, heads_kv=2, head_dim=16,
                                     seqlen_q=8, seqlen_k=8, ms=1.0, tflops=1.0, peak_mem_bytes=None, run_id="r")])
    assert caught.value.message.startswith("the records were not saved")


@pytest.mark.parametrize("verb", VERBS, ids=[v[0] for v in VERBS])
def test_writers_on_a_full_disk_exit_1_saying_the_records_cannot_be_saved(
        verb: list[str], full_disk_home: tuple[Path, str]) -> None:
    home, _ = full_disk_home
    done = run_cli(home, *verb, "--device", "cpu")
    text = assert_clean(done)
    assert "could not be saved" in text and "not enough disk space" in text and str(home) in text, text


def test_attention_on_a_full_disk_reads_its_records_and_serves(full_disk_home: tuple[Path, str]) -> None:
    home, key = full_disk_home
    child = ("import json, warnings, torch, attnforge\n"
             "from attnforge.dispatch import runtime\n"
             "with warnings.catch_warnings(record=True) as caught:\n"
             "    warnings.simplefilter('always')\n"
             "    q = torch.randn(1, 2, 8, 16)\n"
             "    out = attnforge.attention(q, q, q)\n"
             "    verified = runtime.get_dispatcher()._source().latest_verify(" + repr(key) + ")\n"
             "print(json.dumps({'equal': bool(torch.equal(out, torch.nn.functional.scaled_dot_product_attention("
             "q, q, q))), 'verified': sorted(verified), 'warnings': [str(w.message) for w in caught]}))\n")
    done = run_cli(home, python_c=child)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["equal"] is True
    assert got["verified"] == ["sdpa-math"], got  # was: empty (the read failed, the home served as an empty one)
    assert not [w for w in got["warnings"] if "StateWarning" in w or "records" in w], got


class _FullStore(RecordStore):
    """records.db whose writes fail as on a disk that filled up after ``check_writable`` (the seam the runtime's
    records take)."""

    def add_bench(self, records: list[BenchRecord]) -> None:
        raise CacheError(f"the records were not saved: not enough disk space to store bench records in {self.path}",
                         cause="disk I/O error", hint="free space there")


def test_warmup_whose_records_could_not_be_saved_exits_1_and_says_so(
        attnforge_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The runtime never raises: it warned once and kept the measurements in the process, and warmup exited 0."""
    import torch

    from attnforge.dispatch import runtime
    from attnforge.dispatch.state import RuntimeRecords
    from attnforge.verify.device import current_device
    from tests.cli.test_warmup import Kernel

    monkeypatch.setenv("ATTNFORGE_AUTOTUNE", "1")
    store = _FullStore(attnforge_home)
    store.add_verify(VerifyRecord(device_key=current_device("cpu").key, backend="kernel", backend_version=None,
                                  ok=True, summary="ok"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    previous = runtime.set_dispatcher(runtime.Dispatcher({"kernel": Kernel()}, records=RuntimeRecords(store)))
    try:
        code = main(["warmup", "--shapes", "model", "--batch", "1", "--heads", "2", "--head-dim", "16", "--seqlen",
                     "16", "--device", "cpu", "--mode", "fwd", "--budget", "0.02", "--rounds", "1", "--json"])
    finally:
        runtime.set_dispatcher(previous)
        torch.set_num_threads(threads)
    out, err = capsys.readouterr()
    assert code == 1, err
    doc = json.loads(out)
    assert doc["kind"] == "warmup" and doc["records_saved"] is False
    assert "not enough disk space" in doc["records_problems"][0]
    assert "error: the measurements of this warm-up were not saved" in err


# -- F7: a home that is a symlink loop ----------------------------------------------------------------------------


@pytest.mark.parametrize("verb", [["verify", "sdpa-math"], ["bench", "sdpa-math", "--seqlen", "64"]],
                         ids=["verify", "bench"])
def test_a_home_that_is_a_symlink_loop_is_named_as_such_not_as_damaged_records(
        verb: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    monkeypatch.setenv("ATTNFORGE_HOME", str(loop))
    assert main([*verb, "--device", "cpu", "--json"]) == 2  # ATTNFORGE_HOME names no usable folder: bad input
    got = capsys.readouterr()
    error = json.loads(got.out)["error"]
    assert "damaged" not in error["message"] and "cache repair" not in error["hint"], error
    assert f"{loop} cannot be used" in error["message"] and "symlink loop" in error["cause"], error
    assert "ATTNFORGE_HOME" in error["hint"]
