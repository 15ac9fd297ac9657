"""The README keeps exactly two set-up commands, and .ci/run runs the test one verbatim."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

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


def test_ci_runs_the_slow_tests_the_readme_command_leaves_out() -> None:
    """The README's command runs ``-m 'not slow'`` (pyproject's addopts); .ci/run runs the ``-m slow`` rest in the
    same interpreter after it, and the README names that command, so the two runs together cover every test."""
    addopts = shlex.split(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
                          ["addopts"])
    assert addopts[addopts.index("-m") + 1] == "not slow"
    script = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    slow = re.search(r'^SLOW_CMD="(.+)"$', script, flags=re.MULTILINE)
    assert slow is not None
    assert shlex.split(slow.group(1))[-2:] == ["-m", "slow"]
    body = re.search(r"^run_test_cmd\(\) \{.*?^\}$", script, flags=re.MULTILINE | re.DOTALL)
    assert body is not None
    assert body.group(0).index('"$TEST_CMD"') < body.group(0).index('"$SLOW_CMD"')
    assert f"`{slow.group(1)}`" in (REPO / "README.md").read_text(encoding="utf-8")
