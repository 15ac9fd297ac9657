"""A process that serves one call with measure-on-first-use and prints how often each backend ran (JSON).

Run by tests/dispatch/test_first_use.py twice against one ``ATTNFORGE_HOME``: the first process measures and
stores, the second must serve from the stored measurement without timing anything. The backends are the timing
seam's fakes (recorded H100 costs, :mod:`tests.dispatch.test_first_use`), the record store is the real SQLite one.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

import attnforge
from attnforge.dispatch import runtime
from attnforge.records import RecordStore, VerifyRecord, device_key
from tests._fakes import FakeClock
from tests.dispatch.test_first_use import Timed


def main() -> None:
    clock = FakeClock()
    fa3, fa4, sdpa = Timed("fa3", clock, 1.0), Timed("fa4", clock, 1.3), Timed("sdpa", clock, 1.6)
    store = RecordStore(Path(os.environ["ATTNFORGE_HOME"]))
    for name in ("fa3", "fa4"):
        store.add_verify(VerifyRecord(device_key=device_key("cpu", None, torch.__version__), backend=name,
                                      backend_version=None, ok=True, summary="ok"))
    runtime.set_dispatcher(runtime.Dispatcher({"fa3": fa3, "fa4": fa4}, fallback=sdpa, records=store))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 32, 8, generator=g) for h in (4, 2, 2))
    with attnforge.autotune(budget_s=0.05, rounds=3, clock=clock):
        attnforge.attention(q, k, v, causal=True)
    json.dump({"fa3": fa3.calls, "fa4": fa4.calls, "sdpa": sdpa.calls}, sys.stdout)


if __name__ == "__main__":
    main()
