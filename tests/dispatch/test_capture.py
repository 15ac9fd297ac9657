"""Inside a CUDA graph capture ``attention()`` serves the remembered route and nothing else: no decision, no
measurement, no record write (the capture is simulated on CPU at its one seam,
``torch.cuda.is_current_stream_capturing``; tests/dispatch/test_direct_gpu.py captures for real)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import attnforge
from attnforge.backends.exact import reference_attention
from attnforge.dispatch import autotune, runtime
from attnforge.records import RecordStore
from tests._fakes import FakeClock
from tests.dispatch.test_first_use import CPU_KEY, Timed, _qkv, _use


@pytest.fixture
def store(tmp_path: Path) -> Any:
    previous = runtime.set_dispatcher(None)
    yield RecordStore(tmp_path / "home")
    runtime.set_dispatcher(previous)


def _capturing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # a capture needs CUDA initialized
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)


def _refuse(*_args: Any, **_kwargs: Any) -> Any:
    raise AssertionError("ran inside a capture")


def test_a_capture_serves_the_route_measured_before_it(store: RecordStore, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    fast, sdpa = Timed("fast", clock, 1.0), Timed("sdpa", clock, 2.0)
    dispatcher = _use(store, sdpa, fast)
    q, k, v = _qkv()
    with attnforge.autotune(budget_s=0.02, rounds=2, clock=clock):
        for _ in range(2):  # eager warm-up (torch.cuda.graph's recipe): measured, fast chosen, route remembered
            attnforge.attention(q, k, v, causal=True)
            autotune.background_wait()  # first use measures off the calling thread: let it finish
        runs = len(store.bench_records(CPU_KEY))
        calls = fast.calls
        _capturing(monkeypatch)
        monkeypatch.setattr(dispatcher, "route", _refuse)  # no decision ...
        monkeypatch.setattr(autotune, "tune", _refuse)  # ... and no measurement inside the capture
        out = attnforge.attention(q, k, v, causal=True)
    assert fast.calls == calls + 1  # served by the measured choice
    assert len(store.bench_records(CPU_KEY)) == runs > 0  # nothing written
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, causal=True), atol=1e-5, rtol=1e-4)


def test_a_class_first_seen_inside_a_capture_is_served_unmeasured(store: RecordStore,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    fast, sdpa = Timed("fast", clock, 1.0), Timed("sdpa", clock, 2.0)
    _use(store, sdpa, fast)
    _capturing(monkeypatch)
    monkeypatch.setattr(autotune, "tune", _refuse)
    q, k, v = _qkv(sq=16, sk=64)
    with attnforge.autotune(budget_s=0.02, rounds=2, clock=clock):
        out = attnforge.attention(q, k, v, layout="bhsd")
    assert store.bench_records(CPU_KEY) == []
    assert fast.calls + sdpa.calls == 1  # one backend served the call; none was timed
    torch.testing.assert_close(out.double(), reference_attention(q, k, v), atol=1e-5, rtol=1e-4)
