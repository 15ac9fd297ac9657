"""The Windows build environment: the captured ``vcvars64`` environment and the variables a torch extension
build needs on top of it, for the toolset and toolkit the resolver chose.

Which MSVC toolset and CUDA toolkit to use is decided once, in :mod:`attnforge.resolve.msvc`; this module only
executes that decision. Only :func:`capture_vcvars` runs anything, through the :class:`Runner` seam.
Nothing here was run on a real Windows machine: it is tested against
recorded outputs (``tests/fixtures/outputs/windows/``). Facts: docs/research/toolchain-facts.md §3 (MSVC
vs nvcc), §4 (vswhere, vcvars, long paths, CUDA_PATH); install-anchors.md §5.3, §5.4, §8.5.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath

from attnforge._system.runner import Runner
from attnforge.catalog.msvc import MsvcCatalog
from attnforge.errors import BuildError
from attnforge.probe.snapshot import CudaToolkit, SystemSnapshot, VisualStudio
from attnforge.resolve.msvc import MsvcCheck, WindowsToolchain
from attnforge.types.versions import parse_major_minor

_CAPTURE_MARKER = "===attnforge-vcvars-set==="
_ENV_LINE = re.compile(r"^([A-Za-z_][^=\r\n]*)=(.*)$")


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
    toolchain: WindowsToolchain,
    msvc: MsvcCatalog,
    build_root: str | None = None,
) -> WindowsBuildEnv:
    """The variables around the toolset and toolkit chosen for a Windows build.

    ``toolchain`` is :func:`attnforge.resolve.msvc.choose_windows_toolchain` asked with the BuildSpec's
    ``msvc_toolset`` and ``toolkit`` (the resolver's answers): this function only executes that decision.
    Sets ``DISTUTILS_USE_SDK=1`` (so neither
    setuptools nor torch re-runs vcvars and torch's "VC environment is activated but DISTUTILS_USE_SDK is not
    set" check passes), ``TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES=1``, short TMP/TEMP, CUDA_HOME and
    CUDA_PATH, and the conformance flags in ``NVCC_APPEND_FLAGS`` (install-anchors.md §8.4-§8.5, §10
    KB-14/16/17).

    Args:
        snapshot: a Windows snapshot with Visual Studio instances and CUDA toolkits.
        key8: 8 hex digits naming this build (the BuildSpec's leaf); names the default build root.
        toolchain: the Visual Studio instance, toolset, CUDA toolkit and extra nvcc flags to use.
        msvc: the MSVC catalog (conformance flags, the short build root).
        build_root: the resolver's short build root (``BuildSpec.build_root``); default ``C:\\afb\\<key8>``
            (msvc.toml ``[build_root]``). TMP/TEMP go to ``<build_root>\\t``.

    Raises:
        BuildError: a Python that cannot build extensions.
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
    tc = toolchain
    vs, vcvars_ver, toolkit, notes = tc.visual_studio, tc.vcvars_ver, tc.toolkit, list(tc.notes)
    cuda = parse_major_minor(toolkit.version)
    torch_mm = parse_major_minor(snapshot.torch.version) if snapshot.torch else None
    flags = [f.flag for f in msvc.flags_for(cuda=cuda, torch=torch_mm)] + list(tc.nvcc_flags)
    user_flags = snapshot.env.get("NVCC_APPEND_FLAGS", "").split()
    build_root = build_root or str(PureWindowsPath("C:\\") / msvc.build_root.short_dir / key8)
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
                           build_root=build_root, temp_dir=temp_dir, env=env, msvc=tc.check, notes=tuple(notes))
