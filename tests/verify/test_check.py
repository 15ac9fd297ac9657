"""verify on CPU: SDPA math passes; wrong, NaN-leaving and raising backends fail with the evidence."""

from __future__ import annotations

import dataclasses
import json
import sys
from importlib import metadata
from pathlib import Path

import pytest

from attnforge.catalog import load_catalog
from attnforge.catalog.tolerances import PrecisionKind, load_tolerances
from attnforge.errors import CatalogError, UsageError
from attnforge.probe import backends as probe_backends
from attnforge.records import RecordStore
from attnforge.verify.cases import generate_cases
from attnforge.verify.check import CaseStatus, check_native_import, native_problem, verify_backend
from attnforge.verify.device import current_device
from attnforge.verify.run import cases_for, run_verify
from tests._fakes import FakeRunner, recorded
from tests.verify.adapters import (
    NanAdapter,
    NotInstalledAdapter,
    RaisingAdapter,
    ScaledAdapter,
    SdpaMathAdapter,
    WrongAdapter,
)

CPU = current_device("cpu")
CASES = generate_cases(dtypes=("float32", "bfloat16"), head_dims=(32, 64), max_seqlen=48, seed=3)


def test_sdpa_math_passes_every_cpu_case() -> None:
    res = verify_backend(SdpaMathAdapter(), device=CPU, cases=CASES, tolerances=load_tolerances())
    assert res.ok, res.summary
    assert {c.status for c in res.cases} == {CaseStatus.PASSED}
    assert res.summary.startswith(f"{len(CASES)} cases passed")
    assert "GQA" in res.summary
    assert res.device_key == "cpu|torch " + CPU.torch_version


def test_a_backend_that_ignores_causal_fails_on_causal_cases_with_the_worst_element() -> None:
    res = verify_backend(WrongAdapter(), device=CPU, cases=CASES, tolerances=load_tolerances())
    assert not res.ok
    by_causal = {c.case.causal: set() for c in res.cases}
    for c in res.cases:
        by_causal[c.case.causal].add(c.status)
    assert by_causal[False] == {CaseStatus.PASSED}
    assert CaseStatus.FAILED in by_causal[True]
    failed = res.failures[0]
    cmp = failed.comparison
    assert cmp is not None
    assert 0 < cmp.failing_fraction < 1
    assert len(cmp.worst_index) == 4
    assert abs(cmp.worst_value - cmp.worst_reference) == pytest.approx(cmp.max_abs_err, rel=1e-6)
    assert "worst at" in failed.detail
    assert "cases failed; first:" in res.summary


def test_unwritten_outputs_fail_as_nan() -> None:
    res = verify_backend(NanAdapter(), device=CPU, cases=CASES[:2], tolerances=load_tolerances())
    assert not res.ok
    for c in res.cases:
        assert c.comparison is not None
        assert c.comparison.nonfinite_count == c.case.batch * c.case.heads_q * c.case.head_dim


def test_a_raising_backend_fails_with_its_error() -> None:
    res = verify_backend(RaisingAdapter(), device=CPU, cases=CASES[:1], tolerances=load_tolerances())
    assert not res.ok
    assert res.cases[0].status is CaseStatus.ERROR
    assert "no kernel image" in res.cases[0].detail


def test_unsupported_cases_are_skipped_and_all_skipped_is_not_verified() -> None:
    only_fp32 = SdpaMathAdapter(dtypes=("float32",))
    res = verify_backend(only_fp32, device=CPU, cases=CASES, tolerances=load_tolerances())
    assert res.ok
    assert {c.status for c in res.cases if c.case.dtype == "bfloat16"} == {CaseStatus.SKIPPED}
    none = verify_backend(SdpaMathAdapter(dtypes=()), device=CPU, cases=CASES, tolerances=load_tolerances())
    assert not none.ok
    assert none.summary.startswith("no case runs on cpu")


def test_a_backend_that_does_not_load_fails_unrun() -> None:
    res = verify_backend(NotInstalledAdapter(), device=CPU, cases=CASES, tolerances=load_tolerances())
    assert not res.ok
    assert res.cases == ()
    assert "missing_attn" in res.summary


def test_quantized_kind_uses_the_looser_row() -> None:
    bf16 = [c for c in CASES if c.dtype == "bfloat16"]
    off_by_3_percent = ScaledAdapter(factor=1.03)
    exact = verify_backend(off_by_3_percent, device=CPU, cases=bf16, tolerances=load_tolerances())
    quant = verify_backend(off_by_3_percent, device=CPU, cases=bf16, tolerances=load_tolerances(),
                           kind=PrecisionKind.QUANTIZED)
    assert not exact.ok
    assert quant.ok, quant.summary


def test_a_dtype_without_a_tolerance_row_is_a_data_error() -> None:
    fp32 = [c for c in CASES if c.dtype == "float32"][:1]
    with pytest.raises(CatalogError, match="no tolerance for quantized float32"):
        verify_backend(SdpaMathAdapter(), device=CPU, cases=fp32, tolerances=load_tolerances(),
                       kind=PrecisionKind.QUANTIZED)


def _runner_replaying(output_name: str, import_name: str, *natives: str) -> FakeRunner:
    argv = (sys.executable, str(probe_backends._SCRIPT), import_name, *natives)
    return FakeRunner().add(argv, recorded(output_name))


def test_native_import_failure_fails_the_backend_before_any_case() -> None:
    catalog = load_catalog()
    entry = catalog.backend("sdpa-math")
    broken = dataclasses.replace(entry, native_modules=("torch._no_such_native",))
    runner = _runner_replaying("backend_script_torch_missing_native.json", "torch", "torch._no_such_native")
    native = check_native_import(broken, runner=runner, python=sys.executable, environ={})
    assert native_problem(native) == (
        "native module torch._no_such_native failed to import: "
        "ModuleNotFoundError: No module named 'torch._no_such_native'")
    res = verify_backend(SdpaMathAdapter(), device=CPU, cases=CASES, tolerances=load_tolerances(),
                         native=native)
    assert not res.ok
    assert res.cases == ()
    assert "torch._no_such_native" in res.summary


def test_run_verify_checks_records_and_reads_back(tmp_path: Path) -> None:
    runner = _runner_replaying("backend_script_torch_cpu.json", "torch")
    store = RecordStore(tmp_path)
    adapters = {"sdpa-math": SdpaMathAdapter(), "wrong": WrongAdapter(), "missing": NotInstalledAdapter()}
    report = run_verify([], adapters=adapters, catalog=load_catalog(), device=CPU,
                        tolerances=load_tolerances(), store=store, runner=runner, environ={})
    assert [r.backend for r in report.results] == ["sdpa-math", "wrong"]
    assert report.skipped == {"missing": "No module named 'missing_attn'"}
    assert not report.ok
    saved = store.latest_verify(CPU.key)
    assert saved["sdpa-math"].ok
    assert saved["sdpa-math"].backend_version == metadata.version("torch")  # built-ins carry torch's version
    assert not saved["wrong"].ok
    json.dumps(saved["wrong"].details, allow_nan=False)  # strict JSON: no NaN/Infinity
    worst = next(c for c in saved["wrong"].details["cases"] if c["status"] == "failed")["comparison"]
    assert {"worst_index", "worst_value", "worst_reference", "failing_fraction"} <= set(worst)
    assert runner.calls  # the import was checked in a subprocess


def test_sdpa_math_cases_follow_the_catalog_claims() -> None:
    cases = cases_for(SdpaMathAdapter(), load_catalog(), CPU)
    assert {c.dtype for c in cases} == {"float32", "bfloat16"}
    assert {c.head_dim for c in cases} == {32, 64, 128}


def test_unknown_backend_names_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="no adapter for backend"):
        run_verify(["flash-attn-9"], adapters={"sdpa-math": SdpaMathAdapter()}, catalog=load_catalog(),
                   device=CPU, tolerances=load_tolerances())
