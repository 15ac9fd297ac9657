"""Build preflight: everything that would make a source build fail, found before a compiler runs.

Each failed check is a reason with its fix. The order follows the questions a person would ask: is torch a
CUDA build, which archs, which nvcc (CUDA major equal to torch's, new enough for every arch), which host
compiler, ninja, memory, disk, and on Windows the MSVC toolset and path lengths (:mod:`.windows`).
Sources: install-anchors.md §12 item 5 and KB-08/09/10/11/13/21; toolchain-facts.md §1.2, §3, §5.3.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnforge.catalog import Catalog
from attnforge.catalog.recipes import Recipe
from attnforge.catalog.toolchain import MajorMinor, Target, TargetKind, format_major_minor, parse_major_minor
from attnforge.probe.snapshot import ComputeCapability, CudaToolkit, SystemSnapshot, format_cc
from attnforge.resolve.jobs import GIB
from attnforge.resolve.types import Request

TORCH_INDEX = "https://download.pytorch.org/whl"


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Preflight:
    """The answers for one build request."""

    checks: tuple[Check, ...]
    archs: tuple[ComputeCapability, ...]
    targets: tuple[Target, ...]
    toolkit: CudaToolkit | None
    msvc_toolset: str | None = None
    notes: tuple[str, ...] = ()
    nvcc_flags: tuple[str, ...] = ()  # what the build adds to NVCC_APPEND_FLAGS (-allow-unsupported-compiler)

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.ok)

    @property
    def ok(self) -> bool:
        return not self.failures


def toolkit_version(toolkit: CudaToolkit) -> MajorMinor | None:
    try:
        return parse_major_minor(toolkit.version)
    except ValueError:
        return None


def torch_cuda(snapshot: SystemSnapshot) -> MajorMinor | None:
    t = snapshot.torch
    if t is None or t.cuda_version is None:
        return None
    try:
        return parse_major_minor(t.cuda_version)
    except ValueError:
        return None


def cu_tag(version: MajorMinor) -> str:
    """``(12, 8)`` -> ``cu128`` (the PyTorch index name)."""
    return f"cu{version[0]}{version[1]}"


def run_preflight(snapshot: SystemSnapshot, catalog: Catalog, request: Request, recipe: Recipe) -> Preflight:
    """Answer every build question for ``request`` on ``snapshot``; never raises for a failed check."""
    checks: list[Check] = []
    notes: list[str] = []

    checks.extend(_torch_checks(snapshot, catalog))
    archs, targets, arch_checks = _arch_checks(snapshot, catalog, request, recipe)
    checks.extend(arch_checks)

    needed = _needed_nvcc(catalog, recipe, targets)
    want_major = torch_cuda(snapshot)
    toolkit, tk_checks = _toolkit_checks(snapshot, catalog, want_major, needed)
    checks.extend(tk_checks)
    tk_version = toolkit_version(toolkit) if toolkit else None

    if toolkit is not None and tk_version is not None:
        checks.extend(
            _nvcc_target_checks(
                catalog, recipe, targets=targets, toolkit=toolkit, version=tk_version, snapshot=snapshot
            )
        )
        if want_major is not None and tk_version[0] == want_major[0] and tk_version != want_major:
            notes.append(
                f"nvcc {toolkit.version} and torch's CUDA {format_major_minor(want_major)} differ only in "
                "the minor version: torch.utils.cpp_extension warns and builds"
            )

    msvc_toolset = None
    nvcc_flags: tuple[str, ...] = ()
    if snapshot.platform.os == "windows":
        from attnforge.resolve.windows import windows_checks

        win = windows_checks(snapshot, catalog, toolkit,
                             allow_unsupported_compiler=request.allow_unsupported_compiler)
        checks.extend(win.checks)
        notes.extend(win.notes)
        msvc_toolset, nvcc_flags = win.msvc_toolset, win.nvcc_flags
        if win.toolkit is not None and win.toolkit != toolkit:
            notes.append(f"nvcc of CUDA {toolkit.version if toolkit else '?'} refuses this MSVC: the build uses "
                         f"the installed CUDA {win.toolkit.version} at {win.toolkit.path}")
            toolkit = win.toolkit
    else:
        host, nvcc_flags = _host_compiler_check(snapshot, catalog, toolkit, tk_version,
                                                allow_unsupported=request.allow_unsupported_compiler)
        checks.append(host)
        if nvcc_flags:
            notes.append(host.reason)

    checks.append(_ninja_check(snapshot))
    checks.append(_ram_check(snapshot, recipe))
    checks.append(_disk_check(snapshot, recipe))
    return Preflight(
        checks=tuple(checks),
        archs=archs,
        targets=targets,
        toolkit=toolkit,
        msvc_toolset=msvc_toolset,
        notes=tuple(notes),
        nvcc_flags=nvcc_flags,
    )


# -- torch ---------------------------------------------------------------------------------------------------
def _torch_checks(snapshot: SystemSnapshot, catalog: Catalog) -> list[Check]:
    t = snapshot.torch
    py = snapshot.platform.python_executable
    suggestion = _torch_suggestion(snapshot, catalog)
    if t is None:
        why = snapshot.problem("torch") or "import torch failed"
        return [
            Check(
                name="torch",
                ok=False,
                reason=f"torch is not importable in {py} ({why})",
                fix=f"{py} -m pip install torch --index-url {TORCH_INDEX}/{suggestion}",
            )
        ]
    if t.hip_version is not None:
        return [
            Check(
                name="torch-cuda",
                ok=False,
                reason=f"torch {t.version} is a ROCm build (HIP {t.hip_version}); attnforge builds CUDA "
                "extensions only",
                fix="use an NVIDIA GPU with a CUDA build of torch",
            )
        ]
    if t.cuda_version is None:
        return [
            Check(
                name="torch-cuda",
                ok=False,
                reason=f"torch {t.version} is a CPU-only build (torch.version.cuda is None): a CUDA "
                f"extension cannot "
                "be compiled against it, whatever CUDA_HOME says",
                fix=f"install a CUDA build of torch: {py} -m pip install torch --index-url "
                f"{TORCH_INDEX}/{suggestion}",
            )
        ]
    return [Check(name="torch-cuda", ok=True, reason=f"torch {t.version} is a CUDA {t.cuda_version} build")]


def _torch_suggestion(snapshot: SystemSnapshot, catalog: Catalog) -> str:
    """The PyTorch index to suggest: the newest CUDA variant of this torch release that matches an installed
    nvcc's major (so the extension build works afterwards), else the release's PyPI default."""
    tools = catalog.tools
    release = None
    if snapshot.torch is not None:
        try:
            release = tools.torch_release(parse_major_minor(snapshot.torch.version))
        except ValueError:
            release = None
    majors = {v[0] for tk in snapshot.cuda_toolkits if (v := toolkit_version(tk)) is not None}
    if release is not None:
        fitting = [c for c in release.cuda if c[0] in majors]
        if fitting:
            return cu_tag(max(fitting))
        if release.pypi_default is not None:
            return cu_tag(release.pypi_default)
    versions = sorted(v for tk in snapshot.cuda_toolkits if (v := toolkit_version(tk)) is not None)
    return cu_tag(versions[-1]) if versions else "cu128"


def _torch_variant_for(snapshot: SystemSnapshot, catalog: Catalog, cuda_major: int) -> str | None:
    """The newest CUDA variant with major ``cuda_major`` of the installed torch release
    (``cu128``), if any."""
    if snapshot.torch is None:
        return None
    try:
        release = catalog.tools.torch_release(parse_major_minor(snapshot.torch.version))
    except ValueError:
        return None
    fitting = [c for c in release.cuda if c[0] == cuda_major] if release else []
    return cu_tag(max(fitting)) if fitting else None


# -- archs ---------------------------------------------------------------------------------------------------
def _arch_checks(
    snapshot: SystemSnapshot, catalog: Catalog, request: Request, recipe: Recipe
) -> tuple[tuple[ComputeCapability, ...], tuple[Target, ...], list[Check]]:
    tools = catalog.tools
    archs = tuple(request.archs) if request.archs else snapshot.compute_capabilities
    source = "--arch" if request.archs else "the detected GPUs"
    if not archs:
        return (
            (),
            (),
            [
                Check(
                    name="archs",
                    ok=False,
                    reason="no target compute capability: no GPU was detected and no --arch was given",
                    fix="pass the GPUs you build for, e.g. --arch 9.0 or --arch 9.0,12.0",
                )
            ],
        )
    checks: list[Check] = []
    targets: list[Target] = []
    backend = catalog.backends.get(request.backend)
    for cc in archs:
        if backend is not None and not backend.supports_cc(cc):
            checks.append(
                Check(
                    name="archs",
                    ok=False,
                    reason=f"{backend.display_name} supports compute capability {backend.cc_range_text()}; "
                    f"{format_cc(cc)} ({_gpu_name(snapshot, cc)}) is outside it",
                    fix="choose another backend for this GPU (attnforge doctor lists them)",
                )
            )
            continue
        target = recipe.target_for(cc, tools.runs_on)
        if target is None:
            emits = ", ".join(str(t) for t in recipe.targets)
            checks.append(
                Check(
                    name="archs",
                    ok=False,
                    reason=f"{recipe.id} cannot build code that runs on {format_cc(cc)} "
                    f"({_gpu_name(snapshot, cc)}); it emits {emits}",
                    fix="choose another backend for this GPU",
                )
            )
            continue
        if target not in targets:
            targets.append(target)
    if not checks:
        listed = ", ".join(
            f"{format_cc(cc)} -> {t}"
            for cc, t in zip(archs, (recipe.target_for(c, tools.runs_on) for c in archs), strict=True)
        )
        checks.append(Check(name="archs", ok=True, reason=f"targets from {source}: {listed}"))
    return archs, tuple(sorted(targets, key=lambda t: t.cc)), checks


def _gpu_name(snapshot: SystemSnapshot, cc: ComputeCapability) -> str:
    return next((g.name for g in snapshot.gpus if g.compute_capability == cc), "requested with --arch")


def _with_ptx(recipe: Recipe, targets: tuple[Target, ...]) -> tuple[Target, ...]:
    if recipe.adds_ptx and targets:
        return (*targets, Target(cc=targets[-1].cc, kind=TargetKind.PTX))
    return targets


def _needed_nvcc(catalog: Catalog, recipe: Recipe, targets: tuple[Target, ...]) -> MajorMinor:
    needed = recipe.min_nvcc
    for t in _with_ptx(recipe, targets):
        support = catalog.tools.target_support(t)
        needed = max(needed, recipe.min_nvcc_for(t), support.first_cuda if support else (0, 0))
    return needed


# -- nvcc ----------------------------------------------------------------------------------------------------
def choose_toolkit(
    snapshot: SystemSnapshot, want: MajorMinor | None, needed: MajorMinor
) -> CudaToolkit | None:
    """The toolkit a build should use: a real root (headers present), CUDA major equal to
    torch's, new enough for
    every target, then the one torch.utils.cpp_extension would find first (CUDA_HOME,
    CUDA_PATH, PATH), then the newest."""
    order = {"CUDA_HOME": 0, "CUDA_PATH": 1, "PATH": 2}
    real = [t for t in snapshot.cuda_toolkits if t.has_headers and toolkit_version(t) is not None]

    def rank(t: CudaToolkit) -> tuple[bool, bool, int, tuple[int, int]]:
        v = toolkit_version(t) or (0, 0)
        return (want is not None and v[0] != want[0], v < needed, order.get(t.found_via, 3), (-v[0], -v[1]))

    return min(real, key=rank, default=None)


def _toolkit_checks(
    snapshot: SystemSnapshot, catalog: Catalog, want: MajorMinor | None, needed: MajorMinor
) -> tuple[CudaToolkit | None, list[Check]]:
    toolkit = choose_toolkit(snapshot, want, needed)
    wanted = f"CUDA {want[0]}.x" if want else "a CUDA toolkit"
    if toolkit is None:
        wrappers = [t for t in snapshot.cuda_toolkits if not t.has_headers]
        if wrappers:
            w = wrappers[0]
            return None, [
                Check(
                    name="nvcc",
                    ok=False,
                    reason=f"{w.nvcc} is not inside a CUDA toolkit (no {w.path}/include/cuda_runtime.h; "
                    "a wrapper script?)",
                    fix=f"install {wanted} and set CUDA_HOME to its root",
                )
            ]
        return None, [
            Check(
                name="nvcc",
                ok=False,
                reason="no nvcc found (CUDA_HOME, CUDA_PATH, PATH, default dirs)",
                fix=f"install {wanted} (the toolkit, not only the driver) and set CUDA_HOME to its root",
            )
        ]
    version = toolkit_version(toolkit) or (0, 0)
    if want is not None and version[0] != want[0]:
        t = snapshot.torch
        torch_text = t.version if t else "torch"
        other = f"{TORCH_INDEX}/{_torch_variant_for(snapshot, catalog, version[0]) or cu_tag(version)}"
        return toolkit, [
            Check(
                name="nvcc-major",
                ok=False,
                reason=f"nvcc {toolkit.version} ({toolkit.path}) is CUDA {version[0]} but torch "
                f"{torch_text} was built "
                f"with CUDA {format_major_minor(want)}: the CUDA majors must match "
                "(torch.utils.cpp_extension: 'The detected CUDA version mismatches ...')",
                fix=f"install CUDA toolkit {want[0]}.x and point CUDA_HOME at it, or install a CUDA "
                f"{version[0]} torch "
                f"(pip install torch --index-url {other})",
            )
        ]
    return toolkit, [
        Check(
            name="nvcc",
            ok=True,
            reason=f"nvcc {toolkit.version} at {toolkit.path} (found via {toolkit.found_via})",
        )
    ]


def _nvcc_target_checks(
    catalog: Catalog,
    recipe: Recipe,
    *,
    targets: tuple[Target, ...],
    toolkit: CudaToolkit,
    version: MajorMinor,
    snapshot: SystemSnapshot,
) -> list[Check]:
    checks = []
    if version < recipe.min_nvcc:
        checks.append(
            Check(
                name="nvcc-version",
                ok=False,
                reason=f"{recipe.id} needs nvcc >= {format_major_minor(recipe.min_nvcc)}, "
                f"found {toolkit.version}",
                fix=f"install CUDA >= {format_major_minor(recipe.min_nvcc)} and set CUDA_HOME",
            )
        )
    failed: set[ComputeCapability] = set()
    for t in _with_ptx(recipe, targets):
        if t.kind is TargetKind.PTX and t.cc in failed:
            continue  # the PTX of an arch whose cubin already failed adds nothing new
        problem = catalog.tools.nvcc_can_emit(version, t)
        floor = recipe.min_nvcc_for(t)
        who = f"{_gpu_name(snapshot, t.cc)}, compute capability {format_cc(t.cc)}"
        if problem is None and version < floor:
            problem = f"{recipe.id}'s setup.py needs nvcc >= {format_major_minor(floor)} for {t}"
        if problem is not None:
            support = catalog.tools.target_support(t)
            first = max(floor, support.first_cuda if support else floor)
            fix = (
                f"install CUDA >= {format_major_minor(first)} (same major as torch) and set CUDA_HOME to it, "
                "or leave this arch out with --arch"
            )
            if support is not None and support.last_cuda is not None and version > support.last_cuda:
                fix = f"build with CUDA {format_major_minor(support.last_cuda)} or older for this arch"
            failed.add(t.cc)
            checks.append(
                Check(
                    name="nvcc-arch",
                    ok=False,
                    reason=f"nvcc {toolkit.version} cannot build {t} ({who}): {problem}",
                    fix=fix,
                )
            )
    if not checks:
        names = ", ".join(str(t) for t in _with_ptx(recipe, targets))
        checks.append(Check(name="nvcc-arch", ok=True, reason=f"nvcc {toolkit.version} can emit {names}"))
    return checks


# -- host compiler, ninja, memory, disk ----------------------------------------------------------------------
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


def _host_compiler_check(
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


def _ninja_check(snapshot: SystemSnapshot) -> Check:
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


def _ram_check(snapshot: SystemSnapshot, recipe: Recipe) -> Check:
    avail = snapshot.platform.ram_available_bytes
    need = recipe.gb_per_nvcc_thread * GIB
    if avail < need:
        return Check(
            name="ram",
            ok=False,
            reason=f"{avail / GIB:.1f} GiB RAM available; one nvcc thread of {recipe.id} needs about "
            f"{recipe.gb_per_nvcc_thread} GiB",
            fix="close memory-hungry programs or add swap (a build killed by the OOM killer just says "
            "'Killed')",
        )
    return Check(name="ram", ok=True, reason=f"{avail / GIB:.0f} GiB RAM available")


def _disk_check(snapshot: SystemSnapshot, recipe: Recipe) -> Check:
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
