"""Measure on first use: the first call of an unmeasured class times the verified candidates on its tensors,
stores the result for this device, later calls reuse it, and the returned output never changes."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import attnforge
from attnforge.backends.exact import reference_attention
from attnforge.dispatch import autotune, runtime
from attnforge.records import RecordStore, VerifyRecord, device_key
from tests._fakes import FakeClock, ReadyAdapter

CPU_KEY = device_key("cpu", None, torch.__version__)


@dataclass
class Timed(ReadyAdapter):
    """A verified backend at the seam: exact output, each call advances the fake clock by ``cost_ms``."""

    name: str
    clock: FakeClock
    cost_ms: float
    calls: int = 0
    grads_seen: list[bool] = field(default_factory=list)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None) -> torch.Tensor:
        self.calls += 1
        self.clock.now += self.cost_ms / 1e3
        return reference_attention(q, k, v, causal=causal, scale=scale).to(q.dtype)


@pytest.fixture
def store(tmp_path: Path) -> RecordStore:
    s = RecordStore(tmp_path / "home")
    for name in ("slow", "fast"):
        s.add_verify(VerifyRecord(device_key=CPU_KEY, backend=name, backend_version="1", ok=True, summary="ok"))
    return s


@pytest.fixture
def setup(store: RecordStore) -> Iterator[tuple[FakeClock, Timed, Timed, Timed]]:
    clock = FakeClock()
    slow, fast, sdpa = Timed("slow", clock, 5.0), Timed("fast", clock, 1.0), Timed("sdpa", clock, 3.0)
    d = runtime.Dispatcher({"slow": slow, "fast": fast}, fallback=sdpa, priorities={"slow": 1, "fast": 2},
                           records=store)
    previous = runtime.set_dispatcher(d)
    yield clock, slow, fast, sdpa
    runtime.set_dispatcher(previous)


def _qkv(grad: bool = False) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(3)
    return tuple(torch.randn(1, h, 16, 8, generator=g).requires_grad_(grad) for h in (4, 2, 2))


def test_first_call_measures_stores_and_later_calls_reuse(store: RecordStore, setup: Any) -> None:
    clock, slow, fast, sdpa = setup
    q, k, v = _qkv()
    assert attnforge.explain(q, k, v).chosen == "sdpa"  # unmeasured: plain SDPA leads
    with attnforge.autotune(budget_s=0.05, rounds=2, clock=clock, background=False):
        out = attnforge.attention(q, k, v)
        timed = (slow.calls, fast.calls, sdpa.calls)
        again = attnforge.attention(q, k, v)
    assert min(timed) > 2  # every verified candidate (and plain SDPA) was timed on the first call
    assert (slow.calls, fast.calls, sdpa.calls) == (timed[0], timed[1] + 1, timed[2])  # reused, served by fast
    torch.testing.assert_close(out, reference_attention(q, k, v, causal=False, scale=None).float())
    torch.testing.assert_close(again, out)
    records = store.bench_records(CPU_KEY)
    assert {r.backend for r in records} == {"slow", "fast", "sdpa"}
    assert all(r.run_id.startswith("autotune-") and r.ms_lo is not None for r in records)
    assert attnforge.explain(q, k, v).chosen == "fast"  # persisted: outside the context too
    # a fresh process (dispatcher) reads the stored result without measuring again
    fresh = runtime.Dispatcher({"slow": slow, "fast": fast}, fallback=sdpa, records=store)
    runtime.set_dispatcher(fresh)
    with attnforge.autotune(budget_s=0.05, clock=clock):
        before = slow.calls
        attnforge.attention(q, k, v)
    assert slow.calls == before


def test_backward_is_timed_on_copies_and_leaves_the_callers_grads_alone(setup: Any) -> None:
    clock, *_ = setup
    q, k, v = _qkv(grad=True)
    with attnforge.autotune(budget_s=0.02, rounds=1, clock=clock):
        out = attnforge.attention(q, k, v)
    assert q.grad is None and k.grad is None and v.grad is None
    out.sum().backward()
    ref = reference_attention(q.detach(), k.detach(), v.detach(), causal=False, scale=None)
    torch.testing.assert_close(out.detach().double(), ref)
    assert q.grad is not None


def test_env_variable_turns_it_on_and_off_means_no_timing(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _clock, slow, fast, sdpa = setup
    q, k, v = _qkv()
    attnforge.attention(q, k, v)
    assert (slow.calls, fast.calls, sdpa.calls) == (0, 0, 1)  # off by default: the policy's choice, nothing timed
    monkeypatch.setenv("ATTNFORGE_AUTOTUNE", "1")
    runtime.get_dispatcher().routes.clear()
    q2, k2, v2 = (t[..., :8, :] for t in _qkv())  # another class (Sq 8): decided afresh, so measured now
    attnforge.attention(q2, k2, v2)
    assert autotune.background_wait(timeout_s=30)  # measured off the calling thread (the default)
    assert fast.calls > 1


@dataclass
class Compiled(Timed):
    """A verified backend whose kernel compiles on its first call per variant (FlashAttention-4's CuTe DSL
    kernels): the first call costs ``compile_ms`` more."""

    compile_ms: float = 8000.0
    caps: Any = field(default_factory=lambda: SimpleNamespace(jit_per_variant=True))

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None) -> torch.Tensor:
        if not self.calls:
            self.clock.now += self.compile_ms / 1e3
        return super().__call__(q, k, v, causal=causal, scale=scale)


def test_first_use_leaves_out_a_kernel_that_compiles_on_its_first_call(store: RecordStore) -> None:
    """Measure-on-first-use times the candidates that run at once and leaves a per-variant JIT kernel out (its
    compile would stall the call for seconds: 8.4-13.8 s on an H200 with FlashAttention-4, 2026-11-28), so that
    kernel does not serve the class and explain() says how to time it; with ``compiling`` (``attnforge warmup``)
    it is timed, its compile untimed, and chosen where fastest."""
    clock = FakeClock()
    jit, slow, sdpa = Compiled("jit", clock, 0.5), Timed("slow", clock, 5.0), Timed("sdpa", clock, 3.0)
    store.add_verify(VerifyRecord(device_key=CPU_KEY, backend="jit", backend_version="1", ok=True, summary="ok"))
    previous = runtime.set_dispatcher(runtime.Dispatcher({"jit": jit, "slow": slow}, fallback=sdpa, records=store))
    try:
        q, k, v = _qkv()
        with attnforge.autotune(budget_s=0.05, rounds=2, clock=clock, background=False):
            start = clock.now
            attnforge.attention(q, k, v)
        assert jit.calls == 0 and slow.calls > 2  # first use timed the others, never the compiling one
        assert clock.now - start < 1.0  # no compile inside the call
        explained = attnforge.explain(q, k, v)
        assert explained.chosen == "sdpa"
        line = explained.basis[explained.order.index("jit")]
        assert "first use does not time it" in line and "attnforge warmup" in line
        with attnforge.autotune(budget_s=0.05, rounds=2, clock=clock, background=False, compiling=True):
            attnforge.attention(*_qkv())  # a deploy step's call: the class is measured again, jit with it
        assert jit.calls > 2
        assert attnforge.explain(q, k, v).chosen == "jit"
        assert {r.backend for r in store.bench_records(CPU_KEY)} == {"jit", "slow", "sdpa"}
    finally:
        runtime.set_dispatcher(previous)


def test_warmup_times_kernels_that_compile_on_their_first_call(store: RecordStore) -> None:
    """``attnforge warmup`` (the library call the CLI runs) is where a per-variant JIT kernel is compiled and
    timed (on the real clock: both fakes cost the same there, so which one wins is not asserted)."""
    from attnforge.dispatch.warmup import warmup
    from attnforge.types.shapes import AttentionShape, Mode

    clock = FakeClock()
    jit, sdpa = Compiled("jit", clock, 0.5, compile_ms=1.0), Timed("sdpa", clock, 3.0)
    store.add_verify(VerifyRecord(device_key=CPU_KEY, backend="jit", backend_version="1", ok=True, summary="ok"))
    previous = runtime.set_dispatcher(runtime.Dispatcher({"jit": jit}, fallback=sdpa, records=store))
    try:
        shape = AttentionShape(batch=1, heads_q=4, heads_kv=2, head_dim=8, seqlen_q=16, seqlen_k=16, causal=False,
                               mode=Mode.FWD, dtype="float32")
        report = warmup([shape], device="cpu", budget_s=0.02, rounds=1)
        assert jit.calls > 1 and report.measuring and not report.classes[0].error
        assert "jit" in {r.backend for r in store.bench_records(CPU_KEY)}
    finally:
        runtime.set_dispatcher(previous)


@dataclass
class Strided(Timed):
    """:class:`Timed` that keeps the strides of every q it is called with."""

    strides: list[tuple[int, ...]] = field(default_factory=list)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None) -> torch.Tensor:
        self.strides.append(tuple(q.stride()))
        return super().__call__(q, k, v, causal=causal, scale=scale)


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_warmup_calls_each_shape_in_its_layout(store: RecordStore, mode: str) -> None:
    """A shape laid out ``[B, S, H, D]`` (``layout=BSHD``) is warmed on tensors of that layout, which reach the
    kernels at those strides (a kernel builds per strides: cuDNN's graph), and a ``[B, H, S, D]`` one on its own;
    the report names the class either way."""
    import dataclasses

    from attnforge.dispatch.warmup import warmup
    from attnforge.types.shapes import AttentionShape, Layout, Mode

    clock = FakeClock()
    fast, sdpa = Strided("fast", clock, 1.0), Strided("sdpa", clock, 3.0)
    previous = runtime.set_dispatcher(runtime.Dispatcher({"fast": fast}, fallback=sdpa, records=store))
    try:
        b, h, s, d = 1, 4, 16, 8
        shape = AttentionShape(batch=b, heads_q=h, heads_kv=h, head_dim=d, seqlen_q=s, seqlen_k=s, causal=True,
                               mode=Mode.FWD_BWD if mode == "fwd+bwd" else Mode.FWD, dtype="float32")
        report = warmup([shape, dataclasses.replace(shape, layout=Layout.BSHD)], device="cpu", budget_s=0.02,
                        rounds=1)
        assert [c.error for c in report.classes] == ["", ""] and all(c.chosen for c in report.classes)
        seen = set(fast.strides + sdpa.strides)
        assert (s * h * d, s * d, d, 1) in seen  # [B, H, S, D] memory
        assert (s * h * d, d, h * d, 1) in seen  # [B, S, H, D] memory, viewed [B, H, S, D]
    finally:
        runtime.set_dispatcher(previous)


def test_warmup_inside_inference_mode_warms_fwd_bwd_classes_too(store: RecordStore) -> None:
    """A server's start-up may call ``attnforge.warmup`` inside ``torch.inference_mode``: its own tensors still record
    the backward of a fwd+bwd shape (there a backward recorded nothing and every fwd+bwd class failed), and a
    forward shape is warmed as outside."""
    import dataclasses

    from attnforge.dispatch.warmup import warmup
    from attnforge.types.shapes import AttentionShape, Mode

    clock = FakeClock()
    fast, sdpa = Strided("fast", clock, 1.0), Strided("sdpa", clock, 3.0)
    previous = runtime.set_dispatcher(runtime.Dispatcher({"fast": fast}, fallback=sdpa, records=store))
    try:
        shape = AttentionShape(batch=1, heads_q=4, heads_kv=4, head_dim=8, seqlen_q=16, seqlen_k=16, causal=True,
                               mode=Mode.FWD_BWD, dtype="float32")
        with torch.inference_mode():
            report = warmup([shape, dataclasses.replace(shape, mode=Mode.FWD)], device="cpu",
                            budget_s=0.02, rounds=1)
            assert torch.is_inference_mode_enabled()  # the caller's mode is back
        assert [c.error for c in report.classes] == ["", ""] and all(c.chosen for c in report.classes)
    finally:
        runtime.set_dispatcher(previous)


def test_warmup_calls_a_long_causal_prefill_as_a_padded_prefills_varlen_call_too(
        store: RecordStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``padded_prefill_from`` (the transformers integration's varlen threshold), a causal forward shape that
    long is also called as a left-padded prefill's varlen call (packed ``[B * S, H, D]``, a run of padding and one
    of real tokens per row, causal), so the first padded prompt of a deployment compiles nothing; shorter shapes,
    fwd+bwd shapes and a warm-up without it make no such call. The varlen call's output is the exact math's."""
    from attnforge.backends.exact import reference_attention
    from attnforge.dispatch.warmup import warmup
    from attnforge.types.shapes import AttentionShape, Layout, Mode

    calls: list[dict[str, Any]] = []
    original = runtime.attention

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> Any:
        out = original(q, k, v, **kw)
        calls.append({"q": q, "k": k, "v": v, "out": out, **kw})
        return out

    monkeypatch.setattr(runtime, "attention", spy)
    b, h, s, d = 2, 4, 32, 8
    long = AttentionShape(batch=b, heads_q=h, heads_kv=2, head_dim=d, seqlen_q=s, seqlen_k=s, causal=True,
                          mode=Mode.FWD, dtype="float32")
    short = AttentionShape(batch=b, heads_q=h, heads_kv=2, head_dim=d, seqlen_q=8, seqlen_k=8, causal=True,
                           mode=Mode.FWD, dtype="float32")
    import dataclasses

    trained = dataclasses.replace(long, mode=Mode.FWD_BWD)
    both = dataclasses.replace(long, layout=Layout.BSHD)  # packed calls have no layout: warmed once
    report = warmup([long, short, trained, both], device="cpu", budget_s=0.02, rounds=1, padded_prefill_from=16)
    assert [c.features for c in report.classes] == [(), ("varlen",), (), (), ()]
    assert not any(c.error for c in report.classes) and report.classes[1].chosen
    (packed,) = [c for c in calls if c.get("cu_seqlens_q") is not None]
    assert packed["q"].shape == (b * s, h, d) and packed["causal"] is True
    assert packed["cu_seqlens_q"].tolist() == [0, 4, 32, 36, 64] and packed["max_seqlen_q"] == 28
    for lo, hi in zip([0, 4, 32, 36], [4, 32, 36, 64], strict=True):  # each run its own causal sequence
        run = (t[lo:hi].transpose(0, 1)[None] for t in (packed["q"], packed["k"], packed["v"]))
        want = reference_attention(*run, causal=True)
        torch.testing.assert_close(packed["out"][lo:hi], want[0].transpose(0, 1).to(packed["out"].dtype))
    calls.clear()
    warmup([long], device="cpu", budget_s=0.02, rounds=1)
    assert not [c for c in calls if c.get("cu_seqlens_q") is not None]


def test_warmup_asks_the_mask_kernels_question_for_each_dtype_and_head_dims(
        store: RecordStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """``attnforge warmup`` asks what the SDPA adapter would ask at a masked call's first use (whether SDPA's kernels
    zero the rows that see no key: three probe calls, a cuDNN graph build among them) once per dtype, head dims and
    mode of its shapes (a forward-and-backward shape asks with gradients), so a padded batch's first call pays none
    of it. The seam: CPU's math op as the device's one mask kernel."""
    import dataclasses

    from attnforge.backends import sdpa as sdpa_module
    from attnforge.dispatch.warmup import warmup
    from attnforge.types.shapes import AttentionShape, Mode

    monkeypatch.setattr(sdpa_module, "_MASK_KERNELS", {"cpu": ("MATH",)})
    sdpa_module._zeroing_kernels.cache_clear()
    try:
        shape = AttentionShape(batch=1, heads_q=4, heads_kv=4, head_dim=8, seqlen_q=16, seqlen_k=16, causal=True,
                               mode=Mode.FWD, dtype="float32")
        warmup([shape, dataclasses.replace(shape, seqlen_q=32, seqlen_k=32), dataclasses.replace(shape, head_dim=16),
                dataclasses.replace(shape, mode=Mode.FWD_BWD)], device="cpu", budget_s=0.02, rounds=1)
        info = sdpa_module._zeroing_kernels.cache_info()
        assert (info.misses, info.currsize) == (3, 3)  # D8 and D16 in float32, and D8 with gradients, once each
        assert sdpa_module._zeroing_kernels(torch.device("cpu"), torch.float32, 16, 16, False) == frozenset({"MATH"})
        assert sdpa_module._zeroing_kernels(torch.device("cpu"), torch.float32, 8, 8, True) == frozenset({"MATH"})
        assert sdpa_module._zeroing_kernels.cache_info().misses == 3
    finally:
        sdpa_module._zeroing_kernels.cache_clear()


def test_the_timed_work_is_waited_for_on_the_tensors_device() -> None:
    """A call on ``cuda:1`` timed from a thread whose current device is ``cuda:0`` waits for ``cuda:1``, and its CUDA
    marks are recorded there (no GPU needed: nothing is called)."""
    from attnforge.bench.timing import HostMarks, marks_for

    sync = autotune.device_sync(torch.device("cuda", 1))
    assert sync.func is torch.cuda.synchronize and sync.args == (torch.device("cuda", 1),)  # type: ignore[attr-defined]
    assert marks_for(torch.device("cuda", 1)).device == torch.device("cuda", 1)  # type: ignore[attr-defined]
    assert autotune.device_sync(torch.device("cpu"))() is None
    assert isinstance(marks_for(torch.device("cpu")), HostMarks)


def test_first_use_takes_the_drift_common_to_a_rounds_candidates_out_of_the_noise(
        store: RecordStore, setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole round running slow (the GPU's clock, a neighbour) moves every candidate in it alike: it must not
    hide a lead. On an H200 (docs/benchmarks.md "twenty-seventh session") warm-up read SDPA's rounds 600-642
    TFLOP/s (noise 2.7 %) at 8k keys, and the margin that noise gave swallowed FA3's 5 % lead. Here every
    candidate's round r runs ``drift[r]`` times its cost (at the timer, the seam): the raw rounds' noise (6 %)
    would tie ``fast`` (5 % ahead) with SDPA; without the common drift it wins."""
    from attnforge.bench import timing as timing_mod

    clock, slow, fast, sdpa = setup
    slow.cost_ms, fast.cost_ms, sdpa.cost_ms = 5.0, 2.85, 3.0
    drift = (1.0, 1.12, 0.94, 1.10, 0.96)
    real_measure = timing_mod.measure
    seen: dict[int, int] = {}

    def drifting(step: Any, **kw: Any) -> Any:
        t = real_measure(step, **kw)
        r = seen[id(step)] = seen.get(id(step), -1) + 1
        f = drift[r]
        return dataclasses.replace(t, median_ms=t.median_ms * f, min_ms=t.min_ms * f, p20_ms=t.p20_ms * f,
                                   p80_ms=t.p80_ms * f, rounds_ms=tuple(x * f for x in t.rounds_ms))

    monkeypatch.setattr(timing_mod, "measure", drifting)
    q, k, v = _qkv()
    with attnforge.autotune(budget_s=0.5, rounds=len(drift), clock=clock, background=False):
        attnforge.attention(q, k, v)
    assert set(seen.values()) == {len(drift) - 1}  # every candidate timed in every round
    records = {r.backend: r for r in store.bench_records(CPU_KEY)}
    raw = timing_mod.Timing(median_ms=1.0, min_ms=1.0, p20_ms=1.0, p80_ms=1.0, reps=1, warmup_calls=0,
                            first_call_s=0.0, input_sets=1, method=timing_mod.TimerMethod.HELD, rounds_ms=drift)
    assert raw.mad_ms == pytest.approx(0.06)  # what each record's noise would read with the drift left in
    assert all(r.ms_mad is not None and r.ms_mad / r.ms < 1e-6 for r in records.values())
    assert (records["slow"].ms_hi, records["slow"].ms_lo) == pytest.approx((5.0 * 1.12, 5.0 * 0.94))  # as measured
    assert attnforge.explain(q, k, v).chosen == "fast"


@pytest.mark.parametrize("case", [(False, None, False), (False, 10, True), (True, None, True), (True, 0, False)],
                         ids=["in-call", "in-call-10", "background", "background-0"])
def test_a_contested_class_gets_more_rounds_and_they_settle_it(
        store: RecordStore, setup: Any, monkeypatch: pytest.MonkeyPatch, case: tuple[bool, int | None, bool]) -> None:
    """Five rounds in which SDPA alone wanders (±15 %, its own noise, not a round's common drift) tie it with a
    candidate steady 5 % ahead, and the tie goes to SDPA: the class is contested (:func:`attnforge.ranking.contested`).
    With ``contested_rounds`` every candidate is timed in further rounds, where SDPA is steady; its noise then reads
    ~0 and the lead beats it. On an H200 (docs/benchmarks.md "thirtieth session") five warm-up rounds tied SDPA
    (noise 4.6-6.1 %) with FA3 7-12 % ahead on Flux's and the 16k forward; fifteen chose FA3. By default a class
    measured off the calling thread gets them (no call waits for them) and one measured inside its first call does
    not; the dispatcher names the classes it timed again (:func:`attnforge.dispatch.autotune.timed_again`)."""
    from attnforge.bench import timing as timing_mod

    background, contested_rounds, further = case  # off the calling thread; the rounds asked; timed again
    clock, slow, fast, sdpa = setup
    slow.cost_ms, fast.cost_ms, sdpa.cost_ms = 5.0, 2.85, 3.0
    wander = (1.0, 1.18, 0.85, 1.15, 0.88)  # SDPA's first five rounds; steady after them
    real_measure = timing_mod.measure
    rounds_of: dict[str, int] = {}

    def measured(step: Any, **kw: Any) -> Any:
        before = {a.name: a.calls for a in (slow, fast, sdpa)}
        t = real_measure(step, **kw)
        (name,) = [a.name for a in (slow, fast, sdpa) if a.calls != before[a.name]]
        r = rounds_of[name] = rounds_of.get(name, 0) + 1
        f = wander[r - 1] if name == "sdpa" and r <= len(wander) else 1.0
        return dataclasses.replace(t, median_ms=t.median_ms * f, min_ms=t.min_ms * f, p20_ms=t.p20_ms * f,
                                   p80_ms=t.p80_ms * f, rounds_ms=tuple(x * f for x in t.rounds_ms))

    monkeypatch.setattr(timing_mod, "measure", measured)
    q, k, v = _qkv()
    with attnforge.autotune(  # noqa: SIM117 - quiet() must end before autotune() waits for the worker
            budget_s=0.5, rounds=len(wander), clock=clock, background=background,
            contested_rounds=contested_rounds) as config:
        # the worker waits for this call (its provisional SDPA call would otherwise overlap the worker's first
        # measurement: the spy above counts calls and the fake clock across threads; flaky under load, 2026-12-02)
        with autotune.quiet():
            attnforge.attention(q, k, v)
    assert autotune.background_wait(timeout_s=30)
    explained = attnforge.explain(q, k, v)
    chosen = explained.chosen
    again = autotune.timed_again(runtime.get_dispatcher())
    # each record keeps how many rounds it was taken over: the ranking's margin narrows with them
    # (attnforge.ranking.rounds_factor)
    stored = {r.backend: r.rounds for r in store.bench_records(CPU_KEY) if r.backend in rounds_of}
    assert stored and stored == {n: rounds_of[n] for n in stored}
    if not further:
        assert config.contested_rounds == 0 and set(rounds_of.values()) == {len(wander)}
        assert chosen == "sdpa" and not again  # tied: the lower-overhead path
        return
    assert config.contested_rounds == (autotune.CONTESTED_ROUNDS if contested_rounds is None else contested_rounds)
    assert len(set(rounds_of.values())) == 1 and rounds_of["sdpa"] > len(wander) + 3  # every candidate, more rounds
    assert chosen == "fast"
    assert [(key[1], key[3], n) for key, n in again.items()] == [(explained.shape_class, "bhsd", 1)]  # this class


def test_the_background_default_times_a_contested_class_again() -> None:
    """``ATTNFORGE_AUTOTUNE=background``'s configuration (no call waits for a measurement) gets the warm-up's further
    rounds; measure-on-first-use inside a call keeps none."""
    assert autotune.DEFAULT_BACKGROUND.contested_rounds == autotune.CONTESTED_ROUNDS > 0
    assert autotune.DEFAULT.contested_rounds == 0


def test_warmup_measures_a_contested_class_further(store: RecordStore, setup: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``attnforge warmup`` (a deploy step) is where a contested class gets its further rounds
    (:data:`attnforge.dispatch.autotune.CONTESTED_ROUNDS`); measure-on-first-use inside a call does not."""
    from attnforge.dispatch.autotune import CONTESTED_ROUNDS
    from attnforge.dispatch.warmup import warmup
    from attnforge.types.shapes import AttentionShape, Mode

    seen: list[int] = []
    real_tune = autotune.tune

    def tune(*args: Any, **kw: Any) -> Any:
        seen.append(kw["config"].contested_rounds)
        return real_tune(*args, **kw)

    monkeypatch.setattr(autotune, "tune", tune)
    shape = AttentionShape(batch=1, heads_q=4, heads_kv=2, head_dim=8, seqlen_q=16, seqlen_k=16, causal=False,
                           mode=Mode.FWD, dtype="float32")
    warmup([shape], device="cpu", budget_s=0.02, rounds=1)
    assert seen and set(seen) == {CONTESTED_ROUNDS} and CONTESTED_ROUNDS > 0
    seen.clear()
    q, k, v = (torch.randn(1, h, 64, 8) for h in (4, 2, 2))  # a class the warm-up did not measure
    with attnforge.autotune(budget_s=0.02, rounds=1, background=False):
        attnforge.attention(q, k, v)
    assert seen == [0]


def test_warmup_says_which_classes_it_timed_again(store: RecordStore, setup: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Each warmed class says whether its first rounds left it contested and it was timed again
    (``WarmedClass.timed_again``; ``attnforge warmup`` prints it beside the reason): the seam is the contest's
    verdict (:func:`attnforge.dispatch.autotune._contested`, tested above on recorded timings), here true for causal
    classes only."""
    import dataclasses

    from attnforge.dispatch.warmup import warmup
    from attnforge.types.shapes import AttentionShape, Mode

    monkeypatch.setattr(autotune, "_contested", lambda _timings, call: bool(call.causal))
    shape = AttentionShape(batch=1, heads_q=4, heads_kv=2, head_dim=8, seqlen_q=16, seqlen_k=16, causal=True,
                           mode=Mode.FWD, dtype="float32")
    # the contested class first: a later class is not reported for what an earlier one was timed again for
    report = warmup([shape, dataclasses.replace(shape, causal=False)], device="cpu", budget_s=0.02, rounds=1)
    assert [(c.shape.causal, c.timed_again, c.error) for c in report.classes] == [(True, True, ""), (False, False, "")]
    # nor for a class the worker thread times again meanwhile (ATTNFORGE_AUTOTUNE=background): here, an entry that
    # appears between the warm call's two readings
    readings = iter([{}, {("cpu", "another class", "exact", "bhsd"): 1}])
    monkeypatch.setattr(autotune, "timed_again", lambda dispatcher: next(readings))
    report = warmup([dataclasses.replace(shape, causal=False, seqlen_q=64, seqlen_k=64)], device="cpu",
                    budget_s=0.02, rounds=1)
    assert [c.timed_again for c in report.classes] == [False]


def test_contested_is_a_tie_given_away_over_more_than_the_floor() -> None:
    """The recorded Flux-length forward (H200 warm-up, 2026-11-30): SDPA won a tie it trailed by 6 % (contested);
    a tie within the 2 % floor, a clear win, and a tie the top wins itself are not contested."""
    from attnforge.ranking import Measurement, contested, rank

    def m(name: str, tflops: float, lo: float, hi: float, noise: float) -> Measurement:
        return Measurement(backend=name, tflops=tflops, tflops_lo=lo, tflops_hi=hi, noise=noise)

    flux = [m("sdpa", 610.0, 551.3, 647.4, 0.061), m("flash-attn-3", 647.6, 632.5, 656.9, 0.008),
            m("flash-attn-4", 634.6, 632.5, 646.9, 0.0)]
    assert rank(flux).winner == "sdpa" and contested(rank(flux))
    close = [m("sdpa", 640.0, 600.0, 660.0, 0.03), m("flash-attn-3", 650.0, 620.0, 670.0, 0.03)]
    assert rank(close).winner == "sdpa" and not contested(rank(close))
    clear = [m("sdpa", 600.0, 598.0, 602.0, 0.002), m("flash-attn-3", 700.0, 698.0, 702.0, 0.002)]
    assert rank(clear).winner == "flash-attn-3" and not contested(rank(clear))
    top_tied = [m("sdpa", 660.0, 600.0, 700.0, 0.05), m("flash-attn-3", 640.0, 630.0, 650.0, 0.01)]
    assert rank(top_tied).winner == "sdpa" and not contested(rank(top_tied))
    assert not contested(rank([m("sdpa", 600.0, 600.0, 600.0, 0.0)]))
