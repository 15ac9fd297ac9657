"""Windows-only facts: Visual Studio instances (vswhere), MSVC toolsets, ``cl`` and LongPathsEnabled.

Sources: shared/research/toolchain-facts.md §4.1 (vswhere's fixed location and flags), §4.3 (long paths).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path, PureWindowsPath

from attnforge._system.runner import which
from attnforge.probe import parsers
from attnforge.probe.context import ProbeContext
from attnforge.probe.snapshot import Compiler, VisualStudio

VSWHERE_ARGS = ("-products", "*", "-requires", "Microsoft.VisualStudio.Component.VC.Tools.x86.x64",
                "-format", "json", "-utf8")


def vswhere_path(environ: dict[str, str] | None = None) -> PureWindowsPath:
    """``%ProgramFiles(x86)%\\Microsoft Visual Studio\\Installer\\vswhere.exe`` (fixed by Microsoft)."""
    pf86 = (environ or {}).get("ProgramFiles(x86)", r"C:\Program Files (x86)")
    return PureWindowsPath(pf86) / "Microsoft Visual Studio" / "Installer" / "vswhere.exe"


def collect_visual_studio(ctx: ProbeContext) -> tuple[list[VisualStudio], str | None]:
    exe = str(vswhere_path(dict(ctx.environ)))
    res = ctx.runner.run((exe, *VSWHERE_ARGS), env=ctx.environ, timeout_s=ctx.timeout_s)
    if not res.ok:
        return [], f"vswhere: exit {res.returncode} (Visual Studio Installer not found?)"
    try:
        instances = parsers.vswhere_json(res.stdout)
    except ValueError as exc:
        return [], f"vswhere: {exc}"
    return [replace(vs, msvc_toolsets=msvc_toolsets(Path(vs.install_path))) for vs in instances], None


def msvc_toolsets(install_path: Path) -> tuple[str, ...]:
    """Toolset versions under ``<install>\\VC\\Tools\\MSVC``, newest first."""
    base = install_path / "VC" / "Tools" / "MSVC"
    if not base.is_dir():
        return ()
    names = [p.name for p in base.iterdir() if p.is_dir() and p.name[:1].isdigit()]
    return tuple(sorted(names, key=lambda v: tuple(int(x) for x in v.split(".") if x.isdigit()), reverse=True))


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


def read_long_paths_enabled() -> int | None:
    """``HKLM\\SYSTEM\\CurrentControlSet\\Control\\FileSystem\\LongPathsEnabled``; None when absent."""
    import winreg  # type: ignore[import-not-found,unused-ignore]

    try:
        with winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE,  # type: ignore[attr-defined,unused-ignore]
                            r"SYSTEM\CurrentControlSet\Control\FileSystem") as key:
            value, _ = winreg.QueryValueEx(key, "LongPathsEnabled")  # type: ignore[attr-defined,unused-ignore]
            return int(value)
    except FileNotFoundError:
        return None
