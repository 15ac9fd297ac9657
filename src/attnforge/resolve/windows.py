"""Windows parts of the build preflight: an MSVC toolset that nvcc accepts, path lengths, DISTUTILS_USE_SDK.

Kept apart from :mod:`attnforge.resolve.preflight` so the Windows build environment can extend it.
Sources: toolchain-facts.md §3.1 (nvcc's ``_MSC_VER`` windows), §3.2 (toolset 14.xx -> ``_MSC_VER`` 19xx),
§3.3-§3.4 (VS 17.10 / MSVC 14.40 breaks CUDA <= 12.3; 14.41+ adds STL1002), §4.1 (``vcvarsall -vcvars_ver``),
§4.3 (MAX_PATH, cl.exe is not long-path aware); install-anchors.md KB-09, KB-14, KB-16.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PureWindowsPath

from attnforge.catalog import Catalog
from attnforge.catalog.toolchain import HostCompilerRange, MajorMinor, format_major_minor
from attnforge.probe.snapshot import CudaToolkit, SystemSnapshot
from attnforge.resolve.preflight import Check, allowed_unsupported, toolkit_version

#: Longest build root attnforge uses on Windows. ninja object paths repeat the absolute source path under
#: build\temp.win-amd64-...\Release\, and cl.exe is not long-path aware (KB-14; mjun0812 builds from C:\b\fa).
MAX_BUILD_ROOT_CHARS = 40
#: Where the build root goes when the attnforge home is too long (drive root of the home).
SHORT_ROOT_NAME = "afb"


@dataclass(frozen=True, slots=True, kw_only=True)
class MsvcToolset:
    """One MSVC toolset nvcc could use as host compiler."""

    version: str  # "14.40.33807" (toolset) — for an active ``cl`` without a known toolset, its own version
    msc_ver: int  # 1940
    origin: str  # "VS Build Tools 2022 17.10.35013.141" or "cl on PATH"

    @property
    def vcvars_ver(self) -> str:
        """``14.40`` (the value for ``vcvarsall.bat x64 -vcvars_ver=``)."""
        return ".".join(self.version.split(".")[:2])


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowsChecks:
    checks: tuple[Check, ...]
    notes: tuple[str, ...]
    msvc_toolset: str | None


def msc_ver_of_toolset(version: str) -> int | None:
    """``"14.40.33807"`` -> 1940 (toolset 14.xx gives ``_MSC_VER`` 19xx, toolchain-facts.md §3.2)."""
    parts = version.split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()) or parts[0] != "14":
        return None
    return 1900 + int(parts[1])


def msc_ver_of_cl(version: str) -> int | None:
    """``"19.40.33811"`` (what ``cl`` prints) -> 1940."""
    parts = version.split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]) * 100 + int(parts[1])


def msvc_toolsets(snapshot: SystemSnapshot) -> list[MsvcToolset]:
    """Every MSVC toolset the snapshot knows: each VS instance's toolsets, then the active ``cl``."""
    found: list[MsvcToolset] = []
    for vs in snapshot.visual_studio:
        for ts in vs.msvc_toolsets:
            msc = msc_ver_of_toolset(ts)
            if msc is not None:
                found.append(MsvcToolset(version=ts, msc_ver=msc, origin=f"{vs.display_name} {vs.version}"))
    cl = snapshot.compiler("cl")
    if cl is not None:
        msc = msc_ver_of_cl(cl.version)
        if msc is not None and all(t.msc_ver != msc for t in found):
            found.append(
                MsvcToolset(version=f"14.{msc - 1900}", msc_ver=msc, origin=f"cl {cl.version} on PATH")
            )
    return found


def windows_checks(snapshot: SystemSnapshot, catalog: Catalog, toolkit: CudaToolkit | None, *,
                   allow_unsupported_compiler: bool = False) -> WindowsChecks:
    """The MSVC toolset, path-length and dev-shell checks for a Windows build.

    With ``allow_unsupported_compiler`` an MSVC that nvcc refuses passes, at the user's risk: the newest
    toolset is kept and the build executor adds ``-allow-unsupported-compiler`` (and the STL override where
    MSVC's own STL refuses the CUDA version; :func:`attnforge.build.windows_env.check_msvc`).
    """
    notes: list[str] = []
    checks: list[Check] = []
    msvc, msvc_check = _msvc_check(snapshot, catalog, toolkit)
    if not msvc_check.ok and allow_unsupported_compiler and msvc is None and msvc_toolsets(snapshot):
        msvc = max(msvc_toolsets(snapshot), key=lambda t: t.msc_ver)
        msvc_check = allowed_unsupported(msvc_check)
        notes.append(msvc_check.reason)
    checks.append(msvc_check)
    if snapshot.long_paths_enabled is not True:
        notes.append(
            "LongPathsEnabled is off: attnforge builds under a short root; git clones of deep trees may "
            "still fail (enable it: HKLM\\SYSTEM\\CurrentControlSet\\Control\\FileSystem\\LongPathsEnabled=1,"
            " and git config --system core.longpaths true)"
        )
    if "VSCMD_ARG_TGT_ARCH" in snapshot.env and "DISTUTILS_USE_SDK" not in snapshot.env:
        notes.append(
            "a Visual Studio developer shell is active without DISTUTILS_USE_SDK; the build sets "
            "DISTUTILS_USE_SDK=1 (torch's _check_abi raises otherwise)"
        )
    return WindowsChecks(
        checks=tuple(checks), notes=tuple(notes), msvc_toolset=msvc.vcvars_ver if msvc else None
    )


def _msvc_check(
    snapshot: SystemSnapshot, catalog: Catalog, toolkit: CudaToolkit | None
) -> tuple[MsvcToolset | None, Check]:
    toolsets = msvc_toolsets(snapshot)
    if not toolsets:
        return None, Check(
            name="msvc",
            ok=False,
            reason="no MSVC toolset found (vswhere lists no Visual Studio with the C++ x64 tools, no cl on "
                   "PATH)",
            fix="install Visual Studio 2022 Build Tools with the 'Desktop development with C++' workload",
        )
    version = toolkit_version(toolkit) if toolkit else None
    if toolkit is None or version is None:
        best = max(toolsets, key=lambda t: t.msc_ver)
        return best, Check(
            name="msvc", ok=True, reason=f"MSVC {best.version} ({best.origin}); no nvcc to check it"
        )
    window = catalog.tools.host_range(version)
    if window is None:
        best = max(toolsets, key=lambda t: t.msc_ver)
        return best, Check(
            name="msvc",
            ok=True,
            reason=f"MSVC {best.version}; no MSVC table for CUDA {toolkit.version}, nvcc decides",
        )
    fitting = [t for t in toolsets if window.msc_min <= t.msc_ver < window.msc_end]
    if fitting:
        best = max(fitting, key=lambda t: t.msc_ver)
        return best, Check(
            name="msvc",
            ok=True,
            reason=f"MSVC {best.version} (_MSC_VER {best.msc_ver}, {best.origin}) is inside what nvcc "
            f"{toolkit.version} accepts [{window.msc_min}, {window.msc_end}); selected with "
            f"vcvarsall.bat x64 -vcvars_ver={best.vcvars_ver}",
        )
    found = ", ".join(f"{t.version} (_MSC_VER {t.msc_ver}, {t.origin})" for t in toolsets)
    last_ok = window.msc_end - 1
    fixes = [
        f"install the MSVC v14.{last_ok - 1900} toolset side by side (Visual Studio Installer > Individual "
        f"components > 'MSVC v143 - VS 2022 C++ x64/x86 build tools (v14.{last_ok - 1900})'); attnforge "
        f"selects it "
        f"with vcvarsall.bat x64 -vcvars_ver=14.{last_ok - 1900}",
    ]
    newer = _newer_cuda_accepting(catalog, version, max(t.msc_ver for t in toolsets))
    if newer is not None:
        fixes.append(
            f"or install CUDA {format_major_minor(newer.cuda_min)} or newer {version[0]}.x (accepts "
            f"_MSC_VER [{newer.msc_min}, {newer.msc_end})) and point CUDA_HOME/CUDA_PATH at it"
        )
    fixes.append("or, at your own risk, build with --allow-unsupported-compiler (nvcc's "
                 "-allow-unsupported-compiler)")
    stl = [t for t in toolsets if t.msc_ver >= 1941]
    extra = ""
    if stl and version < (12, 4):
        extra = (
            "; MSVC 14.41+ also rejects CUDA < 12.4 in its STL (STL1002), so -allow-unsupported-compiler "
            "does not help"
        )
    return None, Check(
        name="msvc",
        ok=False,
        reason=f"nvcc {toolkit.version} accepts _MSC_VER [{window.msc_min}, {window.msc_end}) (Visual "
               f"Studio up to "
        f"the {_last_vs(last_ok)}), found MSVC {found}; host_config.h stops with 'unsupported Microsoft "
        f"Visual Studio version'{extra}",
        fix="; ".join(fixes),
    )


def _last_vs(msc_ver: int) -> str:
    """Name the last Visual Studio release a ``_MSC_VER`` bound allows (toolchain-facts.md §3.2)."""
    if 1930 <= msc_ver <= 1944:
        return f"VS 2022 17.{msc_ver - 1930} toolset 14.{msc_ver - 1900}"
    return f"toolset 14.{msc_ver - 1900}"


def _newer_cuda_accepting(catalog: Catalog, version: MajorMinor, msc_ver: int) -> HostCompilerRange | None:
    """The first host-compiler row of the same CUDA major, newer than ``version``, whose
    window takes ``msc_ver``.
    """
    rows = sorted(catalog.tools.host_compilers, key=lambda r: r.cuda_min)
    return next(
        (
            r
            for r in rows
            if r.cuda_min[0] == version[0] and r.cuda_min > version and r.msc_min <= msc_ver < r.msc_end
        ),
        None,
    )


def short_build_root(home: str, leaf: str) -> tuple[str, str | None]:
    """``<home>\\b\\<leaf>``, or ``<drive>:\\afb\\<leaf>`` when that is longer than
    :data:`MAX_BUILD_ROOT_CHARS`.

    Returns:
        the root, and a note when the short form was used.
    """
    root = PureWindowsPath(home) / "b" / leaf
    if len(str(root)) <= MAX_BUILD_ROOT_CHARS:
        return str(root), None
    drive = PureWindowsPath(home).drive or "C:"
    short = PureWindowsPath(f"{drive}\\") / SHORT_ROOT_NAME / leaf
    return str(short), (
        f"building under {short} instead of {root} ({len(str(root))} characters): MSVC's cl.exe is "
        "not long-path aware and object paths repeat the source path (KB-14)"
    )
