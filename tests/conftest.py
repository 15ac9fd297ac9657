"""Shared fixtures. GPU tests skip themselves on machines without a CUDA GPU."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

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


@pytest.fixture
def attnforge_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty ATTNFORGE_HOME for one test."""
    home = tmp_path / "afhome"
    monkeypatch.setenv("ATTNFORGE_HOME", str(home))
    return home


@pytest.fixture
def cli_env(attnforge_home: Path) -> dict[str, str]:
    """Environment for running ``python -m attnforge`` in a subprocess against this checkout's src/."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env["ATTNFORGE_HOME"] = str(attnforge_home)
    return env


@pytest.fixture
def attnforge_argv() -> list[str]:
    """argv prefix that runs this checkout's attnforge in a subprocess."""
    return [sys.executable, "-m", "attnforge"]
