"""No stalls (issue 30): a candidate's compile never blocks the call. The first call of a new class is served by
its current best (plain SDPA) while the candidates compile and are timed on the worker thread; the class then
switches to the measured winner. The backends are fakes at the kernel seam: the "compiling" one blocks its first
call on an event the test releases, so a call that waited for it would never return (no wall-clock asserts)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

import attnforge
from attnforge.backends.exact import reference_attention
from attnforge.dispatch import autotune, background, runtime
from attnforge.records import RecordStore, VerifyRecord, device_key
from tests._fakes import FakeClock, ReadyAdapter

CPU_KEY = device_key("cpu", None, torch.__version__)


@dataclass
class Kernel(ReadyAdapter):
    """A verified backend: exact output, ``cost_ms`` on the fake clock per call, the thread of every call;
    with ``compiling`` set, its first call waits for that event (a JIT compile the test controls)."""

    name: str
    clock: FakeClock
    cost_ms: float
    compiling: threading.Event | None = None
    threads: list[int] = field(default_factory=list)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None) -> torch.Tensor:
        if self.compiling is not None and not self.threads:
            assert self.compiling.wait(timeout=30), "the compile was never released"
        self.threads.append(threading.get_ident())
        self.clock.now += self.cost_ms / 1e3
        return reference_attention(q, k, v, causal=causal, scale=scale).to(q.dtype)


@pytest.fixture
def kernels(tmp_path: Path) -> Iterator[tuple[Kernel, Kernel, threading.Event]]:
    store = RecordStore(tmp_path / "home")
    store.add_verify(VerifyRecord(device_key=CPU_KEY, backend="jit", backend_version=None, ok=True, summary="ok"))
    clock, compiled = FakeClock(), threading.Event()
    jit, sdpa = Kernel("jit", clock, 1.0, compiling=compiled), Kernel("sdpa", clock, 3.0)
    previous = runtime.set_dispatcher(runtime.Dispatcher({"jit": jit}, fallback=sdpa, records=store))
    yield jit, sdpa, compiled
    compiled.set()
    autotune.background_wait(timeout_s=30)
    runtime.set_dispatcher(previous)


def _qkv(sq: int = 16) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(5)
    return tuple(torch.randn(1, h, sq, 8, generator=g) for h in (4, 2, 2))


def test_the_first_call_returns_while_the_candidate_compiles_and_the_winner_serves_after(kernels: Any) -> None:
    jit, sdpa, compiled = kernels
    with attnforge.autotune(budget_s=0.05, clock=jit.clock, background=True):
        _first_call_then_switch(jit, sdpa, compiled)


def _first_call_then_switch(jit: Kernel, sdpa: Kernel, compiled: threading.Event) -> None:
    q, k, v = _qkv()
    me = threading.get_ident()
    out = attnforge.attention(q, k, v)  # jit's first call blocks until `compiled` is set: this must not wait
    assert [t for t in sdpa.threads if t == me] == [me]  # plain SDPA served the first call (the worker times it)
    assert attnforge.explain(q, k, v).chosen == "sdpa"
    assert "measured off the calling thread" in attnforge.explain(q, k, v).basis[0]
    again = attnforge.attention(q, k, v)  # still measuring: still SDPA, still no wait
    assert jit.threads == []  # the candidate still compiles, and nothing of it ran on the calling thread
    compiled.set()
    assert autotune.background_wait(timeout_s=30)
    served_before = len(jit.threads)
    last = attnforge.attention(q, k, v)
    assert len(jit.threads) == served_before + 1  # switched: the measured winner serves the class now
    assert attnforge.explain(q, k, v).chosen == "jit"
    for result in (out, again, last):
        torch.testing.assert_close(result, reference_attention(q, k, v, causal=False, scale=None).float())


def test_no_measurement_runs_on_the_calling_thread(kernels: Any) -> None:
    """The stall budget, counted: every call runs exactly one kernel call on the calling thread (the one that
    serves it); every timed repetition, first calls included, runs on the worker."""
    jit, sdpa, compiled = kernels
    compiled.set()
    me = threading.get_ident()
    calls = 0
    with attnforge.autotune(budget_s=0.02, rounds=3, clock=jit.clock, background=True):
        for sq in (4, 8, 16, 32, 64, 4, 8, 16):  # five classes, each new one queued for measurement
            attnforge.attention(*_qkv(sq))
            calls += 1
    assert autotune.background_wait(timeout_s=30)
    on_caller = [t for t in jit.threads + sdpa.threads if t == me]
    assert len(on_caller) == calls
    assert len(jit.threads) + len(sdpa.threads) > 4 * calls  # the measurements did run, elsewhere


def test_off_means_nothing_is_queued(kernels: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    jit, sdpa, _ = kernels
    monkeypatch.setenv(autotune.ENV, "0")
    attnforge.attention(*_qkv())
    assert autotune.background_wait(timeout_s=5)
    assert (len(jit.threads), len(sdpa.threads)) == (0, 1)


def test_a_held_worker_runs_no_step_until_released() -> None:
    """What capture guards use (:func:`attnforge.dispatch.autotune.quiet`): no measurement step inside."""
    worker = background.Worker()
    steps: list[str] = []

    def job(checkpoint: Any) -> None:
        for name in ("a", "b"):
            checkpoint()
            steps.append(name)

    with worker.hold():
        worker.submit("k", job)
        assert not worker.wait(timeout_s=0.2)  # held: the job has not started
        assert steps == []
    assert worker.wait(timeout_s=30)
    assert steps == ["a", "b"]
    assert worker.submit("k", job) and worker.wait(timeout_s=30)  # done: the same key may be queued again


def test_a_job_that_raises_leaves_the_worker_running() -> None:
    worker = background.Worker()

    def bad(_checkpoint: Any) -> None:
        raise RuntimeError("no kernel image")

    ran: list[int] = []
    worker.submit("bad", bad)
    worker.submit("good", lambda _c: ran.append(1))
    assert worker.wait(timeout_s=30)
    assert ran == [1] and worker.failed == [("bad", "RuntimeError: no kernel image")]


def _decision(order: tuple[str, ...], measured: tuple[str, ...]) -> Any:
    from attnforge.dispatch.policy import Decision
    from attnforge.ranking import Measurement, rank

    ranking = rank(Measurement(backend=n, tflops=10.0 - i, tflops_lo=9.0 - i, tflops_hi=11.0 - i, noise=0.0)
                   for i, n in enumerate(measured)) if measured else None
    return Decision(order=order, basis=tuple(f"why {n}" for n in order), rejected=(), ranking=ranking)


@pytest.mark.parametrize(("order", "measured", "serves"), [
    pytest.param(("fa4", "sdpa"), (), "sdpa", id="unmeasured-leader-waits-behind-sdpa"),
    pytest.param(("fa3", "fa4", "sdpa"), ("fa3", "sdpa"), "fa3", id="the-recorded-choice-keeps-serving"),
    pytest.param(("flex", "exact"), (), "flex", id="sdpa-cannot-serve-the-feature"),
])
def test_what_serves_while_a_class_is_measured(order: tuple[str, ...], measured: tuple[str, ...],
                                               serves: str) -> None:
    decision = autotune.provisional(_decision(order, measured))
    assert decision.order[0] == serves
    assert sorted(decision.order) == sorted(order) and len(decision.basis) == len(order)


def test_a_closed_worker_finishes_its_running_job_drops_the_queue_and_takes_no_more() -> None:
    """At interpreter exit (atexit) the worker is closed: a process must never finalize while the worker is
    inside CUDA or a JIT compiler (on an H100 that aborted the process, 2026-11-26)."""
    worker = background.Worker()
    started, release, done = threading.Event(), threading.Event(), []

    def running(_checkpoint: Any) -> None:
        started.set()
        release.wait(5)
        done.append("running")

    assert worker.submit("a", running)
    assert started.wait(5)
    assert worker.submit("b", lambda _cp: done.append("queued"))
    timer = threading.Timer(0.2, release.set)
    timer.start()
    worker.close(timeout_s=5)
    timer.join()
    assert done == ["running"]
    assert not worker.submit("c", lambda _cp: done.append("late"))
    assert not worker.pending("b")


def test_background_measurement_is_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(autotune.ENV, raising=False)
    assert autotune.active("cuda") is autotune.DEFAULT
    assert not autotune.DEFAULT.background
    monkeypatch.setenv(autotune.ENV, "background")
    assert autotune.active("cuda") is autotune.DEFAULT_BACKGROUND
    assert autotune.active("cpu") is None
