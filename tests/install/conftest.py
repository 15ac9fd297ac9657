"""Fixtures of the install-flow tests (tests/install/test_flow*.py): the CPU development machine's snapshot, and
a fresh nested venv to install into."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnforge.probe.snapshot import SystemSnapshot
from tests.conftest import REPO
from tests.venvs import nested_venv

SNAPSHOT = REPO / "tests" / "fixtures" / "snapshots" / "cpu_dev_torch2.13_cpu.json"


@pytest.fixture
def snapshot() -> SystemSnapshot:
    return SystemSnapshot.load(SNAPSHOT)


@pytest.fixture
def python(tmp_path: Path) -> str:
    return nested_venv(tmp_path / "venv")
