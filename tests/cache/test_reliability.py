"""The store under real failures: a writer SIGKILLed mid-store, a real full disk (tmpfs), a real pip."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnforge.cache import CacheKey, Store
from attnforge.cache.share import export
from attnforge.errors import CacheError
from tests.cache.conftest import inputs_for, mounted_tmpfs
from tests.cache.wheelmaker import make_wheel
from tests.conftest import REPO, SRC
from tests.venvs import nested_venv

pytestmark = pytest.mark.integration

_CHILD = textwrap.dedent(
    """
    import hashlib, sys, time
    from pathlib import Path
    sys.path[:0] = [{src!r}, {repo!r}]
    from attnforge.cache import Store
    from attnforge.cache._files import copy_hashed
    from tests.cache.conftest import inputs_for

    def slow_copy(src, dst):
        if src.suffix != ".whl":
            return copy_hashed(src, dst)
        data = src.read_bytes()
        with dst.open("wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            print("HALF", flush=True)
            time.sleep({pause_s})
            f.write(data[len(data) // 2 :])
        return hashlib.sha256(data).hexdigest()

    wheel = Path(sys.argv[1])
    Store(Path(sys.argv[2]), copy_file=slow_copy).put(wheel, inputs_for(wheel))
    print("STORED", flush=True)
    """
)


def _start_writer(home: Path, wheel: Path, pause_s: float) -> subprocess.Popen[str]:
    code = _CHILD.format(src=str(SRC), repo=str(REPO), pause_s=pause_s)
    return subprocess.Popen(
        [sys.executable, "-c", code, str(wheel), str(home)], stdout=subprocess.PIPE, text=True
    )


def _sigkill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    if proc.stdout is not None:
        proc.stdout.close()


def _assert_nothing_installable(store: Store, key: CacheKey) -> None:
    assert store.list() == []
    assert store.cached_artifacts() == []
    with pytest.raises(CacheError, match="no cache entry"):
        store.get(key)


def test_sigkill_while_copying_leaves_no_entry(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "dist", padding_bytes=200_000)
    home = tmp_path / "home"
    proc = _start_writer(home, wheel, pause_s=60)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "HALF"
    _sigkill(proc)
    store = Store(home, lock_timeout_s=10)
    key = CacheKey.of(inputs_for(wheel))
    _assert_nothing_installable(store, key)
    assert any(p.name.startswith(".staging-") for p in store.artifacts_dir.iterdir())  # the debris is there
    assert store.put(wheel, inputs_for(wheel)).stored  # the dead writer's lock is gone; debris is cleared
    assert [p.name for p in store.artifacts_dir.iterdir()] == [key.digest]
    assert store.get(key).read_bytes() == wheel.read_bytes()


def test_sigkill_between_rename_and_commit_leaves_no_entry(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "dist")
    home = tmp_path / "home"
    store = Store(home, lock_timeout_s=10)
    store._connect().close()  # create the database (a read never creates it)
    key = CacheKey.of(inputs_for(wheel))
    blocker = sqlite3.connect(store.db_path, timeout=1)
    blocker.execute("BEGIN IMMEDIATE")  # the writer's INSERT now waits, after its rename
    try:
        proc = _start_writer(home, wheel, pause_s=0)
        deadline = time.monotonic() + 60
        while not (store.artifacts_dir / key.digest / "provenance.json").exists():
            assert time.monotonic() < deadline, "writer never renamed its entry into place"
            assert proc.poll() is None
            time.sleep(0.02)
        _sigkill(proc)
    finally:
        blocker.rollback()
        blocker.close()
    _assert_nothing_installable(store, key)
    assert store.put(wheel, inputs_for(wheel)).stored


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "tmpfs", "1m") as mount:
        yield mount


def test_real_full_disk_fails_cleanly(tiny_tmpfs: Path, tmp_path: Path) -> None:
    store = Store(tiny_tmpfs / "home")
    small = make_wheel(tmp_path / "small", version="1.0")
    small_key = store.put(small, inputs_for(small)).entry.key
    big = make_wheel(tmp_path / "big", version="2.0", padding_bytes=2_000_000)
    with pytest.raises(CacheError, match="not enough disk space") as info:
        store.put(big, inputs_for(big))
    assert "No space left" in (info.value.cause or "")
    assert [e.key for e in store.list()] == [small_key]
    assert not any(p.name.startswith(".staging-") for p in store.artifacts_dir.iterdir())
    assert store.get(small_key).read_bytes() == small.read_bytes()


def test_pip_installs_from_an_export_into_a_fresh_venv(store: Store, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "dist", version="1.0+cu13.0", value=7)
    store.put(wheel, inputs_for(wheel))
    result = export(store, tmp_path / "share")
    env_dir = tmp_path / "venv"
    python = Path(nested_venv(env_dir))  # sees this process's packages, also when the tests run in a venv
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    done = subprocess.run(
        [*pip, "install", "--no-cache-dir", "--index-url", result.index_url, "af-pure-fixture"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = subprocess.run([str(python), "-c", "import af_pure_fixture as m; print(m.VALUE)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "7"

