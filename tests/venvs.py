"""Nested virtual environments for tests that install into "a fresh venv".

``venv.EnvBuilder(system_site_packages=True)`` makes a venv that sees the *base* interpreter's packages. When the
tests themselves run inside a venv (the README's usual path), the base has no torch, pip or filelock: those live
in the outer venv. :func:`nested_venv` adds a ``.pth`` file to the new venv that adds the running interpreter's
site-packages as site dirs (so their own ``.pth`` files, an editable install's finder included, run too): the
nested venv sees exactly what the test process sees, and still installs into itself (its own site-packages comes
first on ``sys.path``). Outside a venv the ``.pth`` names directories already visible, which is harmless.
"""

from __future__ import annotations

import site
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path


def outer_site_packages() -> list[str]:
    """The running interpreter's site-packages directories (purelib and platlib, plus site's own list)."""
    paths = [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    paths += [p for p in site.getsitepackages() if "site-packages" in p or "dist-packages" in p]
    seen: list[str] = []
    for p in paths:
        if p and p not in seen and Path(p).is_dir():
            seen.append(p)
    return seen


def bin_python(env_dir: Path) -> Path:
    return env_dir / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def site_packages_of(python: Path | str) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def inherit_outer(python: Path | str) -> None:
    """Make the venv of ``python`` see this test process's packages through a ``.pth`` file."""
    target = site_packages_of(python)
    target.mkdir(parents=True, exist_ok=True)
    (target / "_attnforge_tests_outer.pth").write_text(_addsitedir_lines(outer_site_packages()))


def _addsitedir_lines(dirs: list[str] | list[Path]) -> str:
    """``.pth`` lines that add ``dirs`` as site dirs, so *their* ``.pth`` files run too (an editable install's
    finder, ``pip install -e .`` of this repo, lives in one)."""
    return "".join(f"import site; site.addsitedir({str(d)!r})\n" for d in dirs)


def nested_venv(env_dir: Path) -> str:
    """A fresh venv without its own pip that sees this process's torch, pip and dependencies.

    Returns:
        The path of its python.
    """
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = bin_python(env_dir)
    inherit_outer(python)
    return str(python)


def uv_venv(env_dir: Path) -> str:
    """A ``uv venv`` (no pip in it) made from this interpreter, seeing nothing but its own site-packages.

    Skips the test when uv is not installed (it comes with the dev extras).
    """
    import pytest

    from attnforge.build.frontend import find_uv

    uv = find_uv()
    if uv is None:
        pytest.skip("uv is not installed (it comes with the dev extras)")
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(env_dir)], check=True,
                   capture_output=True, text=True)
    return str(bin_python(env_dir))


def inherit_outer_without_pip(python: Path | str, scratch: Path) -> None:
    """Like :func:`inherit_outer`, but pip stays invisible: the new env keeps "no pip", as ``uv venv`` makes it."""
    deps = scratch / "outer-without-pip"
    deps.mkdir(parents=True, exist_ok=True)
    for root in outer_site_packages():
        for entry in Path(root).iterdir():
            if entry.name.lower().startswith(("pip", "_attnforge_tests")) or (deps / entry.name).exists():
                continue
            (deps / entry.name).symlink_to(entry)
    (site_packages_of(python) / "_attnforge_tests_outer.pth").write_text(_addsitedir_lines([deps]))
