"""Build preflight: everything that would make a source build fail, found before a compiler runs.

Each failed check is a reason with its fix. The order follows the questions a person would ask: is torch a
CUDA build, which archs, which nvcc (CUDA major equal to torch's, new enough for every arch), which host
compiler, ninja, memory, disk, and on Windows the MSVC toolset and path lengths (:mod:`.windows`).
Sources: install-anchors.md §12 item 5 and KB-08/09/10/11/13/21; toolchain-facts.md §1.2, §3, §5.3.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnforge.catalog import Catalog
from attnforge.catalog.recipes import CPP_RECIPE, GENERIC_RECIPE, Recipe, SourceEdit
from attnforge.catalog.toolchain import MajorMinor, Target, TargetKind, format_major_minor
from attnforge.catalog.torch import cu_tag
from attnforge.probe.snapshot import CudaToolkit, SystemSnapshot
from attnforge.resolve.checks import Check, allowed_unsupported, disk_check, host_compiler_check, ninja_check, ram_check
from attnforge.resolve.torch_checks import toolkit_version, torch_checks, torch_cuda, torch_variant_for
from attnforge.resolve.types import Request
from attnforge.types.binary import AbiKind
from attnforge.types.cc import ComputeCapability, format_cc


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
    cpu_only: bool = False  # a C++-only extension (resolve/cpu_only.py): no CUDA checks, no toolkit

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.ok)

    @property
    def ok(self) -> bool:
        return not self.failures


def run_preflight(snapshot: SystemSnapshot, catalog: Catalog, request: Request, recipe: Recipe, *,
                  cpu_only: str | None) -> Preflight:
    """Answer every build question for ``request`` on ``snapshot``; never raises for a failed check. ``cpu_only``:
    what :func:`~attnforge.resolve.cpu_only.cpu_only_source` says of the request's source on ``snapshot`` (not None:
    a C++-only extension, asked the host compiler's questions only)."""
    checks: list[Check] = []
    notes: list[str] = []

    if cpu_only is not None:  # host compiler, ninja, memory, disk: the questions a CppExtension asks
        torch_check = next((c for c in torch_checks(snapshot, catalog) if c.name == "torch"), None) or Check(
            name="torch", ok=True, reason=f"torch {snapshot.torch.version if snapshot.torch else ''} (any build)")
        host, _ = host_compiler_check(snapshot, catalog, None, None)
        return Preflight(
            checks=(torch_check, host, ninja_check(snapshot), ram_check(snapshot, recipe),
                    disk_check(snapshot, recipe)),
            archs=(), targets=(), toolkit=None, notes=(cpu_only,), cpu_only=True,
        )
    checks.extend(torch_checks(snapshot, catalog))
    abi = abi_check(snapshot, recipe, request)
    if abi is not None:
        checks.append(abi)
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
        host, nvcc_flags = host_compiler_check(snapshot, catalog, toolkit, tk_version,
                                                allow_unsupported=request.allow_unsupported_compiler)
        checks.append(host)
        if nvcc_flags:
            notes.append(host.reason)

    checks.append(ninja_check(snapshot))
    checks.append(ram_check(snapshot, recipe))
    checks.append(disk_check(snapshot, recipe))
    return Preflight(
        checks=tuple(checks),
        archs=archs,
        targets=targets,
        toolkit=toolkit,
        msvc_toolset=msvc_toolset,
        notes=tuple(notes),
        nvcc_flags=nvcc_flags,
    )


# -- ABI -----------------------------------------------------------------------------------------------------
def builds_stable(snapshot: SystemSnapshot, recipe: Recipe) -> bool | None:
    """Whether a build of ``recipe`` with the snapshot's torch uses the libtorch stable ABI by itself
    (:meth:`Recipe.builds_stable_with`; None: torch is missing or its version unreadable)."""
    if recipe.stable_abi_from is None:
        return False
    return None if snapshot.torch is None else recipe.builds_stable_with(snapshot.torch.version)


def abi_check(snapshot: SystemSnapshot, recipe: Recipe, request: Request) -> Check | None:
    """Whether the build can bind to torch as ``--abi`` asks (None: no ``--abi``). ``torch`` on a recipe that builds
    the stable ABI by itself needs its :attr:`~attnforge.catalog.recipes.Recipe.per_torch` edit; ``torch-stable``
    needs a recipe with ``stable_abi_from`` and a torch at least that."""
    if request.abi is None:
        return None
    if recipe.id in (GENERIC_RECIPE, CPP_RECIPE):  # a project the catalog does not know: its binary will tell
        return Check(name="abi", ok=True, reason=f"--abi {request.abi.value}: read from the built binary (a build "
                                                 "of the other ABI is refused, not cached)")
    stable = builds_stable(snapshot, recipe)
    floor = format_major_minor(recipe.stable_abi_from) if recipe.stable_abi_from else None
    torch = f"torch {snapshot.torch.version}" if snapshot.torch is not None else "no torch"
    if request.abi is AbiKind.TORCH:
        if stable and recipe.per_torch is None:
            return Check(name="abi", ok=False,
                         reason=f"{recipe.id} builds for the libtorch stable ABI with torch >= {floor} and attnforge "
                                "knows no switch that binds it to one torch",
                         fix="drop --abi torch (the stable-ABI build serves every torch >= its minimum)")
        how = (f"{recipe.per_torch.file} edited in the build tree to take its per-torch branch" if stable
               and recipe.per_torch is not None else "as the project builds it")
        return Check(name="abi", ok=True, reason=f"--abi torch: bound to {torch} ({how})")
    if floor is None:
        return Check(name="abi", ok=False, reason=f"{recipe.id} has no libtorch stable-ABI build",
                     fix="drop --abi torch-stable (the build is bound to the torch it is built with)")
    if not stable:
        return Check(name="abi", ok=False,
                     reason=f"{recipe.id} builds for the libtorch stable ABI only with torch >= {floor}; this is "
                            f"{torch}",
                     fix=f"install torch >= {floor} first, or drop --abi torch-stable")
    return Check(name="abi", ok=True, reason=f"--abi torch-stable: one binary for every torch >= {floor}")


def abi_edits(snapshot: SystemSnapshot, recipe: Recipe, request: Request) -> tuple[SourceEdit, ...]:
    """The edits a build of ``request`` makes in its tree: the recipe's per-torch edits
    (:meth:`~attnforge.catalog.recipes.Recipe.per_torch_edits`) where ``--abi torch`` asks a recipe that builds the
    stable ABI by itself to bind to the building torch; none otherwise."""
    if request.abi is AbiKind.TORCH and recipe.per_torch is not None and builds_stable(snapshot, recipe):
        return recipe.per_torch_edits()
    return ()


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
        if backend is not None and not backend.support.supports_cc(cc):
            checks.append(
                Check(
                    name="archs",
                    ok=False,
                    reason=f"{backend.display_name} supports compute capability {backend.support.cc_range_text()}; "
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
        other = catalog.tools.torch_index_url(torch_variant_for(snapshot, catalog, version[0]) or version)
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


# Check, allowed_unsupported, toolkit_version, torch_cuda and cu_tag live in checks.py, torch_checks.py and
# catalog/torch.py; re-exported here for modules written against the single preflight module.
__all__ = ["Check", "Preflight", "allowed_unsupported", "choose_toolkit", "cu_tag", "run_preflight",
           "toolkit_version", "torch_cuda"]
