"""Dispatch overhead of ``attnforge.attention`` per call, above calling the chosen backend directly.

Usage: ``python3 scripts/dispatch_overhead.py [--device cpu|cuda] [--iters N] [--repeats R] [--json]``
(PYTHONPATH=src when running from a checkout). See docs/dispatch-overhead.md for the method and results.

Two measurements. (1) Pure dispatch cost: ``attention()`` routed to a registered no-op backend, minus calling
that backend directly; no kernel runs, so nothing but the dispatcher is timed. (2) End to end: the backend the
real registry chooses here, called through ``attention()`` and directly, on tiny inputs (``[1, 2, 16, 64]``)
so that the kernel costs little. Each variant is called ``iters`` times in a loop; the per-call time is the
loop's wall time divided by ``iters`` (CUDA: synchronised before and after the loop only, so kernels queue
as in real use; with tiny kernels the loop is bound by the CPU-side launch cost, which dispatch adds to).
``repeats`` loops per variant, interleaved, and the median is reported. Overhead = median(attention) -
median(direct call).
The decision cache is warm (the first call decides; later calls look the decision up).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _time_loop(fn: Callable[[], Any], iters: int, sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters


class NullAdapter:
    """A backend that serves every call instantly (returns q): isolates the dispatcher's own cost."""

    name = "null"

    def load_error(self) -> str | None:
        return None

    def unsupported_reasons(self, call: Any) -> list[str]:
        return []

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
        return q


def _measure(variants: dict[str, Callable[[], Any]], iters: int, repeats: int,
             sync: Callable[[], None]) -> dict[str, float]:
    """Median seconds per call (in us) of each variant; loops interleaved across variants."""
    for fn in variants.values():  # warm-up: decisions cached, kernels loaded
        for _ in range(50):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            samples[name].append(_time_loop(fn, iters, sync))
    return {name: statistics.median(s) * 1e6 for name, s in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("ATTNFORGE_HOME", tempfile.mkdtemp(prefix="attnforge-overhead-"))

    import torch
    import torch.nn.functional as F  # noqa: N812

    import attnforge
    from attnforge.dispatch import runtime
    from attnforge.records import RecordStore, VerifyRecord

    dtype = torch.float16 if args.device == "cuda" else torch.float32
    q, k, v = (torch.randn(1, 2, 16, 64, device=args.device, dtype=dtype) for _ in range(3))
    qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)

    # 1) pure dispatch cost: a verified backend that does nothing, so no kernel time hides or adds noise
    null = NullAdapter()
    store = RecordStore(Path(os.environ["ATTNFORGE_HOME"]))
    key = runtime.get_dispatcher()._device(q.device).key
    store.add_verify(VerifyRecord(device_key=key, backend="null", backend_version=None, ok=True, summary="-"))
    runtime.set_dispatcher(runtime.Dispatcher({"null": null}, records=store, priorities={"null": 0}))
    assert attnforge.explain(q, k, v).chosen == "null"
    pure = _measure({
        "null backend directly": lambda: null(q, k, v, causal=False, scale=None),
        "attention() -> null (bhsd)": lambda: attnforge.attention(q, k, v),
        "attention() -> null (bshd)": lambda: attnforge.attention(qs, ks, vs, layout="bshd"),
        "attention() -> null (causal)": lambda: attnforge.attention(q, k, v, causal=True),
        "attention() -> null (forced)": lambda: attnforge.attention(q, k, v, backend="null"),
    }, args.iters, args.repeats, sync)

    # 2) end to end, real registry: the backend chosen here, called directly and through attention()
    runtime.set_dispatcher(None)
    chosen = attnforge.explain(q, k, v).chosen
    assert chosen is not None
    adapter = runtime.get_dispatcher()._adapter(chosen)
    real = _measure({
        "F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, k, v),
        f"{chosen} adapter directly": lambda: adapter(q, k, v, causal=False, scale=None),
        f"attention() -> {chosen}": lambda: attnforge.attention(q, k, v),
    }, args.iters, args.repeats, sync)

    base = pure["null backend directly"]
    result = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "chosen": chosen,
        "iters": args.iters,
        "repeats": args.repeats,
        "shape": "[1, 2, 16, 64] " + str(dtype).removeprefix("torch."),
        "pure_dispatch_us": {name: round(us - base, 2) for name, us in pure.items() if us is not base},
        "real_per_call_us": {name: round(us, 2) for name, us in real.items()},
        "real_overhead_us": round(real[f"attention() -> {chosen}"] - real[f"{chosen} adapter directly"], 2),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['device']}  torch {result['torch']}  python {result['python']}  {result['shape']}")
        print("pure dispatch cost above calling a no-op backend directly (median us per call):")
        for name, us in result["pure_dispatch_us"].items():
            print(f"  {name:40} {us:8.2f}")
        print(f"end to end, chosen backend {chosen!r} (median us per call):")
        for name, us in result["real_per_call_us"].items():
            print(f"  {name:40} {us:8.2f}")
        print(f"  overhead: {result['real_overhead_us']} us per call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
