"""Windows parts of the build preflight: an MSVC toolset that nvcc accepts, path lengths, DISTUTILS_USE_SDK.

Kept apart from :mod:`attnforge.resolve.preflight`. The toolset/toolkit decision is
:func:`attnforge.resolve.msvc.choose_windows_toolchain` (from ``toolchain.toml`` and ``msvc.toml``): the preflight
asks it once and the answer goes into the BuildSpec, which the build executes. Sources: toolchain-facts.md §3.1
(nvcc's ``_MSC_VER`` windows), §3.2 (toolset 14.xx -> ``_MSC_VER`` 19xx), §4.3 (MAX_PATH, cl.exe is not
long-path aware); install-anchors.md KB-09, KB-14, KB-16.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PureWindowsPath

from attnforge.catalog import Catalog
from attnforge.catalog.msvc import MsvcCatalog, load_msvc
from attnforge.errors import BuildError
from attnforge.probe.snapshot import CudaToolkit, SystemSnapshot
from attnforge.resolve.checks import Check, allowed_unsupported
from attnforge.resolve.msvc import choose_windows_toolchain
from attnforge.types.versions import major_minor


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowsChecks:
    """The Windows answers of the preflight.

    Attributes:
        msvc_toolset: the ``-vcvars_ver`` toolset the build uses (``"14.39"``), None when none fits.
        toolkit: the CUDA toolkit nvcc accepts that MSVC with (may differ from the generic choice).
        nvcc_flags: ``-allow-unsupported-compiler`` (and the STL override) when the user allowed it.
    """

    checks: tuple[Check, ...]
    notes: tuple[str, ...]
    msvc_toolset: str | None
    toolkit: CudaToolkit | None = None
    nvcc_flags: tuple[str, ...] = ()


def windows_checks(snapshot: SystemSnapshot, catalog: Catalog, toolkit: CudaToolkit | None, *,
                   allow_unsupported_compiler: bool = False, msvc: MsvcCatalog | None = None) -> WindowsChecks:
    """The MSVC toolset, path-length and dev-shell checks for a Windows build.

    With ``allow_unsupported_compiler`` an MSVC that nvcc refuses passes, at the user's risk: the default
    toolset is kept and the build adds ``-allow-unsupported-compiler`` (and the STL override where MSVC's own
    STL refuses the CUDA version).
    """
    notes: list[str] = []
    msvc = msvc or load_msvc()
    msvc_toolset: str | None = None
    nvcc_flags: tuple[str, ...] = ()
    try:
        tc = choose_windows_toolchain(snapshot, windows=catalog.tools.host_compilers, msvc=msvc, toolkit=toolkit,
                                      allow_unsupported_compiler=allow_unsupported_compiler)
    except BuildError as exc:
        check = Check(name="msvc", ok=False, reason=exc.cause or exc.message, fix=exc.hint)
    else:
        msvc_toolset = tc.vcvars_ver or major_minor(tc.toolset)
        toolkit, nvcc_flags = tc.toolkit, tc.nvcc_flags
        ok = f"MSVC {tc.toolset} ({tc.visual_studio.display_name} {tc.visual_studio.version})"
        if tc.check.ok:
            lo, end = tc.check.window or (0, 0)
            check = Check(name="msvc", ok=True,
                          reason=f"{ok} (_MSC_VER {tc.check.msc_ver}) is inside what nvcc {tc.toolkit.version} "
                                 f"accepts [{lo}, {end}); selected with vcvarsall.bat x64 -vcvars_ver={msvc_toolset}")
        elif tc.check.ok is None:
            check = Check(name="msvc", ok=True, reason=f"{ok}; {tc.check.problem}, nvcc decides")
        else:
            check = allowed_unsupported(Check(name="msvc", ok=False, reason=tc.check.problem or ok))
        notes.extend(tc.notes[1:-1])  # what the choice had to do: another CUDA, an older toolset, the override
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
    return WindowsChecks(checks=(check,), notes=tuple(notes), msvc_toolset=msvc_toolset, toolkit=toolkit,
                         nvcc_flags=nvcc_flags)


def short_build_root(home: str, leaf: str, msvc: MsvcCatalog | None = None) -> tuple[str, str | None]:
    """``<home>\\b\\<leaf>``, or ``<drive>:\\<short_dir>\\<leaf>`` when that is longer than ``max_chars``
    (msvc.toml ``[build_root]``).

    Returns:
        the root, and a note when the short form was used.
    """
    rule = (msvc or load_msvc()).build_root
    root = PureWindowsPath(home) / "b" / leaf
    if len(str(root)) <= rule.max_chars:
        return str(root), None
    drive = PureWindowsPath(home).drive or "C:"
    short = PureWindowsPath(f"{drive}\\") / rule.short_dir / leaf
    return str(short), (
        f"building under {short} instead of {root} ({len(str(root))} characters): MSVC's cl.exe is "
        "not long-path aware and object paths repeat the source path (KB-14)"
    )
