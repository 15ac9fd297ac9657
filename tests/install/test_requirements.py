"""A backend's own requirements (FlashAttention-4's CuTe DSL) are installed with the torch stack pinned."""

from __future__ import annotations

import json
import venv
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from attnforge._system.runner import Completed, SubprocessRunner
from attnforge.errors import InstallError
from attnforge.install.pip import install_requirements, installed_versions
from tests.venvs import bin_python, site_packages_of


class ScriptedPip:
    """Answers the versions script from ``versions`` (then ``after`` once pip ran) and records pip's argv."""

    def __init__(self, versions: dict[str, str | None], after: dict[str, str | None] | None = None,
                 pip_rc: int = 0) -> None:
        self.versions, self.after, self.pip_rc = versions, after, pip_rc
        self.pip_argv: list[str] | None = None

    def run(self, argv: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
            timeout_s: float | None = None) -> Completed:
        if "-c" in argv[1:3]:  # the versions script (run with -S: no .pth code of the environment runs)
            names = argv[list(argv).index("-c") + 2:]
            table = self.after if (self.pip_argv is not None and self.after is not None) else self.versions
            return Completed(argv=tuple(argv), returncode=0, stdout=json.dumps({n: table.get(n) for n in names}))
        self.pip_argv = list(argv)
        return Completed(argv=tuple(argv), returncode=self.pip_rc, stderr="ERROR: No matching distribution")


def test_offline_requirements_come_from_find_links_with_torch_pinned(tmp_path: Path) -> None:
    pip = ScriptedPip({"torch": "2.11.0+cu130", "triton": "3.6.0"})
    done = install_requirements(("nvidia-cutlass-dsl[cu13]>=4.8", "torch>=2.8", "quack-kernels"), runner=pip,
                                python="py", find_links=("/tmp/wh",), offline=True, scratch=tmp_path)
    assert done == ("nvidia-cutlass-dsl[cu13]>=4.8", "quack-kernels")  # torch itself is never asked for
    argv = pip.pip_argv
    assert argv is not None
    assert argv[argv.index("--find-links") + 1] == "/tmp/wh" and "--no-index" in argv
    constraints = Path(argv[argv.index("-c") + 1]).read_text().splitlines()
    assert constraints == ["torch==2.11.0+cu130", "triton==3.6.0"]


def test_torch_changing_anyway_is_an_error(tmp_path: Path) -> None:
    pip = ScriptedPip({"torch": "2.11.0+cu130"}, after={"torch": "2.12.0"})
    with pytest.raises(InstallError, match=r"torch 2\.11\.0\+cu130 -> 2\.12\.0"):
        install_requirements(("einops",), runner=pip, python="py", scratch=tmp_path)


def test_pip_failure_names_the_requirements_and_a_fix(tmp_path: Path) -> None:
    pip = ScriptedPip({"torch": "2.11.0+cu130"}, pip_rc=1)
    with pytest.raises(InstallError) as info:
        install_requirements(("einops",), runner=pip, python="py", offline=True, scratch=tmp_path)
    assert "einops" in info.value.message and "No matching distribution" in (info.value.cause or "")
    assert info.value.hint and "--find-links" in info.value.hint


def test_nothing_to_do(tmp_path: Path) -> None:
    pip = ScriptedPip({})
    assert install_requirements(("torch>=2",), runner=pip, python="py", scratch=tmp_path) == ()
    assert pip.pip_argv is None


def _bridged(tmp_path: Path, pth: str) -> str:
    """A fresh venv (no pip, no system site) whose site-packages holds ``zz_bridge.pth`` with ``pth``
    (OUTER = a folder holding the distribution bridged-pkg 1.2.3); returns its python."""
    outer = tmp_path / "outer" / "bridged_pkg-1.2.3.dist-info"
    outer.mkdir(parents=True)
    (outer / "METADATA").write_text("Metadata-Version: 2.1\nName: bridged-pkg\nVersion: 1.2.3\n")
    venv.create(tmp_path / "venv", with_pip=False)
    python = bin_python(tmp_path / "venv")
    (site_packages_of(python) / "zz_bridge.pth").write_text(pth.replace("OUTER", str(outer.parent)))
    return str(python)


def test_versions_are_read_through_pth_path_lines_without_running_pth_code(tmp_path: Path) -> None:
    """A distribution reachable only through a ``.pth`` path line (an editable install, a bridge to an outer
    environment) is seen; a ``.pth`` import line is not run (the version check starts Python with -S)."""
    mark = tmp_path / "ran"
    python = _bridged(tmp_path, f"OUTER\nimport pathlib; pathlib.Path({str(mark)!r}).touch()\n")
    assert installed_versions(python, ["bridged-pkg"], SubprocessRunner()) == {"bridged-pkg": "1.2.3"}
    assert not mark.exists()


def test_an_environment_reached_only_through_pth_code_is_asked_the_plain_way(tmp_path: Path) -> None:
    """The H200 run's venv sees torch only through ``import site; site.addsitedir(...)`` lines: the first
    question finds what -S cannot see by letting the interpreter start normally, and later ones do the same."""
    python = _bridged(tmp_path, "import site; site.addsitedir('OUTER')\n")
    assert installed_versions(python, ["bridged-pkg", "nope"], SubprocessRunner()) == {"bridged-pkg": "1.2.3",
                                                                                       "nope": None}
    assert installed_versions(python, ["bridged-pkg"], SubprocessRunner()) == {"bridged-pkg": "1.2.3"}
