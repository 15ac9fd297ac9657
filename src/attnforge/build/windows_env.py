"""The Windows build environment: which MSVC toolset nvcc will accept, the captured ``vcvars64`` environment,
and the variables a torch extension build needs on top of it.

Decisions are pure (a :class:`SystemSnapshot` in, values out); only :func:`capture_vcvars` runs anything,
through the :class:`Runner` seam. Nothing here was run on a real Windows machine: it is tested against
recorded outputs (``tests/fixtures/outputs/windows/``). Facts: shared/research/toolchain-facts.md §3 (MSVC
vs nvcc), §4 (vswhere, vcvars, long paths, CUDA_PATH); install-anchors.md §5.3, §5.4, §8.5.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PureWindowsPath
from typing import Protocol

from attnforge._system.runner import Runner
from attnforge.catalog.msvc import MsvcCatalog
from attnforge.errors import BuildError
from attnforge.probe.parsers import toolset_msc_ver
from attnforge.probe.snapshot import CudaToolkit, SystemSnapshot, VisualStudio

MajorMinor = tuple[int, int]

#: The short roots a Windows build runs under (MAX_PATH is 260 for cl.exe even with LongPathsEnabled=1;
#: toolchain-facts.md §4.3, xformers#1161: setuptools nests the absolute source path under the build dir).
SHORT_ROOT = r"C:\af"
_CAPTURE_MARKER = "===attnforge-vcvars-set==="
_ENV_LINE = re.compile(r"^([A-Za-z_][^=\r\n]*)=(.*)$")


class MsvcWindow(Protocol):
    """One row of nvcc's host-compiler table (``catalog.toolchain.HostCompilerRange`` fits): nvcc of CUDA
    ``cuda_min``..``cuda_max`` accepts ``_MSC_VER`` in ``[msc_min, msc_end)``."""

    @property
    def cuda_min(self) -> MajorMinor: ...
    @property
    def cuda_max(self) -> MajorMinor: ...
    @property
    def msc_min(self) -> int: ...
    @property
    def msc_end(self) -> int: ...


class FixKind(StrEnum):
    """The real ways out of "unsupported Microsoft Visual Studio version" (toolchain-facts.md §3.3)."""

    NEWER_CUDA = "newer-cuda"
    OLDER_TOOLSET = "older-toolset"
    NEWER_TOOLSET = "newer-toolset"
    ALLOW_UNSUPPORTED = "allow-unsupported-compiler"


@dataclass(frozen=True, slots=True, kw_only=True)
class MsvcFix:
    """One way to make nvcc accept the host compiler.

    Attributes:
        kind: which of the fixes this is.
        text: one sentence for people, with the command where there is one.
        vcvars_ver: for ``older-toolset``: the ``-vcvars_ver=`` value (``"14.39"``).
        cuda_min: for ``newer-cuda``: the oldest CUDA whose nvcc accepts this MSVC (``"12.4"``).
        nvcc_flags: for ``allow-unsupported-compiler``: what goes into ``NVCC_APPEND_FLAGS``.
        installed: the toolset or toolkit is already on this machine (attnforge can apply it by itself).
        at_users_risk: nvcc's own words: the build may fail later or miscompile.
    """

    kind: FixKind
    text: str
    vcvars_ver: str | None = None
    cuda_min: str | None = None
    nvcc_flags: tuple[str, ...] = ()
    installed: bool = False
    at_users_risk: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class MsvcCheck:
    """Whether nvcc of CUDA ``cuda`` accepts MSVC ``msc_ver``, and if not, every fix.

    Attributes:
        ok: True when accepted, False when nvcc or the STL will refuse it, None when no data covers this CUDA.
        problem: what will fail, in the compiler's words, when ``ok`` is False.
    """

    ok: bool | None
    msc_ver: int
    cuda: MajorMinor
    window: tuple[int, int] | None
    problem: str | None = None
    fixes: tuple[MsvcFix, ...] = ()


def _mm(text: str) -> MajorMinor:
    m = re.match(r"^\s*(\d+)\.(\d+)", text)
    if m is None:
        raise ValueError(f"not a MAJOR.MINOR version: {text!r}")
    return (int(m.group(1)), int(m.group(2)))


def _fmt(v: MajorMinor) -> str:
    return f"{v[0]}.{v[1]}"


def _toolset_name(msc: int) -> str:
    return f"14.{msc - 1900}"


def window_for(cuda: MajorMinor, windows: Sequence[MsvcWindow]) -> MsvcWindow | None:
    """The host-compiler row covering nvcc of CUDA ``cuda``."""
    return next((w for w in windows if w.cuda_min <= cuda <= w.cuda_max), None)


def check_msvc(
    *,
    msc: int,
    cuda: MajorMinor,
    windows: Sequence[MsvcWindow],
    msvc: MsvcCatalog,
    installed_toolsets: Sequence[str] = (),
    torch_cuda: MajorMinor | None = None,
) -> MsvcCheck:
    """Check one MSVC against one nvcc, with the three real fixes when it fails.

    A compiler above nvcc's window fails in ``host_config.h`` with "unsupported Microsoft Visual Studio
    version" (C1189); from MSVC 14.41 the STL adds its own STL1002 for CUDA < 12.4, which
    ``-allow-unsupported-compiler`` does not silence (toolchain-facts.md §3.3-§3.4). Fixes, in the order
    attnforge prefers them: a newer CUDA (same major as torch's when given), an older side-by-side toolset via
    ``vcvars64.bat -vcvars_ver=14.xx``, or ``-allow-unsupported-compiler`` at the user's risk.

    Args:
        msc: the ``_MSC_VER`` of the compiler (``1944``).
        cuda: the nvcc release (``(12, 3)``).
        windows: nvcc host-compiler rows (``toolchain.host_compilers``).
        msvc: the STL floors and release names.
        installed_toolsets: MSVC toolsets on this machine (``"14.39.33519"``), used for the older-toolset fix.
        torch_cuda: torch's CUDA; a newer toolkit of another major would not match torch.
    """
    window = window_for(cuda, windows)
    if window is None:
        return MsvcCheck(ok=None, msc_ver=msc, cuda=cuda, window=None,
                         problem=f"attnforge has no host-compiler data for CUDA {_fmt(cuda)}")
    floor = msvc.stl_floor(msc)
    stl_blocks = floor is not None and cuda < floor.cuda_min
    in_window = window.msc_min <= msc < window.msc_end
    if in_window and not stl_blocks:
        return MsvcCheck(ok=True, msc_ver=msc, cuda=cuda, window=(window.msc_min, window.msc_end))

    name = msvc.release_name(msc) or f"_MSC_VER {msc}"
    if in_window and floor is not None:
        problem = (f"MSVC {_toolset_name(msc)} ({name}) ships an STL that stops with {floor.error}: "
                   f"'Unexpected compiler version, expected CUDA {_fmt(floor.cuda_min)} or newer'")
    elif msc >= window.msc_end:
        problem = (f"nvcc {_fmt(cuda)} accepts _MSC_VER {window.msc_min}-{window.msc_end - 1}; MSVC "
                   f"{_toolset_name(msc)} ({name}, _MSC_VER {msc}) fails with 'C1189: #error: -- unsupported "
                   "Microsoft Visual Studio version!'")
    else:
        problem = (f"nvcc {_fmt(cuda)} needs _MSC_VER >= {window.msc_min}; "
                   f"MSVC {_toolset_name(msc)} ({name}) is too old for it")

    def accepts(row: MsvcWindow, m: int) -> bool:
        return row.msc_min <= m < row.msc_end and not floor_blocks(msvc, m, row.cuda_min)

    fixes: list[MsvcFix] = []
    if msc < window.msc_min:
        fixes.append(MsvcFix(kind=FixKind.NEWER_TOOLSET, text=(
            f"install Visual Studio 2022 Build Tools with the 'Desktop development with C++' workload "
            f"(nvcc {_fmt(cuda)} needs _MSC_VER {window.msc_min} or newer)")))
        return MsvcCheck(ok=False, msc_ver=msc, cuda=cuda, window=(window.msc_min, window.msc_end),
                         problem=problem, fixes=tuple(fixes))

    newer = sorted((w for w in windows if w.cuda_min > cuda and accepts(w, msc)), key=lambda w: w.cuda_min)
    if torch_cuda is not None:
        same_major = [w for w in newer if w.cuda_min[0] == torch_cuda[0]]
        newer = same_major or newer
    if newer:
        lo = newer[0].cuda_min
        fixes.append(MsvcFix(kind=FixKind.NEWER_CUDA, cuda_min=_fmt(lo), text=(
            f"install CUDA {_fmt(lo)} or newer (its nvcc accepts _MSC_VER {msc}) and point "
            "CUDA_HOME/CUDA_PATH at it")))

    fitting = [(m, t) for t in installed_toolsets if (m := _safe_msc(t)) is not None
               and window.msc_min <= m < window.msc_end and not floor_blocks(msvc, m, cuda)]
    if fitting:
        best = max(fitting)[1]
        ver = ".".join(best.split(".")[:2])
        fixes.append(MsvcFix(kind=FixKind.OLDER_TOOLSET, vcvars_ver=ver, installed=True, text=(
            f"use the installed MSVC {best} toolset: vcvars64.bat -vcvars_ver={ver}")))
    else:
        top = window.msc_end - 1
        while floor_blocks(msvc, top, cuda) and top > window.msc_min:
            top -= 1
        ver = _toolset_name(top)
        fixes.append(MsvcFix(kind=FixKind.OLDER_TOOLSET, vcvars_ver=ver, text=(
            f"install the MSVC {ver} toolset side by side (Visual Studio Installer > Individual components > "
            f"'MSVC v143 - VS 2022 C++ x64/x86 build tools (v{ver})') and select it with "
            f"vcvars64.bat -vcvars_ver={ver}")))

    flags = ["-allow-unsupported-compiler"]
    if floor is not None and cuda < floor.cuda_min:
        flags.append(floor.override)
    fixes.append(MsvcFix(kind=FixKind.ALLOW_UNSUPPORTED, nvcc_flags=tuple(flags), at_users_risk=True, text=(
        f"at your own risk, set NVCC_APPEND_FLAGS={' '.join(flags)} (nvcc's words: 'using an unsupported "
        "host compiler may cause compilation failure or incorrect run time execution')")))
    return MsvcCheck(ok=False, msc_ver=msc, cuda=cuda, window=(window.msc_min, window.msc_end),
                     problem=problem, fixes=tuple(fixes))


def floor_blocks(msvc: MsvcCatalog, msc: int, cuda: MajorMinor) -> bool:
    floor = msvc.stl_floor(msc)
    return floor is not None and cuda < floor.cuda_min


def _safe_msc(toolset: str) -> int | None:
    try:
        return toolset_msc_ver(toolset)
    except ValueError:
        return None


def default_toolset(snapshot: SystemSnapshot) -> tuple[VisualStudio, str] | None:
    """The Visual Studio instance and MSVC toolset a build gets by default: the newest instance's newest
    toolset (setuptools always takes ``vswhere -latest``; toolchain-facts.md §4.2)."""
    for vs in sorted(snapshot.visual_studio, key=lambda v: _version_key(v.version), reverse=True):
        if vs.msvc_toolsets:
            return vs, vs.msvc_toolsets[0]
    return None


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split(".") if x.isdigit())


# -- the vcvars64 environment --------------------------------------------------------------------------------
def vcvars_bat(vs: VisualStudio) -> PureWindowsPath:
    """``<installationPath>\\VC\\Auxiliary\\Build\\vcvars64.bat`` (toolchain-facts.md §4.1)."""
    return PureWindowsPath(vs.install_path) / "VC" / "Auxiliary" / "Build" / "vcvars64.bat"


def vcvars_command_line(vs: VisualStudio, vcvars_ver: str | None = None) -> str:
    """The one-liner people run to see the same environment:
    ``cmd /s /c ""<vs>\\VC\\Auxiliary\\Build\\vcvars64.bat" -vcvars_ver=14.39 && set"``.

    It must be passed to ``cmd`` as one string: a list argv gets its inner quotes re-escaped by Python's
    ``list2cmdline`` (``\\"``), which cmd does not understand. :func:`capture_vcvars` therefore runs a small
    batch file instead.
    """
    ver = f" -vcvars_ver={vcvars_ver}" if vcvars_ver else ""
    return f'cmd /s /c ""{vcvars_bat(vs)}"{ver} && set"'


def vcvars_capture_script(vs: VisualStudio, vcvars_ver: str | None = None) -> str:
    """A batch file that runs vcvars64 and prints ``set`` after a marker line (CRLF line ends)."""
    ver = f" -vcvars_ver={vcvars_ver}" if vcvars_ver else ""
    lines = ["@echo off", f'call "{vcvars_bat(vs)}"{ver}', "if errorlevel 1 exit /b 1",
             f"echo {_CAPTURE_MARKER}", "set"]
    return "\r\n".join(lines) + "\r\n"


def parse_set_output(text: str) -> dict[str, str]:
    """Parse what ``set`` prints (``NAME=value`` per line) after vcvars64 ran.

    The vcvars banner (``** Visual Studio 2022 Developer Command Prompt``, ``[vcvarsall.bat] Environment
    initialized for: 'x64'``) is skipped; when the capture marker is present only what follows it is read.

    Raises:
        BuildError: vcvars printed ``[ERROR:...]`` lines (a ``-vcvars_ver`` toolset that is not installed).
    """
    lines = text.splitlines()
    errors = [ln.strip() for ln in lines if ln.lstrip().startswith("[ERROR:")]
    if errors:
        raise BuildError("vcvars64.bat failed to set up the Visual Studio environment", cause=errors[0],
                         hint="check the toolset with the Visual Studio Installer (Individual components > "
                              "MSVC v143 build tools) or drop -vcvars_ver")
    if _CAPTURE_MARKER in text:
        lines = text.split(_CAPTURE_MARKER, 1)[1].splitlines()
    env: dict[str, str] = {}
    for line in lines:
        m = _ENV_LINE.match(line.rstrip("\r"))
        if m and not line.startswith(("**", "[")):
            env[m.group(1)] = m.group(2)
    return env


def vc_env_problems(env: Mapping[str, str]) -> list[str]:
    """Sanity checks on a captured environment (toolchain-facts.md §4.2): x64 target, a toolset version,
    non-empty INCLUDE and LIB, and the x64-hosted compiler on PATH. Empty when all hold."""
    get = _getter(env)
    problems = []
    if get("VSCMD_ARG_TGT_ARCH").lower() != "x64":
        problems.append(f"VSCMD_ARG_TGT_ARCH is {get('VSCMD_ARG_TGT_ARCH') or 'unset'}, expected x64")
    if not get("VCToolsVersion"):
        problems.append("VCToolsVersion is unset (no MSVC toolset was activated)")
    for name in ("INCLUDE", "LIB"):
        if not get(name).strip(";"):
            problems.append(f"{name} is empty (Windows SDK or C++ workload missing?)")
    if "\\bin\\hostx64\\x64" not in get("PATH").lower():
        problems.append("PATH has no ...\\bin\\Hostx64\\x64 folder, so cl.exe for x64 is not reachable")
    return problems


def capture_vcvars(runner: Runner, vs: VisualStudio, scratch_dir: Path, vcvars_ver: str | None = None,
                   timeout_s: float = 120.0) -> dict[str, str]:
    """Run vcvars64 (optionally with ``-vcvars_ver``) and return the environment it leaves.

    Raises:
        BuildError: cmd failed, vcvars reported an error, or the environment fails :func:`vc_env_problems`.
    """
    scratch_dir.mkdir(parents=True, exist_ok=True)
    script = scratch_dir / "vcvars_capture.cmd"
    script.write_bytes(vcvars_capture_script(vs, vcvars_ver).encode("utf-8"))
    res = runner.run(("cmd", "/d", "/c", str(script)), timeout_s=timeout_s)
    env = parse_set_output(res.output)
    if not res.ok:
        tail = (res.output.strip().splitlines() or [f"exit {res.returncode}"])[-1]
        raise BuildError(f"vcvars64.bat of {vs.display_name} exited {res.returncode}", cause=tail,
                         hint=f"try it by hand: {vcvars_command_line(vs, vcvars_ver)}")
    problems = vc_env_problems(env)
    if problems:
        raise BuildError(f"the environment from {vcvars_bat(vs)} cannot build CUDA extensions",
                         cause="; ".join(problems),
                         hint="repair Visual Studio with the 'Desktop development with C++' workload")
    return env


def _getter(env: Mapping[str, str]) -> _Caseless:
    return _Caseless(env)


class _Caseless:
    """Windows environment names are case-insensitive (``Path`` is ``PATH``)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._lower = {k.lower(): v for k, v in env.items()}

    def __call__(self, name: str) -> str:
        return self._lower.get(name.lower(), "")


def merge_env(*layers: Mapping[str, str]) -> dict[str, str]:
    """Later layers win, names compared case-insensitively; the first spelling seen is kept."""
    out: dict[str, str] = {}
    spelling: dict[str, str] = {}
    for layer in layers:
        for key, value in layer.items():
            name = spelling.setdefault(key.lower(), key)
            out[name] = value
    return out


# -- the environment of one build ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class WindowsBuildEnv:
    """What a Windows source build runs with, decided before anything runs.

    Attributes:
        visual_studio: the instance whose vcvars64 is captured.
        vcvars_ver: the ``-vcvars_ver`` toolset, None for the instance's default.
        vcvars_command: the same capture as a command people can run.
        toolkit: the CUDA toolkit (exported as both CUDA_HOME and CUDA_PATH, its ``bin`` first on PATH).
        build_root: short (``C:\\afb\\<key8>`` from the resolver), so object paths stay under MAX_PATH.
        temp_dir: ``<build_root>\\t``: TMP/TEMP, so pip's build dirs are short too.
        env: the variables to set on top of the captured vcvars environment.
        msvc: the MSVC-vs-nvcc check this environment was chosen by.
        notes: why each choice was made.
    """

    visual_studio: VisualStudio
    vcvars_ver: str | None
    vcvars_command: str
    toolkit: CudaToolkit
    build_root: str
    temp_dir: str
    env: dict[str, str]
    msvc: MsvcCheck
    notes: tuple[str, ...]

    def full_env(self, base: Mapping[str, str], captured: Mapping[str, str]) -> dict[str, str]:
        """The environment to run the build with: the user's, then vcvars', then ours; CUDA's bin first
        on PATH."""
        merged = merge_env(base, captured, self.env)
        path_key = next((k for k in merged if k.lower() == "path"), "PATH")
        cuda_bin = str(PureWindowsPath(self.toolkit.path) / "bin")
        merged[path_key] = cuda_bin + ";" + merged.get(path_key, "")
        return merged


def windows_build_env(
    snapshot: SystemSnapshot,
    *,
    key8: str,
    windows: Sequence[MsvcWindow],
    msvc: MsvcCatalog,
    build_root: str | None = None,
    msvc_toolset: str | None = None,
    allow_unsupported_compiler: bool = False,
    short_root: str = SHORT_ROOT,
    toolkit: CudaToolkit | None = None,
) -> WindowsBuildEnv:
    """Choose the Visual Studio toolset and CUDA toolkit for a Windows build and the variables around them.

    Picks, in order: a toolkit whose nvcc accepts the default MSVC (same CUDA major as torch); else the
    default toolkit with an installed older toolset (``-vcvars_ver``); else, only with
    ``allow_unsupported_compiler``, ``-allow-unsupported-compiler``. Sets ``DISTUTILS_USE_SDK=1`` (so neither
    setuptools nor torch re-runs vcvars and torch's "VC environment is activated but DISTUTILS_USE_SDK is not
    set" check passes), ``TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES=1``, short TMP/TEMP, CUDA_HOME and
    CUDA_PATH, and the conformance flags in ``NVCC_APPEND_FLAGS`` (install-anchors.md §8.4-§8.5, §10
    KB-14/16/17).

    Args:
        snapshot: a Windows snapshot with Visual Studio instances and CUDA toolkits.
        key8: 8 hex digits naming this build (the BuildSpec's leaf); names the default build root.
        windows: nvcc host-compiler rows (``toolchain.host_compilers``).
        msvc: the MSVC catalog (STL floors, conformance flags).
        build_root: the resolver's short build root (``BuildSpec.build_root``); default ``C:\\af\\b\\<key8>``.
            TMP/TEMP go to ``<build_root>\\t``.
        msvc_toolset: the toolset the resolver selected (``BuildSpec.msvc_toolset``, ``"14.44"``), else the
            newest instance's newest toolset.
        allow_unsupported_compiler: accept ``-allow-unsupported-compiler`` when nothing else fits.
        short_root: the short root (``C:\\af``).
        toolkit: the toolkit the resolver chose (``BuildSpec.toolkit``), tried first; default the
            snapshot's primary toolkit.

    Raises:
        BuildError: no Visual Studio with a toolset, no CUDA toolkit, a Python that cannot build extensions,
            or an MSVC nvcc refuses with no installed fix (the hint lists every fix).
    """
    if not re.fullmatch(r"[0-9a-f]{8}", key8):
        raise BuildError(f"build key prefix {key8!r} is not 8 hex digits")
    dev = snapshot.python_dev
    if dev is not None and not dev.can_build_extensions:
        missing = [str(PureWindowsPath(dev.include_dir) / "Python.h")] if not dev.has_python_h else []
        if dev.has_import_lib is False and dev.libs_dir and dev.import_lib:
            missing.append(str(PureWindowsPath(dev.libs_dir) / dev.import_lib))
        kind = " (an embedded/portable distribution)" if dev.embedded else ""
        raise BuildError(
            f"this Python cannot compile extensions{kind}",
            cause=f"missing {', '.join(missing)}",
            hint=f"copy the 'include' and 'libs' folders of CPython {snapshot.platform.python_version} into "
                 f"{PureWindowsPath(dev.include_dir).parent}, or build with a full CPython install")
    chosen = _instance_with(snapshot, msvc_toolset) if msvc_toolset else default_toolset(snapshot)
    if chosen is None:
        raise BuildError("no Visual Studio instance with an MSVC x64 toolset was found",
                         cause=snapshot.problem("visual_studio"),
                         hint="install Visual Studio 2022 Build Tools with the 'Desktop development with "
                              "C++' workload")
    vs, toolset = chosen
    toolkits = [t for t in snapshot.cuda_toolkits if t.has_headers] or list(snapshot.cuda_toolkits)
    if not toolkits:
        raise BuildError("no CUDA toolkit (nvcc.exe) was found", cause=snapshot.problem("cuda_toolkits"),
                         hint=r"install the CUDA toolkit matching torch's CUDA major; it lands in "
                              r"C:\Program Files\NVIDIA GPU Computing Toolkit\CUDA\vX.Y and sets CUDA_PATH")
    torch_cuda = _mm(snapshot.torch.cuda_version) if snapshot.torch and snapshot.torch.cuda_version else None
    msc = toolset_msc_ver(toolset)
    vcvars_ver = ".".join(toolset.split(".")[:2]) if msvc_toolset else None
    notes = [f"Visual Studio: {vs.display_name} {vs.version}, MSVC {toolset} (_MSC_VER {msc})"]
    everywhere = tuple(ts for v in snapshot.visual_studio for ts in v.msvc_toolsets)

    primary = toolkit or snapshot.primary_toolkit or toolkits[0]
    ordered = sorted(toolkits, key=lambda t: (t.path != primary.path, _major_mismatch(t, torch_cuda)))
    checks = [(t, check_msvc(msc=msc, cuda=_mm(t.version), windows=windows, msvc=msvc,
                             installed_toolsets=everywhere, torch_cuda=torch_cuda))
              for t in ordered]
    toolkit, check = checks[0]
    extra_flags: tuple[str, ...] = ()
    if check.ok is False:
        good = next(((t, c) for t, c in checks if c.ok and not _major_mismatch(t, torch_cuda)), None)
        older = next((f for f in check.fixes if f.kind is FixKind.OLDER_TOOLSET and f.installed), None)
        allow = next((f for f in check.fixes if f.kind is FixKind.ALLOW_UNSUPPORTED), None)
        if good is not None:
            notes.append(f"CUDA {toolkit.version} refuses this MSVC ({check.problem}); using the installed "
                         f"CUDA {good[0].version} instead")
            toolkit, check = good
        elif older is not None and older.vcvars_ver is not None:
            vs, toolset = _instance_with(snapshot, older.vcvars_ver) or (vs, toolset)
            vcvars_ver = older.vcvars_ver
            notes.append(f"{check.problem}; {older.text} (in {vs.display_name})")
        elif allow is not None and allow_unsupported_compiler:
            extra_flags = allow.nvcc_flags
            notes.append(f"{check.problem}; {allow.text}")
        else:
            raise BuildError(f"nvcc {toolkit.version} will refuse the Visual Studio compiler",
                             cause=check.problem, hint="; or ".join(f.text for f in check.fixes))
    elif check.ok is None:
        notes.append(f"{check.problem}: the MSVC/nvcc pairing was not checked")
    notes.append(f"CUDA {toolkit.version} at {toolkit.path}")

    cuda = _mm(toolkit.version)
    torch_mm = _mm(snapshot.torch.version) if snapshot.torch else None
    flags = [f.flag for f in msvc.flags_for(cuda=cuda, torch=torch_mm)] + list(extra_flags)
    user_flags = snapshot.env.get("NVCC_APPEND_FLAGS", "").split()
    build_root = build_root or str(PureWindowsPath(short_root) / "b" / key8)
    temp_dir = str(PureWindowsPath(build_root) / "t")
    env = {
        "DISTUTILS_USE_SDK": "1",
        "TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES": "1",
        "CUDA_HOME": toolkit.path,
        "CUDA_PATH": toolkit.path,
        "TMP": temp_dir,
        "TEMP": temp_dir,
        "NVCC_APPEND_FLAGS": " ".join(user_flags + [f for f in flags if f not in user_flags]),
    }
    if snapshot.long_paths_enabled is not True:
        notes.append("LongPathsEnabled is not 1: the build runs under a short root (cl.exe is not long-path "
                     "aware either way)")
    return WindowsBuildEnv(visual_studio=vs, vcvars_ver=vcvars_ver,
                           vcvars_command=vcvars_command_line(vs, vcvars_ver), toolkit=toolkit,
                           build_root=build_root, temp_dir=temp_dir, env=env, msvc=check, notes=tuple(notes))


def _instance_with(snapshot: SystemSnapshot, toolset: str) -> tuple[VisualStudio, str] | None:
    """The newest instance holding the toolset ``toolset`` (``"14.39"`` or ``"14.39.33519"``)."""
    for vs in sorted(snapshot.visual_studio, key=lambda v: _version_key(v.version), reverse=True):
        for ts in vs.msvc_toolsets:
            if ts == toolset or ts.startswith(toolset + "."):
                return vs, ts
    return None


def _major_mismatch(toolkit: CudaToolkit, torch_cuda: MajorMinor | None) -> bool:
    return torch_cuda is not None and _mm(toolkit.version)[0] != torch_cuda[0]
