"""The FA4 backward probe's argument classification (``scripts/gpu/fa4_bwd_probe.py``, run on the GPU): what a
backward replay will be built from, so a misread slot here would become a wrong replay there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts" / "gpu"))
    import fa4_bwd_probe

    return fa4_bwd_probe


def test_each_argument_is_the_calls_own_tensor_a_shared_scratch_or_a_value(probe: Any) -> None:
    """A tensor with the memory, shape and strides of one of the call's own is named; a view of it with other
    strides, or the same memory with another shape, is not (a replay must not put the caller's tensor there); any
    other tensor is scratch, one entry per memory, listing every compiled call that received it; anything else is a
    value with its type."""
    q = torch.zeros(2, 8, 4, 16)
    dq_accum = torch.zeros(2, 4, 8 * 16)
    own = {"q": q, "dq": torch.zeros(2, 8, 4, 16), "lse": None}
    scratch: dict[int, dict[str, Any]] = {}

    assert probe.classify(q, own, scratch, 0) == {"own": "q"}
    assert probe.classify(own["dq"], own, scratch, 2) == {"own": "dq"}
    assert "scratch" in probe.classify(q.transpose(1, 2), own, scratch, 0)  # same memory, other strides
    assert "scratch" in probe.classify(q.view(2, 8, 64), own, scratch, 0)  # same memory, other shape
    first = probe.classify(dq_accum, own, scratch, 0)
    again = probe.classify(dq_accum, own, scratch, 2)
    assert first == again == {"scratch": first["scratch"], "shape": [2, 4, 128], "dtype": "torch.float32"}
    shared = next(e for e in scratch.values() if e["id"] == first["scratch"])
    assert shared["calls"] == [0, 2] and shared["stride"] == [512, 128, 1]
    assert probe.classify(0.125, own, scratch, 1) == {"value": "0.125", "type": "float"}
    assert probe.classify(None, own, scratch, 1) == {"value": "None", "type": "NoneType"}


def test_the_wrapped_cache_records_each_handed_out_call_and_passes_everything_through(probe: Any) -> None:
    """The probe's stand-in for a compile cache: membership and stores reach the real cache, and every function
    it hands out runs the real one and records its arguments and host time."""
    real: dict[str, Any] = {}
    seen: list[dict[str, Any]] = []
    cache = probe._Wrapped(real, "_bwd_preprocess", seen)
    assert "key" not in cache
    cache["key"] = lambda a, b: a + b
    assert "key" in cache and "key" in real
    assert cache["key"](2, 3) == 5
    assert [(s["cache"], s["args"], s["kwargs"]) for s in seen] == [("_bwd_preprocess", (2, 3), {})]
    assert seen[0]["host_us"] >= 0
