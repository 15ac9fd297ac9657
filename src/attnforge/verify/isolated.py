"""``attnforge verify`` with each backend in a child process (:mod:`attnforge._system.isolate`).

A kernel that kills its process (SIGSEGV in a bf16-only build asked for float16), aborts, poisons the CUDA
context or hangs becomes a failed verdict that names the signal and the case; the parent records it and goes
on. Cases outside the capabilities recorded with the installed build are skipped, not run.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnforge._system.isolate import DEFAULT_TIMEOUT_S, portable, run_in_child
from attnforge._system.runner import Runner
from attnforge.catalog.slim import Capabilities
from attnforge.catalog.tolerances import PrecisionKind, Tolerances
from attnforge.probe.snapshot import InstalledBackend
from attnforge.verify.cases import VerifyCase
from attnforge.verify.causes import output_headline
from attnforge.verify.check import (
    BackendVerification,
    CaseResult,
    CaseStatus,
    all_ok,
    native_problem,
    summarize,
    verify_backend,
)
from attnforge.verify.device import DeviceInfo
from attnforge.verify.repair import CompileCaches

#: Where the child gets its adapters: a ``module:function`` returning ``{name: adapter}``.
DEFAULT_ADAPTERS = "attnforge.backends.registry:adapters"
_NOT_RUN = "not run: an earlier case took the process down or poisoned the CUDA context"
#: A case error that leaves the CUDA context unusable: the child stops, the rest would fail for no reason.
_POISONED = re.compile(r"illegal memory access|device-side assert|unspecified launch failure|"
                       r"CUDA error: (an illegal|misaligned|unspecified)", re.IGNORECASE)


@dataclass(frozen=True, slots=True, kw_only=True)
class Isolation:
    """How verify and bench isolate backends: the child's timeout, adapter factory and interpreter."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    adapters_ref: str = field(default_factory=lambda: DEFAULT_ADAPTERS)
    python: str = sys.executable


@dataclass(frozen=True, slots=True, kw_only=True)
class _Job:
    adapters_ref: str
    name: str
    adapter: bytes | None  # the parent's adapter, pickled; None: the child takes it from adapters_ref
    device: DeviceInfo
    cases: tuple[VerifyCase, ...]
    tolerances: Tolerances
    kind: PrecisionKind
    compile_caches: tuple[Path, ...] | CompileCaches = ()


def crash_text(failure: str, dtype: str, head_dim: int, caps: Capabilities | None) -> str:
    """``"SIGSEGV on float16 D=128: this build has no float16 kernels (it has bfloat16)"``."""
    why = caps.outside(dtype=dtype, head_dim=head_dim) if caps is not None else None
    return f"{failure} on {dtype} D={head_dim}: {why or 'the kernel took its process down'}"


def verify_in_child(
    name: str, *, adapter: object, device: DeviceInfo, cases: tuple[VerifyCase, ...], tolerances: Tolerances,
    kind: PrecisionKind, native: InstalledBackend | None, isolation: Isolation, runner: Runner,
    environ: Mapping[str, str], caps: Capabilities | None, compile_caches: tuple[Path, ...] | CompileCaches = (),
) -> BackendVerification:
    """Verify one backend in a child process; the verdict is the same shape as :func:`verify_backend`'s
    (``compile_caches`` as there)."""
    problem = native_problem(native) if native is not None else None
    inside, outside = [], []
    for case in cases:
        why = caps.outside(dtype=case.dtype, head_dim=case.head_dim) if caps is not None else None
        if why is None:
            inside.append(case)
        else:
            outside.append(CaseResult(case=case, status=CaseStatus.SKIPPED,
                                      detail=f"outside this build's capabilities: {why}"))
    results: list[CaseResult] = []
    crash = None
    if problem is None and inside:
        job = _Job(adapters_ref=isolation.adapters_ref, name=name, adapter=portable(adapter), device=device,
                   cases=tuple(inside),
                   tolerances=tolerances, kind=kind, compile_caches=compile_caches)
        got = run_in_child("attnforge.verify.isolated:child_cases", job, runner=runner, python=isolation.python,
                           env=environ, timeout_s=isolation.timeout_s)
        load = next((i for i in got.items if isinstance(i, str)), None)
        problem = load
        results = [i for i in got.items if isinstance(i, CaseResult)]
        if got.failure is not None and load is None:
            current = got.current if isinstance(got.current, VerifyCase) else None
            last = output_headline(got.output_tail)  # the error's line, not torch's boilerplate after it
            crash = (crash_text(got.failure, current.dtype, current.head_dim, caps) if current is not None
                     else f"{got.failure} before the first case" + (f" ({last})" if last else ""))
            if current is not None:
                results.append(CaseResult(case=current, status=CaseStatus.ERROR, detail=crash))
        ran = {r.case for r in results}
        results += [CaseResult(case=c, status=CaseStatus.SKIPPED, detail=_NOT_RUN)
                    for c in inside if c not in ran]
    results += outside
    if problem is not None:
        summary = problem
    elif crash is not None:
        ran_ok = sum(r.status is CaseStatus.PASSED for r in results)
        summary = f"{crash} (the child process died; {ran_ok} case(s) passed before)"
    else:
        summary = summarize(results, device)
        not_run = sum(r.detail.startswith(_NOT_RUN) for r in results)
        if not_run:
            summary += f" (the error poisoned the CUDA context: {not_run} case(s) not run)"
    ok = problem is None and crash is None and all_ok(results)  # a failed feature case only takes that feature
    return BackendVerification(backend=name, backend_version=native.version if native is not None else None,
                               kind=kind, device_key=device.key, native=native, ok=ok, summary=summary,
                               cases=tuple(results))


def child_cases(job: _Job, announce: Callable[[object], None]) -> Iterator[object]:
    """In the child: each case's result as it finishes; a load error as one string."""
    adapter = child_adapter(job.adapters_ref, job.name, job.adapter)
    load = adapter.load_error()
    if load is not None:
        yield str(load)
        return
    for case in job.cases:
        announce(case)
        verdict = verify_backend(adapter, device=job.device, cases=[case], tolerances=job.tolerances, kind=job.kind,
                                 compile_caches=job.compile_caches)
        result = verdict.cases[0]
        yield result
        if result.status is CaseStatus.ERROR and _POISONED.search(result.detail):
            return


def child_adapter(ref: str, name: str, blob: bytes | None) -> Any:
    """In the child: the parent's adapter, else the one ``ref``'s factory (or the SDPA fallback) names."""
    import pickle

    from attnforge._system.isolate import resolve

    if blob is not None:
        return pickle.loads(blob)  # noqa: S301 - pickled by our parent
    registry = resolve(ref)()
    if name in registry:
        return registry[name]
    from attnforge.backends.registry import FALLBACK, fallback

    if name == FALLBACK:
        return fallback()
    raise KeyError(f"no adapter named {name!r} in {ref}")
