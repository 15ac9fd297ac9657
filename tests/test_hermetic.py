"""Every test has its own ATTNFORGE_HOME, and a test that reaches the user's real cache fails loudly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge._system.paths import home_dir
from tests.conftest import REAL_HOME, REPO


def test_each_test_gets_its_own_home(tmp_path: Path) -> None:
    assert Path(os.environ["ATTNFORGE_HOME"]) == tmp_path / "afhome"
    assert home_dir(os.environ) == tmp_path / "afhome"
    assert home_dir(os.environ) != REAL_HOME


def test_a_subprocess_inherits_the_test_home(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.environ['ATTNFORGE_HOME'])"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(tmp_path / "afhome")


def test_the_fallback_without_attnforge_home_is_not_the_real_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATTNFORGE_HOME")
    assert home_dir(os.environ) != REAL_HOME
    assert "TRIPWIRE" in str(home_dir(os.environ))


@pytest.mark.integration
def test_a_test_that_writes_the_fallback_home_fails_loudly(tmp_path: Path) -> None:
    """Run a tiny test module under this repo's conftest: it unsets ATTNFORGE_HOME and opens the store."""
    probe = REPO / "tests" / f"test_zz_tripwire_{os.getpid()}.py"
    probe.write_text(
        "import os\n"
        "from attnforge._system.paths import home_dir\n"
        "def test_leaks(monkeypatch):\n"
        "    monkeypatch.delenv('ATTNFORGE_HOME')\n"
        "    home_dir(os.environ).mkdir(parents=True)\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(probe), "--basetemp",
             str(tmp_path / "bt")],
            capture_output=True, text=True, cwd=REPO, timeout=300,
        )
    finally:
        probe.unlink()
    assert done.returncode == 1, done.stdout
    assert "reached the user's real attnforge cache" in done.stdout
