"""The doctor report: where every attention backend stands on one machine, and the next step for each.

Pure: ``doctor_report(snapshot, catalog, ...) -> DoctorReport``. The CLI gathers the impure inputs (the
snapshot, verify/bench records, build preflight reasons) and renders the result.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from attnforge._compat import StrEnum
from attnforge.catalog import Backend, Catalog, load_catalog
from attnforge.probe.snapshot import InstalledBackend, SystemSnapshot, TorchInfo
from attnforge.ranking import PLAIN_SDPA, overhead_tier, wins_per_backend
from attnforge.records import BenchRecord, VerifyRecord
from attnforge.resolve.torch_checks import torch_cuda
from attnforge.types.cc import ComputeCapability, format_cc
from attnforge.types.local_label import stable_abi_of_version


def torch_cuda_hint() -> str:
    """Where people get a CUDA build of torch: the catalog's default variant (toolchain.toml ``[[torch]]``)."""
    tools = load_catalog().tools
    return f"pip install torch --index-url {tools.torch_index_url(tools.default_torch_cuda())}"


#: The next step of rows held up by the machine-wide blocker, which the report states once.
SEE_BLOCKER = "see 'blocked' above"


class Status(StrEnum):
    """Where one backend stands."""

    READY = "ready"  # imports, native modules load, supports this GPU
    BROKEN = "broken"  # installed but does not load
    MISSING = "missing"  # not installed; can be installed here
    UNSUPPORTED = "unsupported"  # this GPU (or this machine) cannot run it


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendRow:
    """One line of the doctor table.

    Attributes:
        backend: catalog id.
        name: display name.
        version: installed version (torch's for built-ins), None when missing.
        imports: the package imports (None: not installed / not tried).
        native_ok: every native module loads (None: none to load or not installed).
        gpu_support: "yes", or why not ("needs compute capability 8.0-12.1, this GPU is 7.5").
        verified: the newest ``attnforge verify`` outcome on this device (None: never verified).
        status: see :class:`Status`.
        problem: what is wrong, in one line (None when ready).
        next_step: the one thing to do now.
    """

    backend: str
    name: str
    version: str | None
    imports: bool | None
    native_ok: bool | None
    gpu_support: str
    verified: bool | None
    status: Status
    problem: str | None
    next_step: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """The short answer: the fastest thing that runs now, and how to get something faster."""

    fastest_now: str
    evidence: str
    to_go_faster: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DoctorReport:
    """The whole doctor answer; renders as a table or as JSON (``attnforge doctor --json``)."""

    system: list[str]
    blocker: str | None
    rows: tuple[BackendRow, ...]
    verdict: Verdict
    problems: tuple[str, ...] = field(default_factory=tuple)


def doctor_report(
    snapshot: SystemSnapshot,
    catalog: Catalog,
    *,
    verified: Mapping[str, VerifyRecord] | None = None,
    bench: Sequence[BenchRecord] = (),
    build_blockers: Mapping[str, Sequence[str]] | None = None,
) -> DoctorReport:
    """Assess every backend of ``catalog`` on ``snapshot``.

    Args:
        snapshot: the machine.
        catalog: the backends to report on.
        verified: newest verify record per backend id for this device.
        bench: bench records for this device (the verdict quotes them).
        build_blockers: per backend id that needs a build, why it cannot be built here (from the resolver's
            preflight); empty or absent when it can be.
    """
    verified = verified or {}
    build_blockers = build_blockers or {}
    machine = _machine_blocker(snapshot)
    rows = tuple(_row(snapshot, b, machine, verified.get(b.id), build_blockers.get(b.id, ()))
                 for b in sorted(catalog.backends.values(), key=_row_order))
    return DoctorReport(
        system=system_summary(snapshot),
        blocker=f"{machine[0]}: {machine[1]}" if machine else None,
        rows=rows,
        verdict=_verdict(snapshot, catalog, rows, bench),
        problems=tuple(f"{p.section}: {p.reason}" for p in snapshot.problems),
    )


_FAMILY_ORDER = {"sdpa": 0, "flex": 1, "flash-attn": 2, "sageattention": 3, "xformers": 4}


def _row_order(b: Backend) -> tuple[int, int, str]:
    return (_FAMILY_ORDER.get(b.family, 9), b.priority, b.id)


def system_summary(s: SystemSnapshot) -> list[str]:
    """A few lines: OS/Python, GPU, torch, CUDA toolkits and compilers."""
    p = s.platform
    lines = [f"{p.os} {p.cpu_arch}, Python {p.python_version} ({p.wheel_tag}), {p.cores} cores, "
             f"{p.ram_total_bytes / 2**30:.0f} GiB RAM" + (f", glibc {p.glibc}" if p.glibc else "")]
    if s.gpus:
        for g in s.gpus:
            mem = f", {g.memory_bytes / 2**30:.0f} GiB" if g.memory_bytes else ""
            drv = f", driver {g.driver_version}" if g.driver_version else ""
            cuda = f" (supports CUDA <= {g.cuda_driver_version})" if g.cuda_driver_version else ""
            lines.append(f"GPU {g.index}: {g.name}, compute capability {format_cc(g.compute_capability)}"
                         f"{mem}{drv}{cuda} [{g.source}]")
    else:
        lines.append(f"GPU: none found ({s.problem('gpus') or 'no NVIDIA GPU'})")
    t = s.torch
    if t is None:
        lines.append(f"torch: not usable ({s.problem('torch') or 'not installed'})")
    else:
        kind = f"CUDA {t.cuda_version} build" if t.cuda_version else (
            f"ROCm {t.hip_version} build" if t.hip_version else "CPU build")
        extra = []
        if t.cudnn_version:
            extra.append(f"cuDNN {t.cudnn_version}")
        if t.triton_version:
            extra.append(f"triton {t.triton_version}")
        if t.cxx11_abi is not None:
            extra.append(f"C++11 ABI {'on' if t.cxx11_abi else 'off'}")
        lines.append(f"torch {t.version} ({kind})" + (", " + ", ".join(extra) if extra else ""))
    if s.cuda_toolkits:
        tk = s.primary_toolkit
        others = len(s.cuda_toolkits) - 1
        lines.append(f"nvcc {tk.version} at {tk.nvcc}" if tk else "nvcc: none")
        if others:
            lines[-1] += f" (+{others} more)"
    else:
        lines.append(f"nvcc: none found ({s.problem('cuda_toolkits') or ''})".rstrip(" ()"))
    comps = [f"{c.kind} {c.version}" for c in s.compilers]
    for vs in s.visual_studio:
        comps.append(f"{vs.display_name} {vs.version}")
    lines.append("host compilers: " + (", ".join(comps) if comps else "none found"))
    tools = []
    if s.ninja:
        tools.append(f"ninja {s.ninja.version}")
    if s.sccache:
        tools.append(f"sccache {s.sccache.version}")
    if tools:
        lines.append("build tools: " + ", ".join(tools))
    return lines


def _machine_blocker(s: SystemSnapshot) -> tuple[str, str] | None:
    """(problem, next step) that stops every GPU backend on this machine, or None."""
    t = s.torch
    if t is None:
        return ("torch is not installed or does not import",
                f"install a CUDA build of torch first ({torch_cuda_hint()})")
    if t.hip_version:
        return (f"torch {t.version} is a ROCm build; attnforge targets NVIDIA GPUs",
                "use a CUDA build of torch on an NVIDIA machine")
    if not t.is_cuda_build:
        return (f"torch {t.version} is a CPU build",
                f"install a CUDA build of torch first ({torch_cuda_hint()})")
    if not s.gpus:
        return ("no NVIDIA GPU found", "run on a machine with an NVIDIA GPU (and a working driver)")
    return None


def _gpu_support(s: SystemSnapshot, b: Backend) -> tuple[bool | None, str]:
    ccs: tuple[ComputeCapability, ...] = s.compute_capabilities
    if b.family == "sdpa" and b.id == "sdpa-math":
        return True, "any (CPU too)"
    if not ccs:
        return None, "no GPU"
    bad = [cc for cc in ccs if not b.support.supports_cc(cc)]
    if bad:
        return False, (f"needs compute capability {b.support.cc_range_text()}, this GPU is "
                       f"{', '.join(format_cc(c) for c in bad)}")
    return True, "yes"


def _row(s: SystemSnapshot, b: Backend, machine: tuple[str, str] | None, ver: VerifyRecord | None,
         blockers: Sequence[str]) -> BackendRow:
    supported, support_text = _gpu_support(s, b)
    verified = None if ver is None else ver.ok
    if b.builtin:
        t = s.torch
        builtin = partial(BackendRow, backend=b.id, name=b.display_name, gpu_support=support_text,
                          verified=verified, version=t.version if t else None, imports=t is not None,
                          native_ok=None)
        return _builtin_row(s, b, machine, supported, builtin)
    inst = s.backend(b.id) or InstalledBackend(backend=b.id, distribution=None, version=None, imports=None)
    row = partial(BackendRow, backend=b.id, name=b.display_name, gpu_support=support_text, verified=verified,
                  version=inst.version, imports=inst.imports, native_ok=inst.native_ok)
    if inst.installed and (inst.imports is False or inst.native_ok is False):
        problem = _load_problem(s, inst)
        return row(status=Status.BROKEN, problem=problem,
                          next_step=_broken_next_step(s, b, inst, machine))
    if machine is not None and not inst.installed:
        if b.needs_build and blockers:
            return row(status=Status.UNSUPPORTED, problem="cannot be built here: " + "; ".join(blockers),
                       next_step=SEE_BLOCKER)
        return row(status=Status.UNSUPPORTED, problem=machine[0], next_step=SEE_BLOCKER)
    if supported is False:
        return row(status=Status.UNSUPPORTED, problem=support_text,
                          next_step="use another backend (see the verdict)")
    if inst.installed:
        if ver is not None and not ver.ok:
            step = (f"attnforge install {b.id} --from-source" if b.needs_build else
                    "attnforge.attention() will not use it; `attnforge verify --json` has every failing case")
            return row(status=Status.BROKEN, problem=f"verify failed: {ver.summary}", next_step=step)
        step = "ready" if ver is not None else f"attnforge verify {b.id}"
        return row(status=Status.READY, problem=None, next_step=step)
    if b.needs_build and blockers:
        return row(status=Status.UNSUPPORTED,
                          problem="cannot be built here: " + "; ".join(blockers),
                          next_step="fix the first build blocker, then: " + install_step(s, b))
    return row(status=Status.MISSING, problem="not installed", next_step=install_step(s, b))


def _builtin_row(s: SystemSnapshot, b: Backend, machine: tuple[str, str] | None, supported: bool | None,
                 row: Callable[..., BackendRow]) -> BackendRow:
    t = s.torch
    if b.id == "sdpa-math" and t is not None:
        return row(status=Status.READY, problem=None, next_step="ready (the fallback)")
    if t is None or machine is not None:
        problem = machine[0] if machine else "torch is not installed"
        return row(status=Status.UNSUPPORTED, problem=problem, next_step=SEE_BLOCKER)
    if supported is False:
        return row(status=Status.UNSUPPORTED, problem=_gpu_support(s, b)[1],
                          next_step="use another backend (see the verdict)")
    missing = _builtin_missing(t, b)
    if missing:
        return row(status=Status.UNSUPPORTED, problem=missing[0], next_step=missing[1])
    return row(status=Status.READY, problem=None, next_step="ready")


def _builtin_missing(t: TorchInfo, b: Backend) -> tuple[str, str] | None:
    if b.id == "sdpa-flash" and t.sdpa_flash_available is False:
        return ("this torch build has no SDPA flash kernel (typical of Windows wheels before 2.5)",
                "use SDPA cuDNN / memory-efficient, or attnforge install flash-attn")
    if b.id == "sdpa-cudnn" and not t.cudnn_version:
        return ("this torch build has no cuDNN", "install a torch wheel that ships cuDNN")
    if b.id == "flex" and not t.triton_version:
        return ("FlexAttention needs triton, which is not installed",
                "pip install triton (triton-windows on Windows)")
    return None


_XF_BUILT_FOR = re.compile(r"PyTorch (\S+) with CUDA (\d+) \(you have (\S+)\)")
_XF_PYTHON = re.compile(r"Python\s+(\d+\.\d+)\S*\s+\(you have (\d+\.\d+)\S*\)")


def torch_index_url(s: SystemSnapshot) -> str:
    """The PyTorch wheel index matching this torch's CUDA (``.../whl/cu130``), where CUDA-specific builds of
    xFormers live (install-anchors.md §7.1); the CPU index for a CPU torch."""
    return load_catalog().tools.torch_index_url(torch_cuda(s))


def install_step(s: SystemSnapshot, b: Backend) -> str:
    """The catalog's install command for ``b`` with ``{torch_index}`` filled in for this machine."""
    return b.install.replace("{torch_index}", torch_index_url(s))


def _load_problem(s: SystemSnapshot, inst: InstalledBackend) -> str:
    details = " ".join(inst.details)
    m = _XF_BUILT_FOR.search(details)
    torch_cuda = s.torch.cuda_version if s.torch else None
    if m and torch_cuda and int(m.group(2)) // 100 != int(torch_cuda.split(".")[0]):
        # Seen on the H200: xFormers >= 0.0.34 use torch's stable ABI, so the torch/Python versions it names are
        # not the cause; its _C.so links the CUDA runtime of its own major (libcudart.so.12), which a cu13 torch
        # does not ship.
        code = int(m.group(2))  # xFormers writes CUDA 12.8 as 1208
        return (f"xFormers {inst.version} is a CUDA {code // 100}.{code % 100} build (its _C needs libcudart.so."
                f"{code // 100}) but torch is a CUDA {torch_cuda} build: its CUDA kernels are not loaded")
    if m:
        py = _XF_PYTHON.search(details)
        built_py = f" / Python {py.group(1)}" if py else ""
        have_py = f" / {py.group(2)}" if py else ""
        return (f"xFormers {inst.version} was built for PyTorch {m.group(1)}{built_py}, "
                f"you have {m.group(3)}{have_py}: its CUDA kernels are not loaded")
    failed = [f"{n.name}: {n.error}" for n in inst.native if not n.ok]
    if inst.imports is False:
        return f"import fails: {inst.import_error}"
    return "native module does not load: " + "; ".join(failed)


def _broken_next_step(s: SystemSnapshot, b: Backend, inst: InstalledBackend,
                      machine: tuple[str, str] | None) -> str:
    if machine is not None:
        return machine[1]
    if b.needs_build:
        return f"attnforge install {b.id} --from-source (rebuilds against this torch)"
    return (f"pip uninstall {inst.distribution}, then {install_step(s, b)} (a build that matches this torch), "
            f"or `attnforge diagnose` the error")


def _verdict(s: SystemSnapshot, catalog: Catalog, rows: Sequence[BackendRow], bench: Sequence[BenchRecord]) -> Verdict:
    ready = [r for r in rows if r.status is Status.READY]
    by_id = {r.backend: r for r in rows}
    fastest, evidence = _fastest_measured(ready, bench)
    if fastest is None:
        best = min(ready, key=lambda r: catalog.backends[r.backend].priority, default=None)
        fastest = best.name if best else "nothing"
        evidence = ("not measured yet, the catalog's guess: on a GPU attention() measures the verified backends on"
                    " the first call of each shape class and keeps plain SDPA unless one is faster beyond the noise"
                    " (`attnforge bench` measures ahead of time, as a deploy step)")
    machine = _machine_blocker(s)
    if machine is not None:
        return Verdict(fastest_now=fastest, evidence=evidence,
                       to_go_faster=f"{machine[0]}, so only the CPU fallback runs here; {machine[1]}")
    ready_prio = min((catalog.backends[r.backend].priority for r in ready), default=10**6)
    better = sorted(
        (r for r in rows if r.status in (Status.MISSING, Status.BROKEN)
         and catalog.backends[r.backend].priority < ready_prio and not catalog.backends[r.backend].quantized),
        key=lambda r: catalog.backends[r.backend].priority,
    )
    if better:
        step = better[0]
        return Verdict(fastest_now=fastest, evidence=evidence,
                       to_go_faster=f"{step.name} may be faster here: {step.next_step}, then "
                                    f"`attnforge bench` to measure it against {fastest}")
    unverified = [r.backend for r in ready
                  if r.verified is None and by_id[r.backend].version and not catalog.backends[r.backend].builtin]
    if unverified:
        return Verdict(fastest_now=fastest, evidence=evidence,
                       to_go_faster=f"verify what is installed: attnforge verify {' '.join(unverified)}")
    boxed = [(r, recipe.per_torch) for r in ready if stable_abi_of_version(r.version)
             and (recipe := catalog.recipe(r.backend)) is not None and recipe.per_torch is not None]
    if boxed:
        row, edit = boxed[0]
        return Verdict(fastest_now=fastest, evidence=evidence,
                       to_go_faster=f"{row.name} is a libtorch stable-ABI build (every call boxed): attnforge "
                                    f"install {row.backend} --abi torch (with the --source and slim options it "
                                    f"was built with) binds it to this torch: "
                                    f"{edit.gain} (docs/slim-builds.md)")
    return Verdict(fastest_now=fastest, evidence=evidence,
                   to_go_faster="nothing faster is known for this GPU; `attnforge bench` shows the measured ranking")


def _fastest_measured(ready: Sequence[BackendRow], bench: Sequence[BenchRecord]) -> tuple[str | None, str]:
    """The backend that wins most measured forward shape classes by the one rule (:mod:`attnforge.ranking`),
    among ready backends that verify passed (and plain SDPA, which needs no verify): never an unverified one."""
    names = {r.backend: r.name for r in ready if r.verified}
    names.setdefault(PLAIN_SDPA, "PyTorch SDPA (default)")
    wins = wins_per_backend(bench, among=names)
    if not wins:
        return None, ""
    winner = max(wins, key=lambda n: (len(wins[n]), -overhead_tier(n), n))
    total = sum(len(v) for v in wins.values())
    top = max(wins[winner], key=lambda r: r.measurements[winner].tflops)
    return names[winner], (f"measured by `attnforge bench`: fastest verified backend in {len(wins[winner])} of "
                           f"{total} forward shape classes, up to {top.measurements[winner].tflops:.0f} TFLOP/s")
