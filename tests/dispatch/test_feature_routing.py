"""Routing with features, at the adapter seam: a backend lacking a feature is never chosen, a backend compiled per
shape needs a measured win and static shapes, and a backend that raises is skipped for that call signature with
one warning line."""

from __future__ import annotations

import dataclasses
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import attnforge
from attnforge.backends.adapter import AttentionCall
from attnforge.backends.exact import reference_attention
from attnforge.dispatch import features, runtime
from attnforge.errors import DispatchError
from attnforge.records import BenchRecord, RecordStore, VerifyRecord, device_key
from tests.dispatch._measured import faster_records

CPU_KEY = device_key("cpu", None, torch.__version__)


@dataclasses.dataclass
class Fake:
    """A verified backend at the seam that serves ``features`` with the reference math and counts calls."""

    name: str
    features: frozenset[str] = frozenset()
    raises: Exception | None = None
    calls: int = 0
    seen: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def load_error(self) -> str | None:
        return None

    def unsupported_reasons(self, call: AttentionCall) -> list[str]:
        return []

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None, **opts: Any) -> Any:
        self.calls += 1
        self.seen.append(opts)
        if self.raises is not None:
            raise self.raises
        result = reference_attention(q, k, v, causal=causal, scale=scale, **opts)
        return (result[0].to(q.dtype), result[1].float()) if opts.get("return_lse") else result.to(q.dtype)


@dataclasses.dataclass
class Jit(Fake):
    """A backend compiled per exact shape (FlexAttention's kind)."""

    caps: Any = dataclasses.field(default_factory=lambda: types.SimpleNamespace(
        jit_per_shape=True, features=frozenset(), priority=0))


def _install(tmp_path: Path, *fakes: Fake, bench: tuple[BenchRecord, ...] = (),
             measured: bool = True) -> runtime.Dispatcher:
    """Verify ``fakes``; with ``measured``, bench records saying they beat plain SDPA (first fastest) in the
    classes this file calls (so the routing, not the policy's "never before SDPA unmeasured", is under test)."""
    store = RecordStore(tmp_path / "home")
    for fake in fakes:
        store.add_verify(VerifyRecord(device_key=CPU_KEY, backend=fake.name, backend_version="1", ok=True,
                                      summary="ok"))
    records = list(bench)
    if measured:
        names = [f.name for f in fakes]
        (q, k, _), (q2, k2, _) = _qkv(), _qkv(sq=40, sk=40)
        for features in ((), ("window",), ("window", "lse"), ("softcap",), ("lse",)):
            for causal in (False, True):
                records += faster_records(names, q, k, causal=causal, features=features)
        records += faster_records(names, q, k, v=torch.empty(1, 2, 6, 5)) + faster_records(names, q2, k2)
    if records:
        store.add_bench(records)
    return runtime.Dispatcher({f.name: f for f in fakes}, records=store,
                              priorities={f.name: i for i, f in enumerate(fakes)})


@pytest.fixture
def use() -> Iterator[Any]:
    saved: list[runtime.Dispatcher | None] = []

    def install(d: runtime.Dispatcher) -> runtime.Dispatcher:
        saved.append(runtime.set_dispatcher(d))
        return d

    yield install
    if saved:
        runtime.set_dispatcher(saved[0])


def _qkv(sq: int = 6, sk: int = 6, d: int = 8) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(2)
    return tuple(torch.randn(1, h, s, d, generator=g) for h, s in ((4, sq), (2, sk), (2, sk)))


@pytest.mark.parametrize(("call", "served_by"), [
    pytest.param({"window": (2, 0)}, "windowed", id="window-goes-to-the-backend-that-has-it"),
    pytest.param({"window": (2, 0), "return_lse": True}, "full", id="window+lse-needs-both"),
    pytest.param({"softcap": 3.0}, "full", id="softcap"),
    pytest.param({"sinks": "sinks"}, "exact", id="nobody-has-sinks-so-exact"),
    pytest.param({}, "plain", id="a-plain-call-goes-to-the-first"),
])
def test_a_backend_lacking_a_feature_is_never_chosen(tmp_path: Path, use: Any, call: dict[str, Any],
                                                     served_by: str) -> None:
    plain = Fake("plain")
    windowed = Fake("windowed", features=frozenset({"window"}))
    full = Fake("full", features=frozenset({"window", "softcap", "lse"}))
    d = use(_install(tmp_path, plain, windowed, full))
    q, k, v = _qkv()
    kwargs = {key: (torch.randn(4) if val == "sinks" else val) for key, val in call.items()}
    result = attnforge.attention(q, k, v, causal=True, **kwargs)
    out = result[0] if kwargs.get("return_lse") else result
    want = reference_attention(q, k, v, causal=True, **kwargs)
    torch.testing.assert_close(out, (want[0] if kwargs.get("return_lse") else want).float())
    calls = {f.name: f.calls for f in (plain, windowed, full)}
    assert {n for n, c in calls.items() if c} == ({served_by} if served_by != "exact" else set())
    explanation = attnforge.explain(q, k, v, causal=True, **kwargs)
    assert explanation.chosen == served_by
    for rej in explanation.rejected:
        if rej.backend in calls and call:
            assert any(r.startswith("does not support") for r in rej.reasons)
    if served_by != "exact":
        fake = {"plain": plain, "windowed": windowed, "full": full}[served_by]
        assert set(fake.seen[-1]) <= {"window", "return_lse", "softcap"}  # only the features the call uses
    assert d.broken == {}


def test_a_forced_backend_lacking_a_feature_says_so(tmp_path: Path, use: Any) -> None:
    use(_install(tmp_path, Fake("plain")))
    q, k, v = _qkv()
    with pytest.raises(DispatchError, match="cannot serve") as err:
        attnforge.attention(q, k, v, window=(1, 1), backend="plain")
    assert "does not support window" in str(err.value)
    torch.testing.assert_close(attnforge.attention(q, k, v, window=(1, 1), backend="exact"),
                               reference_attention(q, k, v, window=(1, 1)).float())


def test_a_value_head_dim_that_differs_is_a_feature_on_the_hot_path_too(tmp_path: Path, use: Any) -> None:
    plain, mla = Fake("plain"), Fake("mla", features=frozenset({"dv"}))
    use(_install(tmp_path, plain, mla))
    q, k, _ = _qkv()
    v = torch.randn(1, 2, 6, 5)
    for _ in range(2):  # the second call takes the remembered route
        out = attnforge.attention(q, k, v)
        torch.testing.assert_close(out, reference_attention(q, k, v).float())
    assert (plain.calls, mla.calls) == (0, 2)


# -- one signature at a time, one line -------------------------------------------------------------------
def test_a_backend_that_raises_is_skipped_for_its_signature_with_one_line(tmp_path: Path, use: Any) -> None:
    flaky = Fake("flaky", raises=RuntimeError("backend exploded\n  File 'x.py', line 1\n  (a long trace)"))
    d = use(_install(tmp_path, flaky))
    q, k, v = _qkv()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            torch.testing.assert_close(attnforge.attention(q, k, v), reference_attention(q, k, v).float())
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "\n" not in message and "backend exploded" in message and "a long trace" not in message
    assert flaky.calls == 1
    assert list(d.demoted) == ["flaky"] and len(d.demoted["flaky"]) == 1 and d.broken == {}
    flaky.raises = None
    q2, k2, v2 = _qkv(sq=40, sk=40)  # another signature: the backend is still tried there
    attnforge.attention(q2, k2, v2)
    assert flaky.calls == 2


# -- kernels compiled per shape ---------------------------------------------------------------------------
def _bench(backend: str, tflops: float, seqlen: int) -> BenchRecord:
    return BenchRecord(device_key=CPU_KEY, backend=backend, backend_version="1", dtype="float32", mode="fwd",
                       causal=False, batch=1, heads_q=4, heads_kv=2, head_dim=8, seqlen_q=seqlen,
                       seqlen_k=seqlen, ms=1.0, tflops=tflops, peak_mem_bytes=None, run_id="r1")


def test_a_jit_backend_needs_a_measured_win(tmp_path: Path, use: Any) -> None:
    jit = Jit("jit")
    use(_install(tmp_path, jit, measured=False))
    q, k, v = _qkv()
    attnforge.attention(q, k, v)
    assert jit.calls == 0  # unmeasured: plain SDPA
    reasons = {r.backend: r.reasons for r in attnforge.explain(q, k, v).rejected}
    assert "compiles per shape and bench measured no win for this shape class" in reasons["jit"]


def test_a_jit_backend_with_a_win_serves_static_shapes_but_not_dynamic_ones(tmp_path: Path, use: Any) -> None:
    jit = Jit("jit")
    use(_install(tmp_path, jit, bench=(_bench("jit", 9.0, 8), _bench("sdpa", 3.0, 8)), measured=False))
    q, k, v = _qkv(sq=8, sk=8)
    for _ in range(3):
        attnforge.attention(q, k, v)
    assert jit.calls == 3
    for sk in (5, 6, 7, 8):  # decode-like: Sk grows inside one shape class
        attnforge.attention(*_qkv(sq=1, sk=sk))
        attnforge.attention(*_qkv(sq=7, sk=sk))
    before = jit.calls
    attnforge.attention(*_qkv(sq=7, sk=8))
    assert jit.calls == before  # the class turned dynamic: SDPA serves it
    assert "changed shape" in "; ".join(
        r for rej in attnforge.explain(*_qkv(sq=7, sk=8)).rejected for r in rej.reasons)


def test_the_packaged_tables_claim_no_flex_backward_on_cpu_and_mark_flex_as_jit() -> None:
    from attnforge.backends.capabilities import load_capabilities

    caps = load_capabilities()["flex"]
    assert caps.jit_per_shape
    call = AttentionCall(device_type="cpu", compute_capability=None, dtype="float32", batch=1, heads_q=2,
                         heads_kv=2, seqlen_q=8, seqlen_k=8, head_dim=16, causal=False, needs_grad=True)
    assert "no backward pass on cpu, and an input requires grad" in caps.unsupported_reasons(call)
    assert features.DYNAMIC_AFTER >= 1


@pytest.mark.parametrize(("bench", "chosen"), [
    pytest.param((), "sdpa", id="unmeasured-plain-sdpa-stays"),
    pytest.param((("sdpa-math", 2.0), ("sdpa", 3.0)), "sdpa", id="measured-slower"),
    pytest.param((("sdpa-math", 4.0),), "sdpa", id="sdpa-unmeasured-no-win-known"),
    pytest.param((("sdpa-math", 4.0), ("sdpa", 3.0)), "sdpa-math", id="measured-win"),
])
def test_a_forced_sdpa_kernel_on_cpu_needs_a_measured_win(tmp_path: Path, use: Any,
                                                          bench: tuple[tuple[str, float], ...], chosen: str) -> None:
    from attnforge.backends import registry

    store = RecordStore(tmp_path / "home")
    store.add_verify(VerifyRecord(device_key=CPU_KEY, backend="sdpa-math", backend_version="1", ok=True,
                                  summary="ok"))
    if bench:
        store.add_bench([_bench(name, tflops, 8) for name, tflops in bench])
    use(runtime.Dispatcher({"sdpa-math": registry.adapters()["sdpa-math"]}, records=store))
    q, k, v = _qkv(sq=8, sk=8)
    explanation = attnforge.explain(q, k, v)
    assert explanation.chosen == chosen
    if chosen == "sdpa":
        reasons = {r.backend: r.reasons for r in explanation.rejected}["sdpa-math"]
        assert any("measured it faster than plain SDPA" in r for r in reasons)


def test_a_feature_that_failed_verify_is_not_used_but_the_backend_is(tmp_path: Path, use: Any) -> None:
    fa = Fake("fa", features=frozenset({"window", "softcap"}))
    store = RecordStore(tmp_path / "home")
    store.add_verify(VerifyRecord(device_key=CPU_KEY, backend="fa", backend_version="1", ok=True,
                                  summary="ok; not used for softcap", details={"failed_features": ["softcap"]}))
    q, k, v = _qkv()
    store.add_bench([r for feats in ((), ("window",), ("softcap",))
                     for r in faster_records(["fa"], q, k, features=feats)])
    use(runtime.Dispatcher({"fa": fa}, records=store))
    attnforge.attention(q, k, v, window=(2, 0))
    attnforge.attention(q, k, v)
    assert fa.calls == 2
    attnforge.attention(q, k, v, softcap=2.0)
    assert fa.calls == 2
    reasons = {r.backend: r.reasons for r in attnforge.explain(q, k, v, softcap=2.0).rejected}["fa"]
    assert any("verify failed for softcap" in r for r in reasons)


def test_a_call_carries_only_shape_class_features_and_the_routing_ones_apart(tmp_path: Path, use: Any) -> None:
    """``AttentionCall.features`` holds the names of types/shapes.py's Feature enum; Dv and the top-left
    alignment travel as ``head_dim_v`` and ``top_left`` (they are not part of a shape class)."""
    from attnforge.backends.adapter import FEATURES, ROUTING_ONLY, required_features

    shape_class_features = {"mask", "window", "softcap", "sinks", "varlen", "dropout", "lse", "paged"}
    assert set(FEATURES) == shape_class_features | ROUTING_ONLY
    d = use(_install(tmp_path, Fake("a")))
    q, k, _ = _qkv(sq=3, sk=6)
    call = d.describe(q, k, causal=True, precision="exact", needs_grad=False,
                      uses=frozenset({"mask", "dv", "causal_top_left"}), head_dim_v=4)
    assert call.features == {"mask"} and call.head_dim_v == 4 and call.top_left
    assert required_features(call) == {"mask", "dv", "causal_top_left"}
