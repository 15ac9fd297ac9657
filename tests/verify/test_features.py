"""verify covers the features a backend claims: each is checked against the float64 reference, and only the
claimed ones run."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from attnforge.backends import registry
from attnforge.backends.adapter import FEATURES, required_features
from attnforge.backends.exact import ExactAdapter
from attnforge.backends.flex import FlexAdapter
from attnforge.catalog import load_catalog
from attnforge.catalog.tolerances import load_tolerances
from attnforge.verify.cases import VerifyCase, feature_cases
from attnforge.verify.check import CaseStatus, verify_backend
from attnforge.verify.device import current_device
from attnforge.verify.run import cases_for

CPU = current_device("cpu")
PLAIN = [VerifyCase(batch=1, heads_q=2, heads_kv=1, seqlen_q=6, seqlen_k=9, head_dim=16, dtype="float32",
                    causal=True, seed=5)]


def test_one_case_per_claimed_feature_and_dtype() -> None:
    claimed = frozenset(FEATURES)
    cases = feature_cases(claimed, dtypes=("float32", "bfloat16"), head_dims=(32, 64), max_seqlen=40, seed=1)
    assert {(c.feature, c.dtype) for c in cases} == {(f, d) for f in claimed for d in ("float32", "bfloat16")}
    assert len(cases) == 2 * len(claimed)
    for c in cases:
        assert c.heads_q % c.heads_kv == 0
        assert required_features(c.call(device_type="cpu", compute_capability=None)) == {c.feature}
    dv = next(c for c in cases if c.feature == "dv")
    assert dv.head_dim_v is not None and dv.head_dim_v != dv.head_dim
    assert feature_cases(claimed, dtypes=("float32",), head_dims=(32,), max_seqlen=40, seed=1) == \
        feature_cases(claimed, dtypes=("float32",), head_dims=(32,), max_seqlen=40, seed=1)


def test_sdpa_math_passes_every_feature_it_claims() -> None:
    adapter = registry.adapters()["sdpa-math"]
    cases = cases_for(adapter, load_catalog(), CPU)
    ran = {c.feature for c in cases if c.feature}
    assert ran == set(adapter.caps.features)  # type: ignore[attr-defined]
    res = verify_backend(adapter, device=CPU, cases=cases, tolerances=load_tolerances())
    assert res.ok, res.summary
    assert all(c.status is CaseStatus.PASSED for c in res.cases if c.case.feature)
    assert "window" in res.summary and "mask" in res.summary


@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
@pytest.mark.slow
def test_eager_flex_passes_every_feature_it_claims() -> None:
    """FlexAttention's feature cases on CPU through eager flex_attention (its CPU compile has no lse; the GPU
    runs them compiled in tests/dispatch/test_gpu.py)."""
    base = registry.adapters()["flex"]
    assert isinstance(base, FlexAdapter)
    flex = FlexAdapter(name="flex", caps=base.caps, requirement=base.requirement, compiler=lambda fn: fn)
    cases = cases_for(flex, load_catalog(), CPU)
    assert {c.feature for c in cases if c.feature} == set(base.caps.features) >= {"mask", "window", "softcap",
                                                                                  "sinks", "lse", "dv",
                                                                                  "causal_top_left"}
    res = verify_backend(flex, device=CPU, cases=cases, tolerances=load_tolerances())
    assert res.ok, res.summary
    assert all(c.status is CaseStatus.PASSED for c in res.cases), res.summary


def test_the_exact_fallback_passes_every_feature() -> None:
    cases = feature_cases(frozenset(FEATURES), dtypes=("float32", "bfloat16"), head_dims=(32,), max_seqlen=24)
    res = verify_backend(ExactAdapter(), device=CPU, cases=cases, tolerances=load_tolerances())
    assert res.ok, res.summary
    assert {c.case.feature for c in res.cases if c.status is CaseStatus.PASSED} == set(FEATURES)


@dataclasses.dataclass
class Claims(ExactAdapter):
    """The exact math claiming only ``features``, and getting one of them wrong."""

    name: str = "claims"
    features: frozenset[str] = frozenset()
    wrong: str = ""

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None, **opts: Any) -> Any:
        if self.wrong == "window":
            opts.pop("window", None)
        if self.wrong == "softcap" and "softcap" in opts:
            opts["softcap"] *= 2
        if self.wrong == "lse" and opts.get("return_lse"):
            out, lse = ExactAdapter.__call__(self, q, k, v, causal=causal, scale=scale, **opts)
            return out, lse + 0.5
        if self.wrong == "dropout":
            opts.pop("dropout_p", None)
        return ExactAdapter.__call__(self, q, k, v, causal=causal, scale=scale, **opts)


@dataclasses.dataclass
class _NoCausal(ExactAdapter):
    name: str = "no-causal"
    features: frozenset[str] = frozenset()

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None, **opts: Any) -> Any:
        return ExactAdapter.__call__(self, q, k, v, causal=False, scale=scale, **opts)


@pytest.mark.parametrize("wrong", ["window", "softcap", "lse", "dropout"])
def test_a_claimed_feature_done_wrong_fails_verify(wrong: str) -> None:
    adapter = Claims(features=frozenset({wrong, "mask"}), wrong=wrong)
    cases = feature_cases(adapter.features, dtypes=("float32",), head_dims=(32,), max_seqlen=24, seed=2)
    res = verify_backend(adapter, device=CPU, cases=[*PLAIN, *cases], tolerances=load_tolerances())
    assert res.ok, res.summary  # the backend stays verified for calls without the feature it gets wrong
    status = {c.case.feature: c.status for c in res.cases if c.case.feature}
    assert status == {wrong: CaseStatus.FAILED, "mask": CaseStatus.PASSED}
    assert res.failed_features == (wrong,)
    assert res.to_record().details["failed_features"] == [wrong]
    assert f"not used for {wrong}" in res.summary


def test_a_backend_that_fails_its_plain_cases_fails_whatever_its_features_do() -> None:
    adapter = _NoCausal(features=frozenset({"window"}))
    cases = [*PLAIN, *feature_cases(adapter.features, dtypes=("float32",), head_dims=(32,), max_seqlen=24)]
    res = verify_backend(adapter, device=CPU, cases=cases, tolerances=load_tolerances())
    assert not res.ok
    assert "cases failed; first: float32 causal" in res.summary


def test_cases_outside_the_claims_are_skipped_not_run() -> None:
    adapter = Claims(features=frozenset({"window"}))
    case = VerifyCase(batch=1, heads_q=2, heads_kv=2, seqlen_q=5, seqlen_k=5, head_dim=16, dtype="float32",
                      causal=False, seed=0, feature="sinks")
    res = verify_backend(adapter, device=CPU, cases=[case], tolerances=load_tolerances())
    assert [c.status for c in res.cases] == [CaseStatus.SKIPPED]
    assert "does not support sinks" in res.cases[0].detail
    assert not {c.feature for c in cases_for(adapter, load_catalog(), CPU)} - {None, "window"}
    assert torch.get_num_threads() == 1  # the verify conftest keeps CI machines calm
