"""The README's test command works inside a venv, a uv venv and outside one: tests that install into "a fresh
venv" make it with :func:`tests.venvs.nested_venv`, which must see the outer environment's packages (torch, pip,
filelock live there, not in the base interpreter) whatever made the outer environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from attnforge._system.runner import SubprocessRunner
from attnforge.install.pip import pip_install
from tests.cache.wheelmaker import make_wheel
from tests.conftest import REPO
from tests.venvs import bin_python, nested_venv, uv_venv

SCRIPT = """
import subprocess, sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from tests.venvs import nested_venv
py = nested_venv(Path({target!r}))
done = subprocess.run([py, "-c", "import af_outer_marker as m, sys; print(m.VALUE, sys.prefix)"],
                      capture_output=True, text=True)
print(done.stdout.strip() or done.stderr)
"""


def outer_env(kind: str, path: Path) -> str:
    if kind == "uv":
        return uv_venv(path)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return str(bin_python(path))


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["venv", "uv"])
def test_a_nested_venv_sees_what_the_outer_env_has(kind: str, tmp_path: Path) -> None:
    outer = outer_env(kind, tmp_path / "outer")
    wheel = make_wheel(tmp_path / "dist", name="af-outer-marker", value=11)
    pip_install(wheel, runner=SubprocessRunner(), python=outer)  # pip there? no: uv pip --python, as attnforge does
    done = subprocess.run([outer, "-c", SCRIPT.format(repo=str(REPO), target=str(tmp_path / "nested"))],
                          capture_output=True, text=True, check=True)
    value, prefix = done.stdout.split()
    assert value == "11"
    assert prefix == str(tmp_path / "nested")


@pytest.mark.integration
def test_this_process_packages_are_visible_in_a_nested_venv(tmp_path: Path) -> None:
    py = nested_venv(tmp_path / "venv")
    done = subprocess.run([py, "-c", "import pip, filelock, attnforge.cli; print('ok')"], capture_output=True,
                          text=True)
    assert done.stdout.strip() == "ok", done.stderr


def test_every_test_venv_is_made_by_tests_venvs() -> None:
    """A venv made with venv.EnvBuilder directly sees the base interpreter, not the venv the tests run in."""
    here = Path(__file__).resolve()
    offenders = [
        str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("*.py")
        if p.resolve() not in (here, REPO / "tests" / "venvs.py") and "EnvBuilder(" in p.read_text()
    ]
    assert offenders == [], "use tests.venvs.nested_venv"
