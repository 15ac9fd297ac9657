"""Prove a backend works here: its native modules import, and its output matches the float64 reference.

The import runs in a subprocess (a broken extension can abort the interpreter); the numerics run in this
process, on the device, case by case (see :mod:`attnforge.verify.cases`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from attnforge._compat import StrEnum
from attnforge._system.runner import Runner
from attnforge.backends.adapter import BackendAdapter, supported_features
from attnforge.backends.bound import bound_call
from attnforge.backends.exact import reference_attention
from attnforge.catalog.backends import Backend
from attnforge.catalog.tolerances import PrecisionKind, Tolerances
from attnforge.probe.backends import _probe_import, installed_distribution
from attnforge.probe.context import ProbeContext
from attnforge.probe.snapshot import InstalledBackend
from attnforge.records import VerifyRecord
from attnforge.types.device import DeviceType
from attnforge.verify.cases import VerifyCase
from attnforge.verify.causes import full_text, headline
from attnforge.verify.compare import Comparison, compare
from attnforge.verify.device import DeviceInfo
from attnforge.verify.feature_inputs import case_inputs, check_dropout


class CaseStatus(StrEnum):
    """The outcome of one case."""

    PASSED = "passed"
    FAILED = "failed"  # ran, but the output is wrong (NaN/Inf or outside tolerance)
    ERROR = "error"  # the backend raised
    SKIPPED = "skipped"  # the backend does not support this case (its unsupported_reasons)


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseResult:
    """One case of one backend.

    Attributes:
        case: the shape, dtype, causal flag and seed.
        status: passed, failed, error or skipped.
        detail: the comparison, the error's first meaningful line (:func:`attnforge.verify.causes.headline`),
            or the skip reasons.
        comparison: the numbers behind a passed or failed case.
        duration_s: wall time of the backend call and the check.
        cause: for an error, the whole exception chain with the traceback tails
            (:func:`attnforge.verify.causes.full_text`); empty otherwise.
        repaired: the empty compile artifacts removed before this case was run a second time
            (:mod:`attnforge.verify.repair`); empty when it ran once.
    """

    case: VerifyCase
    status: CaseStatus
    detail: str
    comparison: Comparison | None = None
    duration_s: float = 0.0
    cause: str = ""
    repaired: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendVerification:
    """The verdict on one backend on one device.

    Attributes:
        backend: the adapter's (catalog) name.
        backend_version: the installed version (torch's for built-ins).
        kind: the tolerance family applied.
        device_key: the records key.
        ok: the native import worked and every case that ran passed (at least one ran).
        summary: one line for people.
        native: the subprocess import (None for adapters the catalog does not know).
        cases: every case, skipped ones included.
    """

    backend: str
    backend_version: str | None
    kind: PrecisionKind
    device_key: str
    ok: bool
    summary: str
    native: InstalledBackend | None
    cases: tuple[CaseResult, ...] = ()

    @property
    def failures(self) -> tuple[CaseResult, ...]:
        return tuple(c for c in self.cases if c.status in (CaseStatus.FAILED, CaseStatus.ERROR))

    @property
    def failed_features(self) -> tuple[str, ...]:
        """Features whose cases failed: the backend stays verified for every call that uses none of them."""
        return tuple(sorted({c.case.feature for c in self.failures if c.case.feature}))

    def to_record(self) -> VerifyRecord:
        """The row stored for doctor and the dispatcher."""
        return VerifyRecord(device_key=self.device_key, backend=self.backend,
                            backend_version=self.backend_version, ok=self.ok, summary=self.summary,
                            details=details_json(self))


def details_json(v: BackendVerification) -> dict[str, Any]:
    """Per-case results as strict JSON values (non-finite numbers become null)."""
    from attnforge._serde import to_jsonable

    return {
        "kind": v.kind.value,
        "failed_features": list(v.failed_features),
        "native": _finite(to_jsonable(v.native)),
        "cases": [_finite(to_jsonable(c)) for c in v.cases],
    }


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


# -- the native import ---------------------------------------------------------------------------------------
def check_native_import(backend: Backend, *, runner: Runner, python: str, environ: Mapping[str, str],
                        timeout_s: float = 30.0) -> InstalledBackend:
    """Import the backend's package and native modules in a subprocess of ``python``.

    Built-ins (SDPA, FlexAttention) import their module from torch; packaged backends must be installed.

    Returns:
        The import's outcome; ``imports`` is None when the backend is not installed.
    """
    ctx = ProbeContext(runner=runner, environ=dict(environ), python=python, timeout_s=timeout_s / 4)
    if backend.builtin:
        try:
            dist = ("torch", metadata.version("torch"))
        except metadata.PackageNotFoundError:
            return InstalledBackend(backend=backend.id, distribution=None, version=None, imports=None)
    else:
        found = installed_distribution(backend)
        if found is None:
            return InstalledBackend(backend=backend.id, distribution=None, version=None, imports=None)
        dist = found
    # The probe's subprocess script is the one place that knows how to import a backend safely.
    return _probe_import(ctx, backend, dist[0], dist[1])


def native_problem(native: InstalledBackend) -> str | None:
    """Why the native import result rules the backend out, or None when it loaded."""
    if not native.installed:
        return "not installed"
    if not native.imports:
        return f"import {native.backend} failed: {native.import_error or 'unknown error'}"
    bad = [m for m in native.native if not m.ok]
    if bad:
        return "; ".join(f"native module {m.name} failed to import: {m.error}" for m in bad)
    return None


# -- the numerics --------------------------------------------------------------------------------------------
def verify_backend(
    adapter: BackendAdapter, *, device: DeviceInfo, cases: Sequence[VerifyCase], tolerances: Tolerances,
    kind: PrecisionKind = PrecisionKind.EXACT, native: InstalledBackend | None = None,
    compile_caches: Sequence[Path] | Callable[[], Sequence[Path]] = (),
) -> BackendVerification:
    """Run every case on ``adapter`` and compare it with the float64 reference.

    Args:
        adapter: the backend behind the common call convention.
        device: where to run.
        cases: the shapes to try; those the adapter does not support are skipped with its reasons.
        tolerances: the tolerance table; the row for ``(kind, case.dtype)`` decides each case.
        kind: exact, or quantized for kernels such as SageAttention.
        native: the subprocess import result, when one was made; a failed import fails the backend unrun.
        compile_caches: the Inductor/Triton cache folders the backend's compiles use, or what finds them when
            called (:class:`attnforge.verify.repair.CompileCaches`, asked only once a case raised): after a case
            raises, empty artifacts an interrupted compile left there are removed and the case runs once more.

    Returns:
        The verdict; never raises for a misbehaving backend (its errors become failed cases).
    """
    problem = native_problem(native) if native is not None else None
    if problem is None:
        problem = adapter.load_error()
    results: list[CaseResult] = []
    if problem is None:
        results = _run_cases(adapter, cases, device=device, tolerances=tolerances, kind=kind,
                             compile_caches=compile_caches)
    return BackendVerification(
        backend=adapter.name, backend_version=native.version if native is not None else None, kind=kind,
        device_key=device.key, native=native, ok=problem is None and all_ok(results),
        summary=problem if problem is not None else summarize(results, device), cases=tuple(results),
    )


def _run_cases(adapter: BackendAdapter, cases: Sequence[VerifyCase], *, device: DeviceInfo,
               tolerances: Tolerances, kind: PrecisionKind,
               compile_caches: Sequence[Path] | Callable[[], Sequence[Path]]) -> list[CaseResult]:
    """Each case; one that raised runs once more after empty compile artifacts were removed (scanning stops
    once a scan found none: the rest of the failures are the backend's own)."""
    from attnforge.verify.repair import remove_empty_artifacts

    results = []
    for case in cases:
        result = _run_case(adapter, case, device=device, tolerances=tolerances, kind=kind)
        if result.status is CaseStatus.ERROR and compile_caches:
            if callable(compile_caches):
                compile_caches = compile_caches()
            removed = remove_empty_artifacts(compile_caches)
            if not removed:
                compile_caches = ()
            else:
                again = _run_case(adapter, case, device=device, tolerances=tolerances, kind=kind)
                result = dataclasses.replace(again, repaired=tuple(str(p) for p in removed))
        results.append(result)
    return results


def all_ok(results: Sequence[CaseResult]) -> bool:
    """Every plain case that ran passed, and something passed; a failed feature case only takes that feature
    away (:attr:`BackendVerification.failed_features`)."""
    ran = [r for r in results if r.status is not CaseStatus.SKIPPED]
    plain_ok = all(r.status is CaseStatus.PASSED for r in ran if not r.case.feature)
    return plain_ok and any(r.status is CaseStatus.PASSED for r in ran)


def summarize(results: Sequence[CaseResult], device: DeviceInfo) -> str:
    """``"16 cases passed (float32, bfloat16; D 32-128; causal on/off; GQA)"`` or the first failure."""
    ran = [r for r in results if r.status is not CaseStatus.SKIPPED]
    skipped = len(results) - len(ran)
    if not ran:
        return f"no case runs on {device.type.value}: " + (results[0].detail if results else "no cases")
    bad = [r for r in ran if r.status is not CaseStatus.PASSED]
    if any(not r.case.feature for r in bad) or len(bad) == len(ran):
        first = next((r for r in bad if not r.case.feature), bad[0])
        return (f"{len(bad)} of {len(ran)} cases failed; first: {first.case.label}: {first.detail}"
                + repair_note(results))
    if bad:  # only feature cases failed: the backend serves calls without those features
        ran = [r for r in ran if r.status is CaseStatus.PASSED]
        lost = ", ".join(sorted({r.case.feature for r in bad if r.case.feature}))
        return (f"{summarize(ran, device)}; not used for {lost} (first failure: {bad[0].case.label}:"
                f" {bad[0].detail})")
    dtypes = ", ".join(dict.fromkeys(r.case.dtype for r in ran))
    dims = sorted({r.case.head_dim for r in ran})
    gqa = any(r.case.heads_q != r.case.heads_kv for r in ran)
    gqa_text = "; GQA" if gqa else ""
    feats = sorted({r.case.feature for r in ran if r.case.feature})
    feat_text = f"; {', '.join(feats)}" if feats else ""
    text = f"{len(ran)} cases passed ({dtypes}; D {dims[0]}-{dims[-1]}; causal on/off{gqa_text}{feat_text})"
    return text + (f", {skipped} unsupported skipped" if skipped else "") + repair_note(results)


def repair_note(results: Sequence[CaseResult]) -> str:
    """``"; repaired: 1 empty compile artifact removed (/tmp/torchinductor_u/ab/cab.so), 1 case re-run"``."""
    removed = list(dict.fromkeys(p for r in results for p in r.repaired))
    if not removed:
        return ""
    rerun = sum(bool(r.repaired) for r in results)
    return (f"; repaired: {len(removed)} empty compile artifact(s) an interrupted compile left removed "
            f"({removed[0]}{', ...' if len(removed) > 1 else ''}), {rerun} case(s) re-run")


def _run_case(adapter: BackendAdapter, case: VerifyCase, *, device: DeviceInfo, tolerances: Tolerances,
              kind: PrecisionKind) -> CaseResult:
    precision = "allow_quantized" if kind is PrecisionKind.QUANTIZED else "exact"
    call = case.call(device_type=device.type.value, compute_capability=device.compute_capability,
                     precision=precision)
    reasons = adapter.unsupported_reasons(call)
    if case.feature and case.feature not in supported_features(adapter) and not reasons:
        reasons = [f"does not support {case.feature}"]
    if reasons:
        return CaseResult(case=case, status=CaseStatus.SKIPPED, detail="; ".join(reasons))
    import torch

    tol = tolerances.get(kind, case.dtype)
    q, k, v, opts = case_inputs(case, device.torch_device)
    start = time.perf_counter()
    with no_tf32():
        if case.feature == "dropout":
            try:
                with torch.no_grad():
                    problem = check_dropout(adapter, q, k, v, causal=case.causal, seed=case.seed)
            except Exception as exc:  # a backend may raise anything; it becomes the case's verdict
                return _error(case, exc, start)
            return CaseResult(case=case, status=CaseStatus.FAILED if problem else CaseStatus.PASSED,
                              detail=problem or "reproducible from the seed, finite, changes the output",
                              duration_s=time.perf_counter() - start)
        ref = reference_attention(q, k, v, causal=case.causal, scale=None, **opts)
        ref_lse = None
        if opts.get("return_lse"):
            ref, ref_lse = ref
        poison_allocator(tuple(ref.shape), getattr(torch, case.dtype), device.torch_device)
        try:
            # the route the dispatcher serves (a direct kernel entry where the adapter binds one), so a wrong
            # argument mapping there fails here; feature cases bind to the adapter's call with their keywords
            run = bound_call(adapter, call, causal=case.causal, scale=None, opts=opts)
            with torch.no_grad():
                out = run(q, k, v)
            if device.type is DeviceType.CUDA:
                torch.cuda.synchronize()
        except Exception as exc:  # a backend may raise anything; it becomes the case's verdict
            return _error(case, exc, start)
    lse_problem = None
    if ref_lse is not None:
        out, lse = out
        lse_check = compare(lse, ref_lse, tol)
        if not lse_check.ok:
            lse_problem = f"lse: {lse_check.describe()}"
    result = compare(out, ref, tol)
    if result.ok and (out.dtype != q.dtype or lse_problem):
        return CaseResult(case=case, status=CaseStatus.FAILED, comparison=result,
                          detail=lse_problem or f"returned {out.dtype}, expected {q.dtype}",
                          duration_s=time.perf_counter() - start)
    return CaseResult(case=case, status=CaseStatus.PASSED if result.ok else CaseStatus.FAILED,
                      detail=result.describe(), comparison=result, duration_s=time.perf_counter() - start)


def make_inputs(case: VerifyCase, device: str) -> tuple[Any, Any, Any]:
    """Seeded standard-normal ``q [B, Hq, Sq, D]`` and ``k, v [B, Hkv, Sk, D]`` in the case's dtype."""
    import torch

    gen = torch.Generator().manual_seed(case.seed)
    dtype = getattr(torch, case.dtype)

    def draw(heads: int, seqlen: int) -> Any:
        t = torch.randn(case.batch, heads, seqlen, case.head_dim, generator=gen, dtype=torch.float32)
        return t.to(device=device, dtype=dtype)

    q = draw(case.heads_q, case.seqlen_q)
    return q, draw(case.heads_kv, case.seqlen_k), draw(case.heads_kv, case.seqlen_k)


def poison_allocator(shape: tuple[int, ...], dtype: Any, device: str) -> None:
    """Leave NaN-filled memory where the next output of ``shape`` is likely to be allocated.

    PyTorch's CUDA caching allocator (and glibc's malloc for same-sized CPU blocks) hands a freed block to the
    next request that fits, so an output element a kernel forgets to write reads as NaN instead of a lucky
    zero. Best effort: the NaN/Inf check in :func:`attnforge.verify.compare.compare` is the guarantee.
    """
    import torch

    for factor in (1, 4):
        poison = torch.full((factor * math.prod(shape),), math.nan, dtype=dtype, device=device)
        del poison


@contextmanager
def no_tf32() -> Iterator[None]:
    """Turn TF32 off for matmuls and cuDNN (the reference must be float64-exact), restoring it afterwards."""
    import torch

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _error(case: VerifyCase, exc: BaseException, start: float) -> CaseResult:
    """The case's verdict when the backend raised: the first meaningful line, and the whole chain kept."""
    return CaseResult(case=case, status=CaseStatus.ERROR, detail=headline(exc), cause=full_text(exc),
                      duration_s=time.perf_counter() - start)
