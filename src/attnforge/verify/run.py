"""``attnforge verify`` as a library call: choose the backends, check each, store the verdicts."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from attnforge._system.runner import Runner, SubprocessRunner
from attnforge.backends.adapter import FEATURES, BackendAdapter, supported_features
from attnforge.catalog import Catalog
from attnforge.catalog.tolerances import PrecisionKind, Tolerances
from attnforge.errors import UsageError
from attnforge.records import RecordStore
from attnforge.verify.cases import (
    DEVICE_DTYPES,
    DEVICE_HEAD_DIMS,
    DEVICE_MAX_SEQLEN,
    VerifyCase,
    claimed_matrix,
    feature_cases,
    generate_cases,
)
from attnforge.verify.check import BackendVerification, check_native_import, verify_backend
from attnforge.verify.device import DeviceInfo
from attnforge.verify.isolated import Isolation
from attnforge.verify.repair import CompileCaches


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyReport:
    """The result of one ``attnforge verify``.

    Attributes:
        device: where the cases ran.
        results: one verdict per backend checked.
        skipped: backends left out of a run without names, with the reason (not installed, no path here).
    """

    device: DeviceInfo
    results: tuple[BackendVerification, ...]
    skipped: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every backend checked passed (and at least one was checked)."""
        return bool(self.results) and all(r.ok for r in self.results)


def cases_for(adapter: BackendAdapter, catalog: Catalog, device: DeviceInfo, *,
              seed: int = 0) -> list[VerifyCase]:
    """The cases for ``adapter``: the dtypes and head dims its catalog entry claims that this device runs, and
    a case per feature its capabilities claim (each checked against the float64 reference)."""
    entry = catalog.backends.get(adapter.name)
    device_type = device.type.value
    if entry is None:
        dtypes, head_dims = DEVICE_DTYPES[device_type], DEVICE_HEAD_DIMS[device_type]
    else:
        dtypes, head_dims = claimed_matrix(device_type=device_type, backend_dtypes=entry.support.dtypes,
                                           max_head_dim=entry.support.max_head_dim)
    max_seqlen = DEVICE_MAX_SEQLEN[device_type]
    plain = generate_cases(dtypes=dtypes, head_dims=head_dims, max_seqlen=max_seqlen, seed=seed)
    claimed = supported_features(adapter) & frozenset(FEATURES)
    decode_mask = getattr(getattr(adapter, "caps", None), "mask_max_seqlen_q", 0)
    return plain + feature_cases(claimed, dtypes=dtypes, head_dims=head_dims, max_seqlen=max_seqlen // 2,
                                 seed=seed, mask_max_seqlen_q=decode_mask)


def run_verify(
    names: Sequence[str], *, adapters: Mapping[str, BackendAdapter], catalog: Catalog, device: DeviceInfo,
    tolerances: Tolerances, store: RecordStore | None = None, runner: Runner | None = None,
    python: str = sys.executable, environ: Mapping[str, str] | None = None, seed: int = 0,
    isolation: Isolation | None = None,
) -> VerifyReport:
    """Verify the named backends (every installed backend with a path on ``device`` when none are named).

    Args:
        names: backend ids; empty for "everything that can run here".
        adapters: the registry (:func:`attnforge.backends.registry.adapters`).
        catalog: claims (dtypes, head dims, quantized) and native modules.
        device: where to run.
        tolerances: the pass rules.
        store: where verdicts are recorded (not recorded when None).
        runner: runs the import subprocess.
        python: the interpreter whose imports are checked (this one: the numerics run here).
        environ: the subprocess environment.
        seed: seeds shapes and inputs.
        isolation: run each backend in a child process with this timeout (None: in this process).

    Raises:
        UsageError: a named backend has no adapter.
    """
    unknown = [n for n in names if n not in adapters]
    if unknown:
        raise UsageError(f"no adapter for backend(s) {', '.join(unknown)}",
                         hint=f"known backends: {', '.join(sorted(adapters))}")
    runner = runner or SubprocessRunner()
    env = dict(os.environ if environ is None else environ)
    chosen = list(dict.fromkeys(names)) if names else sorted(adapters)
    caches = CompileCaches(env)  # read, not chosen (whoever set TORCHINDUCTOR_CACHE_DIR owns it), once a case fails
    skipped: dict[str, str] = {}
    results: list[BackendVerification] = []
    for name in chosen:
        adapter = adapters[name]
        cases = cases_for(adapter, catalog, device, seed=seed)
        entry = catalog.backends.get(name)
        kind = PrecisionKind.QUANTIZED if entry is not None and entry.quantized else PrecisionKind.EXACT
        if not names:
            why = _why_not_here(adapter, cases, device, kind)
            if why is not None:
                skipped[name] = why
                continue
        native = check_native_import(entry, runner=runner, python=python, environ=env) if entry else None
        if isolation is None:
            result = verify_backend(adapter, device=device, cases=cases, tolerances=tolerances, kind=kind,
                                    native=native, compile_caches=caches)
        else:  # each backend in a child process: a crash or hang becomes this backend's failed verdict
            from attnforge.cache.capabilities import backend_capabilities
            from attnforge.verify.isolated import verify_in_child

            result = verify_in_child(name, adapter=adapter, device=device, cases=tuple(cases),
                                     tolerances=tolerances, kind=kind, native=native, isolation=isolation,
                                     runner=runner, environ=env, caps=backend_capabilities(name),
                                     compile_caches=caches)
        results.append(result)
        if store is not None:
            store.add_verify(result.to_record())
    return VerifyReport(device=device, results=tuple(results), skipped=skipped)


def _why_not_here(adapter: BackendAdapter, cases: Sequence[VerifyCase], device: DeviceInfo,
                  kind: PrecisionKind) -> str | None:
    load = adapter.load_error()
    if load is not None:
        return load
    if not cases:
        return f"claims no dtype or head dim that runs on {device.type.value}"
    cc = device.compute_capability
    precision = "allow_quantized" if kind is PrecisionKind.QUANTIZED else "exact"
    reasons = [adapter.unsupported_reasons(c.call(device_type=device.type.value, compute_capability=cc,
                                                  precision=precision)) for c in cases]
    if all(reasons):
        return f"no path on {device.type.value}: {reasons[0][0]}"
    return None
