"""The preflight's answer type and the checks that do not depend on torch or nvcc: host compiler, ninja, memory,
disk. Sources: install-anchors.md §12 item 5 and KB-08/09/10/11/13/21; toolchain-facts.md §3, §5.3.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnforge.catalog import Catalog
from attnforge.catalog.recipes import Recipe
from attnforge.catalog.toolchain import MajorMinor
from attnforge.probe.snapshot import CudaToolkit, SystemSnapshot
from attnforge.resolve.jobs import GIB


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    """One preflight question and its answer.

    Attributes:
        name: short id (``torch-cuda``, ``nvcc-major``, ``nvcc-arch``, ``host-compiler``, ``msvc``...).
        ok: whether the build can go ahead on this point.
        reason: what was found, in words ("built for X, you have Y").
        fix: the next step when not ok.
    """

    name: str
    ok: bool
    reason: str
    fix: str | None = None

    def text(self) -> str:
        return self.reason if self.ok or not self.fix else f"{self.reason}; fix: {self.fix}"


# -- host compiler, ninja, memory, disk -----------------------------------------------------------------------
#: nvcc's switch to skip its host-compiler version check (toolchain-facts.md §3.3); the build may then fail
#: later or, in nvcc's words, "cause compilation failure or incorrect run time execution".
ALLOW_UNSUPPORTED_FLAG = "-allow-unsupported-compiler"
UNSUPPORTED_RISK = ("at your own risk: nvcc warns that an unsupported host compiler 'may cause compilation "
                    "failure or incorrect run time execution'")


def allowed_unsupported(check: Check) -> Check:
    """A failed host-compiler check the user overrode with ``--allow-unsupported-compiler``."""
    return Check(name=check.name, ok=True,
                 reason=f"{check.reason}; --allow-unsupported-compiler: building with "
                        f"{ALLOW_UNSUPPORTED_FLAG} {UNSUPPORTED_RISK}")


def host_compiler_check(
    snapshot: SystemSnapshot, catalog: Catalog, toolkit: CudaToolkit | None, version: MajorMinor | None,
    *, allow_unsupported: bool = False,
) -> tuple[Check, tuple[str, ...]]:
    """The host compiler against nvcc's range, and the nvcc flags the build then needs (only
    ``-allow-unsupported-compiler``, only for a compiler outside the range and only when allowed)."""
    cxx = snapshot.compiler("g++") or snapshot.compiler("gcc") or snapshot.compiler("clang")
    if cxx is None:
        return Check(
            name="host-compiler",
            ok=False,
            reason="no host C++ compiler (g++) found",
            fix="install g++ (e.g. apt-get install g++)",
        ), ()
    if toolkit is None or version is None:
        return Check(
            name="host-compiler", ok=True, reason=f"{cxx.kind} {cxx.version} (no nvcc to check it against)"
        ), ()
    window = catalog.tools.host_range(version)
    if window is None:
        return Check(
            name="host-compiler",
            ok=True,
            reason=f"{cxx.kind} {cxx.version}; the catalog has no host-compiler table for CUDA "
            f"{toolkit.version}, nvcc's host_config.h will decide",
        ), ()
    try:
        major = int(cxx.version.split(".", 1)[0])
    except ValueError:
        return Check(
            name="host-compiler", ok=True, reason=f"{cxx.kind} version {cxx.version!r} not understood"
        ), ()
    if cxx.kind == "clang":
        ok = major <= window.clang_max
        limit = f"clang <= {window.clang_max}"
    else:
        ok = window.gcc_min <= major <= window.gcc_max
        limit = f"gcc {window.gcc_min}-{window.gcc_max}"
    if ok:
        return Check(
            name="host-compiler",
            ok=True,
            reason=f"{cxx.kind} {cxx.version} is inside what nvcc {toolkit.version} accepts ({limit})",
        ), ()
    n = window.gcc_max
    refused = Check(
        name="host-compiler",
        ok=False,
        reason=f"{cxx.kind} {cxx.version} is outside what nvcc {toolkit.version} accepts ({limit}); "
        f"host_config.h "
        "stops with 'unsupported GNU version'",
        fix=f"install gcc-{n} and g++-{n} and build with CC=gcc-{n} CXX=g++-{n} (cpp_extension passes "
        f"-ccbin $CC), "
        "or use a newer CUDA, or (at your own risk) build with --allow-unsupported-compiler",
    )
    if allow_unsupported:
        return allowed_unsupported(refused), (ALLOW_UNSUPPORTED_FLAG,)
    return refused, ()


def ninja_check(snapshot: SystemSnapshot) -> Check:
    py = snapshot.platform.python_executable
    if snapshot.ninja is None:
        return Check(
            name="ninja",
            ok=False,
            reason="ninja is not found: torch would fall back to the slow distutils backend (hours)",
            fix=f"{py} -m pip install ninja",
        )
    where = "in this interpreter" if snapshot.ninja.in_interpreter else "on PATH"
    return Check(name="ninja", ok=True, reason=f"ninja {snapshot.ninja.version or '?'} {where}")


def ram_check(snapshot: SystemSnapshot, recipe: Recipe) -> Check:
    avail = snapshot.platform.ram_available_bytes
    need = recipe.gb_per_nvcc_thread * GIB
    if avail < need:
        job = "nvcc thread" if recipe.targets else "compile job"  # the C++-only recipe has no nvcc targets
        return Check(
            name="ram",
            ok=False,
            reason=f"{avail / GIB:.1f} GiB RAM available; one {job} of {recipe.id} needs about "
            f"{recipe.gb_per_nvcc_thread} GiB",
            fix="close memory-hungry programs or add swap (a build killed by the OOM killer just says "
            "'Killed')",
        )
    return Check(name="ram", ok=True, reason=f"{avail / GIB:.0f} GiB RAM available")


def disk_check(snapshot: SystemSnapshot, recipe: Recipe) -> Check:
    free = snapshot.platform.disk_free_bytes
    where = snapshot.platform.disk_path
    if free is None:
        return Check(name="disk", ok=True, reason=f"free disk at {where} unknown")
    if free < recipe.min_free_disk_gb * GIB:
        return Check(
            name="disk",
            ok=False,
            reason=f"{free / GIB:.1f} GiB free at {where}; a {recipe.id} build needs about "
            f"{recipe.min_free_disk_gb} GiB",
            fix="free disk space or set ATTNFORGE_HOME to a larger disk",
        )
    return Check(name="disk", ok=True, reason=f"{free / GIB:.0f} GiB free at {where}")
