"""Which pip frontend serves an interpreter: its own pip, else uv pointed at it (``uv pip``, ``uv build``).

The one place that decides it, for installs (:mod:`attnforge.install.pip`), index questions, downloads
(:mod:`attnforge.install.defaults`, :mod:`attnforge.build.source`) and source builds (:mod:`attnforge.build.execute`).

Environments made by ``uv venv`` have no pip; ``uv pip install --python PY`` installs into them (and honours uv's
own configuration: ``uv.toml``, ``UV_INDEX_URL``, ``UV_EXTRA_INDEX_URL``, credentials). Conda environments and the
system interpreter normally carry pip and use it (with ``pip.conf``, ``PIP_*``, netrc and keyring).

Index access goes through the same installer (:mod:`attnforge.install.index`), so proxies and credentials that
work for ``pip install`` work for attnforge too.
"""

from __future__ import annotations

import importlib.machinery
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from attnforge._system.runner import Runner
from attnforge.errors import InstallError

#: pip options with another spelling (or none) in ``uv pip``.
_UV_SPELLING: dict[str, str | None] = {
    "--force-reinstall": "--reinstall",
    "--disable-pip-version-check": None,
    "--no-input": None,
    "-y": None,  # `uv pip uninstall` never asks
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Installer:
    """How to run ``pip <subcommand>`` for one interpreter.

    Attributes:
        kind: ``pip`` (``python -m pip``) or ``uv`` (``uv pip ... --python PY``).
        python: the interpreter packages go into.
        uv: the uv executable (kind ``uv`` only).
    """

    kind: Literal["pip", "uv"]
    python: str
    uv: str | None = None

    def argv(self, subcommand: str, *options: str) -> list[str]:
        """``python -m pip SUB OPTIONS...`` or ``uv pip SUB --python PY OPTIONS...`` (pip options translated)."""
        if self.kind == "pip":
            return [self.python, "-m", "pip", subcommand, *options]
        translated = [_UV_SPELLING.get(o, o) for o in options]
        return [str(self.uv), "pip", subcommand, "--python", self.python, *(o for o in translated if o)]

    def download_argv(self, *options: str) -> list[str]:
        """``pip download OPTIONS`` for this interpreter. uv has no download command, so where the interpreter
        has no pip, pip itself runs through ``uv tool run --python PY`` (same Python version and tags; pip's own
        configuration applies, as it does to ``pip download``)."""
        if self.kind == "pip":
            return self.argv("download", *options)
        return [str(self.uv), "tool", "run", "--python", self.python, "--from", "pip", "pip", "download", *options]

    def wheel_argv(self, project: Path, out: Path) -> list[str]:
        """Build ``project`` into a wheel in ``out`` against this interpreter's own packages (no build isolation,
        no dependencies, the build's output shown): ``pip wheel -v``, or ``uv build --wheel`` without pip."""
        if self.kind == "pip":
            return self.argv("wheel", "-v", "--no-build-isolation", "--no-deps", "--disable-pip-version-check",
                             "--wheel-dir", str(out), str(project))
        return [str(self.uv), "build", "--wheel", "--no-build-isolation", "--python", self.python, "--out-dir",
                str(out), str(project)]

    def describe(self) -> str:
        return f"{self.python} -m pip" if self.kind == "pip" else f"uv pip --python {self.python}"


def find_uv() -> str | None:
    """uv on PATH, else next to this interpreter (the dev extras and ``pip install uv`` put it there)."""
    here = Path(sysconfig.get_path("scripts")) / ("uv.exe" if sys.platform == "win32" else "uv")
    return shutil.which("uv") or (str(here) if here.is_file() else None)


def installer_for(python: str, *, runner: Runner) -> Installer:
    """The installer for ``python``: its pip when ``import pip`` works there, else uv.

    Raises:
        InstallError: the interpreter has no pip and uv is not installed; the hint says how to get either.
    """
    if python == sys.executable:  # the interpreter this runs in (the CLI's target): asked without a process
        # sys.path itself, not the import hooks: setuptools' distutils hook answers for "pip" and warns when
        # distutils was imported before it
        has_pip = importlib.machinery.PathFinder.find_spec("pip") is not None
    else:
        has_pip = runner.run([python, "-c", "import pip"], timeout_s=60).ok
    uv = None if has_pip else find_uv()
    if not has_pip and uv is None:
        raise InstallError(
            f"{python} has no pip, and uv is not installed",
            cause="environments made by `uv venv` (without --seed) have no pip",
            hint=f"install uv (`pipx install uv`, or see https://docs.astral.sh/uv/), or add pip to the "
                 f"environment: `{python} -m ensurepip` (or `uv venv --seed` when creating it)",
        )
    return Installer(kind="pip", python=python) if has_pip else Installer(kind="uv", python=python, uv=uv)
