"""Real builds of the fixture package through the executor, and real failures diagnosed (no GPU needed).

Each test runs the real pip, setuptools, torch.utils.cpp_extension, ninja and gcc; the whole file takes about
a minute and a half on 2 cores.
"""

from __future__ import annotations

import ensurepip
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from attnforge.build import BuildFailure, execute
from attnforge.build.stream import launch
from tests.build._helpers import copy_fixture, fixture_spec
from tests.venvs import nested_venv

pytestmark = pytest.mark.integration


def _fails(spec_src: Path, tmp_path: Path, launcher=launch, **changes: object) -> BuildFailure:  # type: ignore[no-untyped-def]
    home, root = tmp_path / "home", tmp_path / "b"
    with pytest.raises(BuildFailure) as info:
        execute(fixture_spec(spec_src, root, **changes), home=home, launcher=launcher, heartbeat_s=5)
    assert not any((home / "staging").iterdir()), "a failed build stages nothing"
    assert [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == [], "no partial tree left"
    return info.value


@pytest.mark.slow  # ~27 s: two real compiles of the C++ fixture
def test_fixture_builds_installs_runs_and_a_kept_tree_resumes(tmp_path: Path) -> None:
    src = copy_fixture(tmp_path / "src")
    home, root = tmp_path / "home", tmp_path / "b"
    spec = fixture_spec(src, root)
    first = execute(spec, home=home, keep_build_dir=True)
    assert first.wheel.is_file()
    assert first.wheel.name.startswith("af_ext_fixture-0.1.0-")
    assert (first.steps_done, first.steps_total) == (1, 1), "one .cpp compiled by ninja"

    env_dir = tmp_path / "venv"
    py = Path(nested_venv(env_dir))  # sees this process's torch, also when the tests run inside a venv
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(first.wheel),
        ],
        check=True,
    ) if _pip_has_python_option() else subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            "--prefix",
            str(env_dir),
            str(first.wheel),
        ],
        check=True,
    )
    run = subprocess.run(
        [
            str(py),
            "-c",
            "import torch, af_ext_fixture; "
            "print(af_ext_fixture.add(torch.arange(3.0), torch.full((3,), 2.0)).tolist())",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert run.stdout.strip() == "[2.0, 3.0, 4.0]"

    second = execute(spec, home=home, keep_build_dir=True)
    assert second.resumed
    assert second.build_dir == first.build_dir
    assert second.steps_total == 0, "ninja found nothing to recompile in the kept tree"
    assert "ninja: no work to do" in second.log_path.read_text(encoding="utf-8")
    shutil.rmtree(first.build_dir)  # type: ignore[arg-type]


def _pip_has_python_option() -> bool:
    # pip's version from its metadata: importing pip in this process turns setuptools' distutils shim off
    # (_distutils_hack's spec_for_pip, pypa/pip#8761), and a later `import setuptools` here (Inductor's C++
    # builds: the Flex real-compile tests) then fails its distutils assertion
    from importlib.metadata import version

    major, minor = (int(x) for x in version("pip").split(".")[:2])
    return (major, minor) >= (22, 3)


@pytest.mark.slow  # ~19 s: a real compile that fails
def test_syntax_error_is_diagnosed_at_its_source_line(tmp_path: Path) -> None:
    src = copy_fixture(tmp_path / "src")
    cpp = src / "af_ext_fixture" / "add.cpp"
    text = cpp.read_text(encoding="utf-8").replace("return a + b;", "return a + b")
    cpp.write_text(text, encoding="utf-8")
    line = next(i for i, t in enumerate(text.splitlines(), start=1) if "return a + b" in t)

    failure = _fails(src, tmp_path)
    d = failure.diagnosis
    assert d.signature == "source-compile-error"  # type: ignore[attr-defined]
    assert d.location is not None
    assert d.location.endswith(f"af_ext_fixture/add.cpp:{line}")
    assert "expected" in d.cause
    assert ";" in d.cause
    assert d.failed_target.endswith("add.o")  # type: ignore[attr-defined]


class _MemoryLimited:
    """Runs the build under ``ulimit -v`` (virtual memory, KiB) in a shell wrapper."""

    def __init__(self, kib: int) -> None:
        self.kib = kib

    def __call__(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]):  # type: ignore[no-untyped-def]
        return launch(["/bin/sh", "-c", f'ulimit -v {self.kib} && exec "$@"', "sh", *argv], cwd=cwd, env=env)


@pytest.mark.slow  # ~9 s: a real compile under ulimit -v
def test_out_of_memory_is_diagnosed(tmp_path: Path) -> None:
    # 800 MB: enough for pip and torch's import (about 640 MB peak), not for cc1plus on torch/extension.h
    failure = _fails(copy_fixture(tmp_path / "src"), tmp_path, launcher=_MemoryLimited(800_000))
    d = failure.diagnosis
    assert d.signature == "out-of-memory", d  # type: ignore[attr-defined]
    assert any("virtual memory exhausted" in e.text or "out of memory" in e.text for e in d.evidence)  # type: ignore[attr-defined]


class _Isolated:
    """pip's default: an isolated build env, offline, whose only package is ensurepip's bundled setuptools."""

    def __init__(self, find_links: Path) -> None:
        self.find_links = find_links

    def __call__(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]):  # type: ignore[no-untyped-def]
        args = [a for a in argv if a != "--no-build-isolation"]
        at = args.index("wheel") + 1
        args[at:at] = ["--no-index", "--find-links", str(self.find_links)]
        return launch(args, cwd=cwd, env={**env, "PIP_CONFIG_FILE": os.devnull})


def test_build_isolation_without_torch_is_diagnosed(tmp_path: Path) -> None:
    links = tmp_path / "links"
    links.mkdir()
    bundled = Path(ensurepip.__file__).parent / "_bundled"
    for wheel in bundled.glob("setuptools-*.whl"):
        shutil.copy(wheel, links)
    failure = _fails(copy_fixture(tmp_path / "src"), tmp_path, launcher=_Isolated(links))
    d = failure.diagnosis
    assert d.signature == "build-isolation-no-torch"  # type: ignore[attr-defined]
    assert any("--no-build-isolation" in step for step in d.fix)  # type: ignore[attr-defined]
