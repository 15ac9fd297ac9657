"""A build's process group dies with attnforge: SIGKILL leaves no orphaned compiler, SIGTERM exits 143
without a traceback, and ``build --json`` prints a successful result (paths included).

The "compiler" is a real process tree: the launched child starts three grandchildren that sleep, as ninja
starts nvcc and cicc.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from attnforge.cli.build import run_build
from tests.build._helpers import FA_LOG, ReplayLauncher, copy_fixture, fixture_spec
from tests.conftest import REPO, SRC

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups")

_TREE = """
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(3)]
open(sys.argv[1], "w").write(" ".join(str(k.pid) for k in kids))
print("compiling", flush=True)
time.sleep(120)
"""

_VERB = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    import click
    from attnforge.build.progress import NullReporter
    from attnforge.build.stream import run_streamed

    @click.command("fake-build")
    def command() -> None:
        with open(sys.argv[2], "w") as log:
            run_streamed([sys.executable, "-c", {tree!r}, sys.argv[1]], cwd=Path.cwd(), env=dict(os.environ),
                         log=log, reporter=NullReporter())
    """
)
_DRIVER = textwrap.dedent(
    """
    import sys
    sys.path[:0] = [{src!r}, {repo!r}, {here!r}]
    import attnforge.cli as cli_pkg
    cli_pkg.VERBS["fake-build"] = "fake_build_verb:command"
    sys.exit(cli_pkg.main(["fake-build"]))
    """
)


def _start(tmp_path: Path) -> tuple[subprocess.Popen[str], list[int]]:
    pids_file = tmp_path / "pids"
    (tmp_path / "fake_build_verb.py").write_text(_VERB.format(tree=_TREE))
    code = _DRIVER.format(src=str(SRC), repo=str(REPO), here=str(tmp_path))
    driver = subprocess.Popen([sys.executable, "-c", code, str(pids_file), str(tmp_path / "log")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (pids_file.exists() and pids_file.read_text().strip()):
        assert driver.poll() is None, driver.communicate()
        assert time.monotonic() < deadline, "the fake build never started"
        time.sleep(0.1)
    time.sleep(0.3)  # the pid file is written before the "compiler" settles; let the watchdog start too
    return driver, [int(p) for p in pids_file.read_text().split()]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pids: list[int], timeout_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


def test_sigkill_of_attnforge_takes_the_compilers_with_it(tmp_path: Path) -> None:
    driver, kids = _start(tmp_path)
    try:
        assert all(_alive(p) for p in kids)
        driver.kill()  # SIGKILL: no handler, no finally in attnforge runs
        driver.wait()
        left = _wait_gone(kids)
        assert left == [], f"orphaned compilers still running: {left}"
    finally:
        for p in kids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        driver.communicate()


def test_sigterm_stops_the_group_and_exits_143_without_a_traceback(tmp_path: Path) -> None:
    driver, kids = _start(tmp_path)
    try:
        driver.send_signal(signal.SIGTERM)
        _, err = driver.communicate(timeout=60)
        assert driver.returncode == 143, err
        assert "Traceback" not in err and "interrupted" in err, err
        assert _wait_gone(kids, 15) == []
    finally:
        for p in kids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_a_finished_build_releases_its_watchdog_without_killing_anything(tmp_path: Path) -> None:
    from attnforge.build.progress import NullReporter
    from attnforge.build.stream import launch, run_streamed

    survivor = tmp_path / "survivor"
    code = ("import subprocess as s, sys; p = s.Popen([sys.executable, '-c', 'import time; time.sleep(30)'],"
            " stdout=s.DEVNULL, stderr=s.DEVNULL, start_new_session=True); open(sys.argv[1], 'w').write(str(p.pid))")
    with (tmp_path / "log").open("w") as log:
        outcome = run_streamed([sys.executable, "-c", code, str(survivor)], cwd=tmp_path, env=dict(os.environ),
                               log=log, reporter=NullReporter(), launcher=launch)
    assert outcome.returncode == 0
    pid = int(survivor.read_text())
    try:
        time.sleep(1.0)
        assert _alive(pid)  # a detached helper (sccache's server) outlives a build that ended normally
    finally:
        os.kill(pid, signal.SIGKILL)


def test_build_json_after_success_is_valid_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = fixture_spec(copy_fixture(tmp_path / "src"), tmp_path / "b")
    code = run_build(spec, home=tmp_path / "home", snapshot=None, keep_build_dir=False, quiet=True, as_json=True,
                     launcher=ReplayLauncher(FA_LOG))
    out = capsys.readouterr().out
    assert code == 0
    doc = json.loads(out)
    assert doc["ok"] is True
    assert doc["result"]["wheel"].endswith(".whl") and Path(doc["result"]["log_path"]).is_file()
