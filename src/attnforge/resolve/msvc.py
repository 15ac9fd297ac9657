"""Which MSVC toolset and CUDA toolkit a Windows build uses: decided once, here, from the catalog's data.

nvcc's ``_MSC_VER`` window per CUDA release is ``toolchain.toml`` ``[[host_compilers]]``; MSVC's own STL floor,
the conformance flags and Visual Studio release names are ``msvc.toml``. The resolver's preflight
(:mod:`attnforge.resolve.windows`) asks :func:`choose_windows_toolchain` and writes the answer into the
BuildSpec (``toolkit``, ``msvc_toolset``); the build (:mod:`attnforge.build.windows_env`) asks the same function
with those answers, so it can only execute what the plan chose. Facts: docs/research/toolchain-facts.md §3
(MSVC vs nvcc), §4.2 (vswhere -latest); install-anchors.md §10 KB-09/16.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from attnforge._compat import StrEnum
from attnforge.catalog.msvc import MsvcCatalog
from attnforge.errors import BuildError
from attnforge.probe.parsers import toolset_msc_ver
from attnforge.probe.snapshot import CudaToolkit, SystemSnapshot, VisualStudio
from attnforge.types.versions import MajorMinor, format_major_minor, loose_version, major_minor, parse_major_minor


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
                         problem=f"attnforge has no host-compiler data for CUDA {format_major_minor(cuda)}")
    floor = msvc.stl_floor(msc)
    stl_blocks = floor is not None and cuda < floor.cuda_min
    in_window = window.msc_min <= msc < window.msc_end
    if in_window and not stl_blocks:
        return MsvcCheck(ok=True, msc_ver=msc, cuda=cuda, window=(window.msc_min, window.msc_end))

    name = msvc.release_name(msc) or f"_MSC_VER {msc}"
    if in_window and floor is not None:
        problem = (f"MSVC {_toolset_name(msc)} ({name}) ships an STL that stops with {floor.error}: "
                   f"'Unexpected compiler version, expected CUDA {format_major_minor(floor.cuda_min)} or newer'")
    elif msc >= window.msc_end:
        problem = (f"nvcc {format_major_minor(cuda)} accepts _MSC_VER {window.msc_min}-{window.msc_end - 1}; MSVC "
                   f"{_toolset_name(msc)} ({name}, _MSC_VER {msc}) fails with 'C1189: #error: -- unsupported "
                   "Microsoft Visual Studio version!'")
    else:
        problem = (f"nvcc {format_major_minor(cuda)} needs _MSC_VER >= {window.msc_min}; "
                   f"MSVC {_toolset_name(msc)} ({name}) is too old for it")

    def accepts(row: MsvcWindow, m: int) -> bool:
        return row.msc_min <= m < row.msc_end and not floor_blocks(msvc, m, row.cuda_min)

    fixes: list[MsvcFix] = []
    if msc < window.msc_min:
        fixes.append(MsvcFix(kind=FixKind.NEWER_TOOLSET, text=(
            f"install Visual Studio 2022 Build Tools with the 'Desktop development with C++' workload "
            f"(nvcc {format_major_minor(cuda)} needs _MSC_VER {window.msc_min} or newer)")))
        return MsvcCheck(ok=False, msc_ver=msc, cuda=cuda, window=(window.msc_min, window.msc_end),
                         problem=problem, fixes=tuple(fixes))

    newer = sorted((w for w in windows if w.cuda_min > cuda and accepts(w, msc)), key=lambda w: w.cuda_min)
    if torch_cuda is not None:
        same_major = [w for w in newer if w.cuda_min[0] == torch_cuda[0]]
        newer = same_major or newer
    if newer:
        lo = newer[0].cuda_min
        fixes.append(MsvcFix(kind=FixKind.NEWER_CUDA, cuda_min=format_major_minor(lo), text=(
            f"install CUDA {format_major_minor(lo)} or newer (its nvcc accepts _MSC_VER {msc}) and point "
            "CUDA_HOME/CUDA_PATH at it")))

    fitting = [(m, t) for t in installed_toolsets if (m := _safe_msc(t)) is not None
               and window.msc_min <= m < window.msc_end and not floor_blocks(msvc, m, cuda)]
    if fitting:
        best = max(fitting)[1]
        ver = major_minor(best)
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
        f"at your own risk, build with --allow-unsupported-compiler (NVCC_APPEND_FLAGS={' '.join(flags)}; "
        "nvcc's words: 'using an unsupported host compiler may cause compilation failure or incorrect run "
        "time execution')")))
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
    for vs in sorted(snapshot.visual_studio, key=lambda v: loose_version(v.version), reverse=True):
        if vs.msvc_toolsets:
            return vs, vs.msvc_toolsets[0]
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowsToolchain:
    """The decision for one Windows build.

    Attributes:
        visual_studio: the instance whose ``vcvars64.bat`` sets the environment.
        toolset: the MSVC toolset (``"14.39.33519"``).
        vcvars_ver: the ``-vcvars_ver=`` value, None for the instance's default toolset.
        toolkit: the CUDA toolkit nvcc comes from.
        check: the MSVC-vs-nvcc check of this pair.
        nvcc_flags: what ``-allow-unsupported-compiler`` adds (empty unless the user allowed it and it is needed).
        notes: why each choice was made.
    """

    visual_studio: VisualStudio
    toolset: str
    vcvars_ver: str | None
    toolkit: CudaToolkit
    check: MsvcCheck
    nvcc_flags: tuple[str, ...]
    notes: tuple[str, ...]


def choose_windows_toolchain(
    snapshot: SystemSnapshot,
    *,
    windows: Sequence[MsvcWindow],
    msvc: MsvcCatalog,
    msvc_toolset: str | None = None,
    toolkit: CudaToolkit | None = None,
    allow_unsupported_compiler: bool = False,
) -> WindowsToolchain:
    """Choose the Visual Studio toolset and CUDA toolkit for a Windows build.

    Picks, in order: a toolkit whose nvcc accepts the default MSVC (same CUDA major as torch); else the
    given toolkit with an installed older toolset (``-vcvars_ver``); else, only with
    ``allow_unsupported_compiler``, ``-allow-unsupported-compiler`` (plus the STL override where MSVC's STL
    refuses that CUDA).

    Args:
        snapshot: a Windows snapshot with Visual Studio instances and CUDA toolkits.
        windows: nvcc host-compiler rows (``toolchain.host_compilers``).
        msvc: the MSVC catalog (STL floors, release names).
        msvc_toolset: a toolset already chosen (``"14.39"``), else the newest instance's newest toolset.
        toolkit: the toolkit to try first, default the snapshot's primary toolkit.
        allow_unsupported_compiler: accept ``-allow-unsupported-compiler`` when nothing else fits.

    Raises:
        BuildError: no Visual Studio with a toolset, no CUDA toolkit, or an MSVC nvcc refuses with no fix
            that can be applied (the hint lists every fix).
    """
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
    t = snapshot.torch
    torch_cuda = parse_major_minor(t.cuda_version) if t and t.cuda_version else None
    msc = toolset_msc_ver(toolset)
    vcvars_ver = major_minor(toolset) if msvc_toolset else None
    notes = [f"Visual Studio: {vs.display_name} {vs.version}, MSVC {toolset} (_MSC_VER {msc})"]
    everywhere = tuple(ts for v in snapshot.visual_studio for ts in v.msvc_toolsets)

    primary = toolkit or snapshot.primary_toolkit or toolkits[0]
    ordered = sorted(toolkits, key=lambda t: (t.path != primary.path, _major_mismatch(t, torch_cuda)))
    checks = [(t, check_msvc(msc=msc, cuda=parse_major_minor(t.version), windows=windows, msvc=msvc,
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

    return WindowsToolchain(visual_studio=vs, toolset=toolset, vcvars_ver=vcvars_ver, toolkit=toolkit,
                            check=check, nvcc_flags=extra_flags, notes=tuple(notes))


def _instance_with(snapshot: SystemSnapshot, toolset: str) -> tuple[VisualStudio, str] | None:
    """The newest instance holding the toolset ``toolset`` (``"14.39"`` or ``"14.39.33519"``)."""
    for vs in sorted(snapshot.visual_studio, key=lambda v: loose_version(v.version), reverse=True):
        for ts in vs.msvc_toolsets:
            if ts == toolset or ts.startswith(toolset + "."):
                return vs, ts
    return None


def _major_mismatch(toolkit: CudaToolkit, torch_cuda: MajorMinor | None) -> bool:
    return torch_cuda is not None and parse_major_minor(toolkit.version)[0] != torch_cuda[0]
