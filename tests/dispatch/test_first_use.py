"""Measure on first use, by default on a GPU (issue 22): when it is on, what it times, how often, what it keeps.

The backends are fakes at the timing seam only: each returns the exact output and advances a fake clock by a
cost replayed from the H100 run of issue 22 (2026-11-25), so the decisions are those the real timings gave. The
record store is the real SQLite one, and persistence is checked across two real processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import attnforge
from attnforge.backends.adapter import FEATURES, AttentionCall
from attnforge.backends.exact import reference_attention
from attnforge.dispatch import autotune, runtime
from attnforge.records import BenchRecord, RecordStore, VerifyRecord, device_key
from tests._fakes import FakeClock

CPU_KEY = device_key("cpu", None, torch.__version__)
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Timed:
    """A verified backend at the timing seam: the exact output (plus ``noise``), each call advances ``clock`` by
    ``cost_ms``. ``features``/``quantized`` are its capabilities; ``dists`` the distributions it comes from."""

    name: str
    clock: FakeClock
    cost_ms: float
    features: frozenset[str] = frozenset()
    quantized: bool = False
    noise: float = 0.0
    dists: tuple[str, ...] = ()
    raises: bool = False
    calls: int = 0
    caps: Any = field(init=False)
    requirement: Any = field(init=False)

    def __post_init__(self) -> None:
        self.caps = SimpleNamespace(features=self.features, quantized=self.quantized, priority=10)
        self.requirement = SimpleNamespace(distributions=self.dists)

    def load_error(self) -> str | None:
        return None

    def unsupported_reasons(self, call: AttentionCall) -> list[str]:
        if self.quantized and call.precision != "allow_quantized":  # as Capabilities.unsupported_reasons says
            return ["quantizes Q/K/V: only with precision='allow_quantized'"]
        return []

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None, **features: Any) -> torch.Tensor:
        self.calls += 1
        self.clock.now += self.cost_ms / 1e3
        if self.raises:
            raise RuntimeError(f"{self.name}: no kernel image is available for execution on the device")
        out = reference_attention(q, k, v, causal=causal, scale=scale, **features).to(q.dtype)
        return out + self.noise * torch.randn_like(out) if self.noise else out


def _verified(store: RecordStore, *names: str) -> None:
    for name in names:
        store.add_verify(VerifyRecord(device_key=CPU_KEY, backend=name, backend_version=None, ok=True, summary="ok"))


def _use(store: RecordStore, fallback: Timed, *backends: Timed, exact_ms: float | None = None) -> runtime.Dispatcher:
    _verified(store, *(b.name for b in backends))
    d = runtime.Dispatcher({b.name: b for b in backends}, fallback=fallback, records=store)
    if exact_ms is not None:  # the exact math at the timing seam too (it serves every feature)
        d.exact = Timed("exact", fallback.clock, exact_ms, features=frozenset(FEATURES))
    runtime.set_dispatcher(d)
    return d


@pytest.fixture
def store(tmp_path: Path) -> Any:
    previous = runtime.set_dispatcher(None)
    yield RecordStore(tmp_path / "home")
    runtime.set_dispatcher(previous)


def _qkv(sq: int = 32, sk: int = 32, hq: int = 4, hkv: int = 2, d: int = 8) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    return (torch.randn(1, hq, sq, d, generator=g), torch.randn(1, hkv, sk, d, generator=g),
            torch.randn(1, hkv, sk, d, generator=g))


def test_on_by_default_on_cuda_only_and_the_variable_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(autotune.ENV, raising=False)
    assert autotune.active("cuda") is autotune.DEFAULT
    assert autotune.active("cpu") is None  # never on CPU unless asked
    with attnforge.autotune(budget_s=0.5) as config:
        assert autotune.active("cpu") is config
    monkeypatch.setenv(autotune.ENV, "1")
    assert autotune.active("cpu") is autotune.DEFAULT
    monkeypatch.setenv(autotune.ENV, "0")
    assert autotune.active("cuda") is None
    with attnforge.autotune(budget_s=0.5):
        assert autotune.active("cpu") is None  # the kill switch of a deploy beats code


def test_recorded_decode_case_keeps_sdpa_where_fa4_was_half_as_fast(store: RecordStore) -> None:
    """Issue 22: decode with GQA, FA4 4.4 vs SDPA 8.8 TFLOP/s called directly; bench had recorded the reverse."""
    clock = FakeClock()
    fa4, sdpa = Timed("fa4", clock, 8.8 / 4.4), Timed("sdpa", clock, 1.0)
    _use(store, sdpa, fa4)
    q, k, v = _qkv(sq=1, sk=64)
    with attnforge.autotune(budget_s=0.05, clock=clock, background=False):
        attnforge.attention(q, k, v, causal=True)
        served_before = sdpa.calls
        attnforge.attention(q, k, v, causal=True)
    assert sdpa.calls == served_before + 1
    assert attnforge.explain(q, k, v, causal=True).chosen == "sdpa"


def test_decode_with_a_growing_kv_cache_measures_one_class_per_power_of_two(store: RecordStore) -> None:
    clock = FakeClock()
    fast, sdpa = Timed("fast", clock, 1.0), Timed("sdpa", clock, 2.0)
    _use(store, sdpa, fast)
    q, k, v = _qkv(sq=1, sk=200)
    with attnforge.autotune(budget_s=0.02, rounds=2, clock=clock):
        for sk in range(1, 201):
            out = attnforge.attention(q, k[:, :, :sk], v[:, :, :sk])
    torch.testing.assert_close(out, reference_attention(q, k, v, causal=False, scale=None).float())
    runs = {r.run_id for r in store.bench_records(CPU_KEY)}
    assert len(runs) == 9  # Sk buckets 1, 2, 4, ..., 256: 200 lengths, 9 measurements


def test_nothing_is_timed_while_a_cuda_graph_captures(store: RecordStore, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    fast, sdpa = Timed("fast", clock, 1.0), Timed("sdpa", clock, 2.0)
    _use(store, sdpa, fast)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # a capture needs CUDA initialized
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    q, k, v = _qkv()
    with attnforge.autotune(budget_s=0.05, clock=clock):
        attnforge.attention(q, k, v)
    assert (fast.calls, sdpa.calls) == (0, 1)  # the recorded choice (none): plain SDPA, nothing timed
    assert store.bench_records(CPU_KEY) == []


def test_nothing_is_timed_while_torch_compile_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert autotune.capturing()


def test_a_measurement_of_another_installed_version_is_measured_again(store: RecordStore) -> None:
    import importlib.metadata

    clock = FakeClock()
    fast = Timed("fast", clock, 1.0, dists=("pytest",))
    sdpa = Timed("sdpa", clock, 2.0)
    q, k, v = _qkv()
    old = BenchRecord(device_key=CPU_KEY, backend="fast", backend_version="0.0.1", dtype="float32", mode="fwd",
                      causal=False, batch=1, heads_q=4, heads_kv=2, head_dim=8, seqlen_q=32, seqlen_k=32, ms=1.0,
                      tflops=1.0, peak_mem_bytes=None, run_id="old")
    store.add_bench([old])
    d = _use(store, sdpa, fast)
    assert d.versions() == {"fast": importlib.metadata.version("pytest")}
    with attnforge.autotune(budget_s=0.05, clock=clock):
        attnforge.attention(q, k, v)
    fresh = [r for r in store.bench_records(CPU_KEY) if r.run_id != "old"]
    assert {r.backend_version for r in fresh if r.backend == "fast"} == {importlib.metadata.version("pytest")}


@pytest.mark.slow
def test_the_measurement_persists_across_processes(store: RecordStore, cli_env: dict[str, str]) -> None:
    env = {**cli_env, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}

    def child() -> dict[str, int]:
        done = subprocess.run([sys.executable, "-m", "tests.dispatch._first_use_child"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120, check=True)
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    first, second = child(), child()
    assert first["fa4"] > 2 and first["sdpa"] > 2  # measured every candidate
    assert second == {"fa3": 1, "fa4": 0, "sdpa": 0}  # read back, served by the fastest, nothing timed


def test_a_featured_call_goes_to_the_fastest_verified_kernel_and_the_exact_math_last(store: RecordStore) -> None:
    """Issue 22's Gemma-2 call: softcap and a sliding window, which SDPA lacks, went to the exact math while a
    verified FlexAttention had both (7.09 ms vs 0.25 ms)."""
    clock = FakeClock()
    gemma = frozenset({"softcap", "window"})
    flex, fa3 = Timed("flex", clock, 0.25, features=gemma), Timed("fa3", clock, 0.2, features=gemma)
    sdpa = Timed("sdpa", clock, 0.1)
    _use(store, sdpa, flex, fa3, exact_ms=7.09)  # the H100's exact math on the real call (docs/benchmarks.md)
    q, k, v = _qkv(sq=64, sk=64)
    opts: dict[str, Any] = {"causal": True, "softcap": 50.0, "window": (15, 0)}
    unmeasured = attnforge.explain(q, k, v, **opts)
    assert unmeasured.order[-1] == "exact" and set(unmeasured.order[:-1]) == {"flex", "fa3"}
    with attnforge.autotune(budget_s=0.05, clock=clock):
        out = attnforge.attention(q, k, v, **opts)
    assert sdpa.calls == 0
    assert attnforge.explain(q, k, v, **opts).order == ("fa3", "flex", "exact")
    ref = reference_attention(q, k, v, causal=True, scale=None, softcap=50.0, window=(15, 0))
    torch.testing.assert_close(out.double(), ref)


@pytest.mark.parametrize(("noise", "chosen"), [(0.0, "sage"), (1.0, "sdpa")])
def test_a_quantized_kernel_is_measured_on_first_use_and_gated_by_its_error(store: RecordStore, noise: float,
                                                                            chosen: str) -> None:
    """Issue 22: SageAttention was correct and fastest at 16k, yet allow_quantized never used it (unmeasured)."""
    clock = FakeClock()
    sage, sdpa = Timed("sage", clock, 782 / 671 ** 2, quantized=True, noise=noise), Timed("sdpa", clock, 1.0)
    _use(store, sdpa, sage)
    q, k, v = _qkv(hq=2, hkv=2)
    assert attnforge.explain(q, k, v, precision="allow_quantized").chosen == "sdpa"
    with attnforge.autotune(budget_s=0.05, clock=clock):
        attnforge.attention(q, k, v, precision="allow_quantized")
    assert attnforge.explain(q, k, v, precision="allow_quantized").chosen == chosen
    assert attnforge.explain(q, k, v).chosen == "sdpa"  # never without allow_quantized


@pytest.mark.parametrize("precision", ["exact", "allow_quantized"])
def test_warmup_with_a_models_precision_times_its_quantized_candidates(store: RecordStore, precision: str) -> None:
    """``attnforge warmup --precision allow_quantized``: a model that calls ``attention(precision="allow_quantized")``
    gets its quantized classes compiled and timed ahead, SageAttention among the candidates; an exact warm-up never
    calls it, so the model's first quantized call paid its first use (0.96-1.81 s on an H200, 2026-12-03)."""
    from attnforge.dispatch.warmup import warmup
    from attnforge.types.shapes import AttentionShape, Mode

    clock = FakeClock()
    sage, sdpa = Timed("sage", clock, 0.5, quantized=True), Timed("sdpa", clock, 1.0)
    _use(store, sdpa, sage)
    shape = AttentionShape(batch=1, heads_q=2, heads_kv=2, head_dim=8, seqlen_q=32, seqlen_k=32, causal=False,
                           mode=Mode.FWD, dtype="float32")
    report = warmup([shape], device="cpu", budget_s=0.02, rounds=1, precision=precision)
    assert [c.error for c in report.classes] == [""]
    timed = {r.backend for r in store.bench_records(CPU_KEY)}
    if precision == "exact":
        assert sage.calls == 0 and "sage" not in timed  # its class's first quantized call would time it
    else:  # timed on the real clock, where both fakes cost alike: which one wins is not asserted
        assert sage.calls > 1 and {"sage", "sdpa"} <= timed
    q, k, v = _qkv(hq=2, hkv=2)
    assert attnforge.explain(q, k, v).chosen == "sdpa"  # an exact call never gets it


def test_plain_sdpa_raising_is_one_rule_with_the_featured_path(store: RecordStore) -> None:
    clock = FakeClock()
    sdpa = Timed("sdpa", clock, 1.0, raises=True)
    _use(store, sdpa)
    q, k, v = _qkv()
    with pytest.warns(RuntimeWarning, match="'sdpa' raised"):
        out = attnforge.attention(q, k, v)
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, causal=False, scale=None), atol=1e-5,
                               rtol=1e-5)
    again = attnforge.attention(q, k, v)  # disabled for the class: no second warning, the exact math serves
    torch.testing.assert_close(again, out)


def test_a_featured_call_keeps_the_exact_math_where_the_only_kernel_is_slower(store: RecordStore) -> None:
    """Where SDPA lacks a feature, the exact math is the baseline a kernel must beat, as plain SDPA is for plain
    calls: a verified kernel measured slower than it does not take the call."""
    clock = FakeClock()
    slow = Timed("slow-softcap", clock, 9.0, features=frozenset({"softcap"}))
    _use(store, Timed("sdpa", clock, 0.1), slow, exact_ms=3.0)
    q, k, v = _qkv()
    assert attnforge.explain(q, k, v, softcap=20.0).order == ("slow-softcap", "exact")  # unmeasured
    with attnforge.autotune(budget_s=0.05, clock=clock):
        attnforge.attention(q, k, v, softcap=20.0)
    assert attnforge.explain(q, k, v, softcap=20.0).order == ("exact", "slow-softcap")
    fast = Timed("fast-softcap", clock, 1.0, features=frozenset({"softcap"}))
    _use(store, Timed("sdpa", clock, 0.1), fast, exact_ms=3.0)
    with attnforge.autotune(budget_s=0.05, clock=clock):
        attnforge.attention(q, k, v, softcap=20.0)
    assert attnforge.explain(q, k, v, softcap=20.0).order == ("fast-softcap", "exact")


@dataclass
class StrideTimed(Timed):
    """A :class:`Timed` whose cost depends on the memory layout of the K it receives as ``[B, H, S, D]``:
    ``bshd_ms`` when K is sequence-outer (a ``[B, S, H, D]`` tensor's transposed view), ``cost_ms`` otherwise."""

    bshd_ms: float = 0.0

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> torch.Tensor:
        if k.stride(2) > k.stride(1):
            self.clock.now += (self.bshd_ms - self.cost_ms) / 1e3
        return super().__call__(q, k, v, **kw)


def test_each_memory_layout_is_measured_and_decided_on_its_own(store: RecordStore) -> None:
    """A kernel that loses on ``[B, H, S, D]`` tensors and wins on ``[B, S, H, D]`` ones (FA3 on MHA 1k fwd+bwd, H200,
    2026-11-29: 0.960x and 1.080x SDPA) serves only the layout it wins in: a warm-up (``layouts=True``) measures
    both, first use measures neither twice, and a bhsd call on ``[B, S, H, D]`` memory (transformers' transposed
    views) reads the ``[B, S, H, D]`` measurements."""
    clock = FakeClock()
    fa3, sdpa = StrideTimed("fa3", clock, 1.2, bshd_ms=0.8), Timed("sdpa", clock, 1.0)
    _use(store, sdpa, fa3)
    q, k, v = _qkv(sq=64, sk=64, hq=4, hkv=4)
    qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    reference = reference_attention(q, k, v, causal=True, scale=None)
    with attnforge.autotune(budget_s=0.05, clock=clock, rounds=3):  # first use: one measurement, in the first layout
        attnforge.attention(q, k, v, causal=True)
        out = attnforge.attention(qs, ks, vs, causal=True, layout="bshd")
    torch.testing.assert_close(out.transpose(1, 2), reference.to(out.dtype))
    assert {r.layout for r in store.bench_records(CPU_KEY)} == {"bhsd"}
    borrowed = attnforge.explain(qs, ks, vs, causal=True, layout="bshd")
    assert borrowed.chosen == "sdpa" and "none on this call's [B, S, H, D]" in borrowed.basis[0]
    with attnforge.autotune(budget_s=0.05, clock=clock, rounds=3, layouts=True):  # attnforge warmup's setting
        attnforge.attention(q, k, v, causal=True)
        attnforge.attention(qs, ks, vs, causal=True, layout="bshd")
    assert {r.layout for r in store.bench_records(CPU_KEY)} == {"bhsd", "bshd"}
    assert attnforge.explain(q, k, v, causal=True).chosen == "sdpa"
    assert attnforge.explain(qs, ks, vs, causal=True, layout="bshd").chosen == "fa3"
    views = tuple(t.transpose(1, 2) for t in (qs, ks, vs))  # declared [B, H, S, D], laid out [B, S, H, D]
    assert attnforge.explain(*views, causal=True).chosen == "fa3"
    assert "K laid out [B, S, H, D]" in str(attnforge.explain(*views, causal=True))
    assert "laid out" not in str(attnforge.explain(q, k, v, causal=True))
    runtime.set_dispatcher(runtime.Dispatcher({"fa3": fa3}, fallback=sdpa, records=store))  # another process
    before = fa3.calls
    q2, k2, v2 = (torch.cat([t, t]) for t in (q, k, v))  # another batch: a route is kept per signature, not strides
    with attnforge.autotune(budget_s=0.05, clock=clock, rounds=3, layouts=True):
        out = attnforge.attention(*views, causal=True)
        attnforge.attention(q2, k2, v2, causal=True)
    assert fa3.calls == before + 1  # read back per layout: nothing timed, fa3 served the bshd-memory call only
    torch.testing.assert_close(out, reference.to(out.dtype))


class _CountingStore(RecordStore):
    """The real store, counting its reads of the bench records (the seam a re-read goes through)."""

    reads = 0

    def bench_records(self, device_key: str) -> list[BenchRecord]:
        self.reads += 1
        return super().bench_records(device_key)


def test_a_measurement_is_handed_to_the_dispatcher_not_read_back(tmp_path: Path) -> None:
    """After a first-use measurement the dispatcher keeps the new records with those it read: the store is read
    once per process, not again after each measurement (a re-read of 4622 records cost the next call 69-80 ms on a
    CPU host, 2026-11-29), and the decisions that follow read the new measurements."""
    previous = runtime.set_dispatcher(None)
    try:
        store = _CountingStore(tmp_path / "home")
        store.add_bench([BenchRecord(device_key=CPU_KEY, backend="sdpa", backend_version=None, dtype="float32",
                                     mode="fwd", causal=False, batch=1, heads_q=4, heads_kv=2, head_dim=16,
                                     seqlen_q=32, seqlen_k=32, ms=1.0, tflops=1.0, peak_mem_bytes=None,
                                     run_id="bench-old")])
        clock = FakeClock()
        fast, sdpa = Timed("fast", clock, 1.0), Timed("sdpa", clock, 2.0)
        _use(store, sdpa, fast)
        q, k, v = _qkv()
        with attnforge.autotune(budget_s=0.05, rounds=2, clock=clock):
            for sq in (32, 64, 128):  # three classes, each measured on its first call
                qs = torch.cat([q] * (sq // 32), dim=2)
                attnforge.attention(qs, k, v)
                assert attnforge.explain(qs, k, v).chosen == "fast"
        runs = {r.run_id for r in store.bench_records(CPU_KEY)} - {"bench-old"}
        assert len(runs) == 3 and store.reads == 2  # one read by the dispatcher, one by this test
        assert attnforge.explain(q, k, v).chosen == "fast"  # the dispatcher's own copy has the measurement
    finally:
        runtime.set_dispatcher(previous)
