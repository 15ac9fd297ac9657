"""The README keeps exactly two set-up commands, and .ci/run runs the test one verbatim."""

from __future__ import annotations

import re
import subprocess

from tests.conftest import REPO


def _commands() -> list[str]:
    return re.findall(r"^    \$ (.+)$", (REPO / "README.md").read_text(encoding="utf-8"), flags=re.MULTILINE)


def test_exactly_two_setup_commands() -> None:
    cmds = _commands()
    assert len(cmds) == 2, cmds
    assert "attnforge doctor" in cmds[0]
    assert "pytest" in cmds[1]
    assert "torch==2.13.0" in cmds[1]  # the local CPU wheel; any other torch pulls GBs of CUDA packages


def test_ci_extracts_the_same_test_command() -> None:
    script = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    extract = re.search(r"TEST_CMD=\$\((.+)\)$", script, flags=re.MULTILINE)
    assert extract is not None
    got = subprocess.run(["bash", "-c", extract.group(1)], cwd=REPO, capture_output=True, text=True, check=True)
    assert got.stdout.strip() == _commands()[1]
