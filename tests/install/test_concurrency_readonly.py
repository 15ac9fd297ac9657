"""Installs into one interpreter from many processes at once, and installs from a read-only cache.

Real processes, a real venv and real pip; the wheel is the repo's small pure-Python fixture wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from attnforge.cache import Store
from tests.cache.conftest import inputs_for
from tests.cache.wheelmaker import make_wheel
from tests.conftest import REPO, SRC
from tests.venvs import nested_venv

pytestmark = pytest.mark.integration

SNAPSHOT = REPO / "tests" / "fixtures" / "snapshots" / "cpu_dev_torch2.13_cpu.json"
_NO_DAC = "-dac_override,-dac_read_search,-fowner"

DRIVER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    sys.path[:0] = [{src!r}, {repo!r}]
    from attnforge._system.runner import SubprocessRunner
    from attnforge.cache import Store
    from attnforge.errors import AttnforgeError
    from attnforge.install.flow import install
    from attnforge.probe.snapshot import SystemSnapshot
    from attnforge.resolve.types import Request
    from tests.install.helpers import OrderedPlanner, pip_wheel_builder

    home, python, links = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    try:
        result = install(Request(backend="af-pure-fixture"), snapshot=SystemSnapshot.load(Path({snap!r})),
                         store=Store(home), planner=OrderedPlanner(find_links=links), builder=pip_wheel_builder,
                         verifier=None, runner=SubprocessRunner(), python=python)
    except AttnforgeError as exc:
        print(json.dumps({{"error": str(exc)}}))
        sys.exit(1)
    print(json.dumps({{"action": result.action, "key": result.cache_key}}))
    """
).format(src=str(SRC), repo=str(REPO), snap=str(SNAPSHOT))


def _venv(path: Path) -> str:
    return nested_venv(path)  # sees the torch and pip of the venv the tests run in


def _drive(home: Path, python: str, links: Path, prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*(prefix or []), sys.executable, "-c", DRIVER, str(home), python, str(links)],
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.slow
def test_eight_concurrent_installs_into_one_venv_all_succeed(tmp_path: Path) -> None:
    links = tmp_path / "links"
    make_wheel(links, value=7)
    python = _venv(tmp_path / "venv")
    home = tmp_path / "home"
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda _: _drive(home, python, links), range(8)))
    for done in results:
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    actions = sorted(json.loads(d.stdout.strip().splitlines()[-1])["action"] for d in results)
    assert actions.count("wheel") >= 1 and set(actions) <= {"wheel", "cache-hit"}
    assert len(Store(home).list()) == 1
    check = subprocess.run([python, "-c", "import af_pure_fixture as m; print(m.VALUE)"], capture_output=True,
                           text=True, check=False)
    assert check.stdout.strip() == "7", check.stderr
    assert list((home / "locks").glob("interpreter-*.lock"))


@pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to drop the right to ignore file permissions")
def test_install_from_a_read_only_cache(tmp_path: Path) -> None:
    home = tmp_path / "home"
    wheel = make_wheel(tmp_path / "dist", value=11)
    Store(home).put(wheel, inputs_for(wheel))
    empty_links = tmp_path / "links"
    empty_links.mkdir()
    python = _venv(tmp_path / "venv")
    for path in [home, *home.rglob("*")]:
        os.chmod(path, 0o555 if path.is_dir() else 0o444)
    try:
        done = _drive(home, python, empty_links,
                      prefix=["setpriv", f"--bounding-set={_NO_DAC}", f"--inh-caps={_NO_DAC}"])
    finally:
        for path in [home, *home.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["action"] == "cache-hit"
    check = subprocess.run([python, "-c", "import af_pure_fixture as m; print(m.VALUE)"], capture_output=True,
                           text=True, check=False)
    assert check.stdout.strip() == "11"
    assert not (home / "locks").exists()


def test_install_with_a_home_that_is_a_file_is_a_clean_error(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.write_text("oops\n")
    env = {**os.environ, "ATTNFORGE_HOME": str(home), "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-m", "attnforge", "install", "flash-attn", "--offline"],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    text = done.stdout + done.stderr
    assert done.returncode in (1, 2), text
    assert "Traceback" not in text and "error:" in text and "hint:" in text, text
