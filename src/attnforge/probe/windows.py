"""Windows-only facts: Visual Studio instances (vswhere), MSVC toolsets, ``cl``, LongPathsEnabled and whether
the target Python can build extensions at all (embedded/portable Pythons cannot).

Nothing here was run on a real Windows machine: every parser is tested against recorded real outputs
(``tests/fixtures/outputs/windows/``). Sources: docs/research/toolchain-facts.md §4.1 (vswhere's fixed
location and flags), §4.2 (what a build needs), §4.3 (long paths); install-anchors.md §8.5 (embedded
Python).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path, PureWindowsPath

from attnforge._system.runner import Runner, which
from attnforge.probe import parsers
from attnforge.probe.context import ProbeContext
from attnforge.probe.snapshot import Compiler, PythonDevFiles, VisualStudio
from attnforge.types.versions import loose_version

VSWHERE_ARGS = ("-products", "*", "-requires", "Microsoft.VisualStudio.Component.VC.Tools.x86.x64",
                "-format", "json", "-utf8")
LONG_PATHS_KEY = r"HKLM\SYSTEM\CurrentControlSet\Control\FileSystem"
LONG_PATHS_VALUE = "LongPathsEnabled"

#: Run by the *target* interpreter (``python -c``): one JSON line saying where its headers and import library
#: are and whether they exist. A venv reports its base installation's ``libs`` (``sys.base_exec_prefix``),
#: which is where torch's link step looks (install-anchors.md §8.5: ``/LIBPATH`` to
#: ``sys.base_exec_prefix\\libs``).
PYTHON_DEV_SCRIPT = (
    "import json, os, sys, sysconfig\n"
    "inc = sysconfig.get_paths()['include']\n"
    "win = os.name == 'nt'\n"
    "libs = os.path.join(sys.base_exec_prefix, 'libs') if win else None\n"
    "lib = 'python%d%d.lib' % sys.version_info[:2] if win else None\n"
    "here = os.path.dirname(sys.executable)\n"
    "pth = any(n.endswith('._pth') for n in os.listdir(here)) if os.path.isdir(here) else False\n"
    "print(json.dumps({'include_dir': inc, 'has_python_h': os.path.isfile(os.path.join(inc, 'Python.h')),"
    " 'libs_dir': libs, 'import_lib': lib,"
    " 'has_import_lib': os.path.isfile(os.path.join(libs, lib)) if win else None, 'embedded': pth}))\n"
)


def vswhere_path(environ: Mapping[str, str] | None = None) -> PureWindowsPath:
    """``%ProgramFiles(x86)%\\Microsoft Visual Studio\\Installer\\vswhere.exe`` (fixed by Microsoft)."""
    pf86 = (environ or {}).get("ProgramFiles(x86)", r"C:\Program Files (x86)")
    return PureWindowsPath(pf86) / "Microsoft Visual Studio" / "Installer" / "vswhere.exe"


def collect_visual_studio(ctx: ProbeContext) -> tuple[list[VisualStudio], str | None]:
    """Every VS 2017+ instance with the x64 C++ tools, each with its installed MSVC toolsets.

    Returns:
        The instances (newest version first) and None, or ``[]`` and the reason vswhere gave nothing.
    """
    exe = str(vswhere_path(ctx.environ))
    res = ctx.runner.run((exe, *VSWHERE_ARGS), env=ctx.environ, timeout_s=ctx.timeout_s)
    if not res.ok:
        return [], f"vswhere: exit {res.returncode} (no Visual Studio 2017+ or Build Tools installed?)"
    try:
        instances = parsers.vswhere_json(res.stdout)
    except ValueError as exc:
        return [], f"vswhere: {exc}"
    if not instances:
        return [], ("vswhere lists no instance with the x64 C++ tools "
                    "(install the 'Desktop development with C++' workload)")
    found = [replace(vs, msvc_toolsets=msvc_toolsets(Path(vs.install_path))) for vs in instances]
    return sorted(found, key=lambda vs: loose_version(vs.version), reverse=True), None


def msvc_toolsets(install_path: Path) -> tuple[str, ...]:
    """Toolset versions under ``<install>\\VC\\Tools\\MSVC``, newest first."""
    base = install_path / "VC" / "Tools" / "MSVC"
    if not base.is_dir():
        return ()
    names = [p.name for p in base.iterdir() if p.is_dir() and p.name[:1].isdigit()]
    return tuple(sorted(names, key=loose_version, reverse=True))


def collect_cl(ctx: ProbeContext) -> Compiler | None:
    """``cl`` on PATH (an activated VS developer prompt). Its banner goes to stderr when run bare."""
    exe = which("cl", ctx.environ)
    if exe is None:
        return None
    res = ctx.runner.run((str(exe),), env=ctx.environ, timeout_s=ctx.timeout_s)
    parsed = parsers.cl_banner(res.output)
    if parsed is None:
        return None
    return Compiler(kind="cl", path=str(exe), version=parsed[0], banner=parsed[1])


def collect_python_dev(ctx: ProbeContext) -> tuple[PythonDevFiles | None, str | None]:
    """Whether the target interpreter has ``include\\Python.h`` and ``libs\\pythonXY.lib``.

    Returns:
        The files found and None, or None and why the interpreter could not be asked.
    """
    res = ctx.runner.run((ctx.python, "-c", PYTHON_DEV_SCRIPT), env=ctx.environ, timeout_s=ctx.timeout_s)
    data = parsers.python_dev_json(res.stdout) if res.ok else None
    if data is None:
        tail = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
        return None, f"{ctx.python} did not report its include/libs folders: {tail}"
    try:
        return PythonDevFiles(
            include_dir=str(data["include_dir"]),
            has_python_h=bool(data["has_python_h"]),
            libs_dir=None if data.get("libs_dir") is None else str(data["libs_dir"]),
            import_lib=None if data.get("import_lib") is None else str(data["import_lib"]),
            has_import_lib=None if data.get("has_import_lib") is None else bool(data["has_import_lib"]),
            embedded=bool(data.get("embedded", False)),
        ), None
    except KeyError as exc:
        return None, f"the include/libs report lacks {exc}"


def reg_query_long_paths(runner: Runner) -> int | None:
    """The same value through ``reg query`` (for a probe that runs outside the target Windows Python).

    ``reg`` exits 1 and prints an ``ERROR:`` line when the value is absent: that reads as None (Windows then
    treats long paths as disabled; toolchain-facts.md §4.3).
    """
    res = runner.run(("reg", "query", LONG_PATHS_KEY, "/v", LONG_PATHS_VALUE), timeout_s=20.0)
    return parsers.reg_query_dword(res.stdout, LONG_PATHS_VALUE) if res.ok else None
