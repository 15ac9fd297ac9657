"""Shared fixtures. GPU tests skip themselves on machines without a CUDA GPU.

Every test is hermetic: it runs with its own empty ``ATTNFORGE_HOME`` (inherited by the subprocesses it starts),
and a tripwire fails it loudly if it reaches the user's real cache (``~/.cache/attnforge``) anyway, in process
(``ATTNFORGE_HOME`` unset: the platformdirs fallback is redirected to the tripwire) or in a subprocess (the real
cache directory's listing is compared before and after the session).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import platformdirs as _platformdirs
import pytest

from attnforge._system import compile_cache as _compile_cache

# Tests never list the real wheel sources (GitHub, download.pytorch.org); tests of them turn this back on and
# point GITHUB_API_URL at a server on 127.0.0.1 (tests/resolve/test_wheel_sources_http.py).
os.environ.setdefault("ATTNFORGE_WHEEL_SOURCES", "off")

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src"


def _has_cuda_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


#: The user's real cache, computed once before any test changes the environment.
REAL_HOME = Path(os.environ.get("ATTNFORGE_HOME") or _platformdirs.user_cache_dir("attnforge", appauthor=False))


def _listing(root: Path) -> dict[str, tuple[int, int]]:
    """name -> (size, mtime_ns) of everything under ``root`` (empty when it does not exist)."""
    if not root.is_dir():
        return {}
    out: dict[str, tuple[int, int]] = {}
    for path in root.rglob("*"):
        try:
            st = path.lstat()
        except OSError:
            continue
        out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture(scope="session", autouse=True)
def _real_home_untouched() -> Iterator[None]:
    """Fail the session loudly if any test (or a subprocess of one) wrote the user's real attnforge cache."""
    before = _listing(REAL_HOME)
    yield
    after = _listing(REAL_HOME)
    changed = sorted(k for k in after.keys() | before.keys() if before.get(k) != after.get(k))
    if changed:
        pytest.fail(f"tests wrote the user's real attnforge cache {REAL_HOME}: {changed[:10]}; every test must "
                    "use its own ATTNFORGE_HOME (tests/conftest.py sets one)", pytrace=False)


@pytest.fixture(autouse=True)
def attnforge_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty ATTNFORGE_HOME for every test (created lazily by whatever uses it).

    When a test unsets ``ATTNFORGE_HOME``, the platformdirs fallback points at a tripwire directory; the test
    fails if anything was created there (it would have been the user's real cache).
    """
    home = tmp_path / "afhome"
    monkeypatch.setenv("ATTNFORGE_HOME", str(home))
    # the compile caches attnforge points into a home (attnforge._system.compile_cache) start unset, as in a fresh
    # process: left from an earlier test they name another test's home, and a monkeypatch restoring one of them
    # makes attnforge take it for the user's own setting
    for variable in (_compile_cache.FA4_ENABLED, *_compile_cache.FOLDERS):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(_compile_cache, "_OURS", {})
    tripwire = tmp_path / "REAL-USER-CACHE-TRIPWIRE"
    real = _platformdirs.user_cache_dir

    def guarded(appname: str | None = None, *args: Any, **kwargs: Any) -> str:
        if appname == "attnforge":
            return str(tripwire / "attnforge")
        return str(real(appname, *args, **kwargs))

    monkeypatch.setattr(_platformdirs, "user_cache_dir", guarded)
    yield home
    if tripwire.exists():
        pytest.fail("this test reached the user's real attnforge cache (ATTNFORGE_HOME unset, fell back to "
                    f"{REAL_HOME}); give it its own ATTNFORGE_HOME", pytrace=False)


@pytest.fixture
def cli_env(attnforge_home: Path) -> dict[str, str]:
    """Environment for running ``python -m attnforge`` in a subprocess against this checkout's src/."""
    env = dict(os.environ)
    # no empty entry: it would mean the working directory, which a test may have deleted (Python cannot start)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    env["ATTNFORGE_HOME"] = str(attnforge_home)
    return env


@pytest.fixture
def attnforge_argv() -> list[str]:
    """argv prefix that runs this checkout's attnforge in a subprocess."""
    return [sys.executable, "-m", "attnforge"]


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """Ctrl-C (SIGINT) raises KeyboardInterrupt in this process during the test, however the run was started: a
    process launched in the background by a non-interactive shell (``setsid cmd &``, ``nohup``) inherits SIGINT
    ignored, and a test that sends itself SIGINT then sees nothing happen (seen 2026-11-28: CI's script started
    with ``setsid ... &`` failed exactly the two tests that use this)."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
