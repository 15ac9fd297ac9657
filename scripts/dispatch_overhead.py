"""Dispatch overhead of ``attnforge.attention`` per call, above calling the chosen backend directly.

Usage: ``python3 scripts/dispatch_overhead.py [--device cpu|cuda] [--iters N] [--repeats R] [--json]``
(PYTHONPATH=src when running from a checkout). See docs/dispatch-overhead.md for the method and results.

Three measurements, each a group of variants timed against the group's baseline:

1. ``null``: ``attention()`` routed to a registered no-op backend that takes ``[B, H, S, D]`` (returns q),
   minus calling that backend directly. No kernel runs: nothing but the dispatcher is timed.
2. ``fa-noop``: the real FlashAttention adapter class (``FlashAttnAdapter``, as used for flash-attn 2/3/4) over
   a stand-in kernel module whose ``flash_attn_func`` returns q, minus calling that kernel directly on
   ``[B, S, H, D]`` tensors as a user of ``flash_attn.cute`` would. This is the dispatcher plus the adapter's
   own work (layout views, kernel lookup), the part of the overhead measured on the H200.
3. ``real``: the backend the real registry chooses here, through ``attention()`` and directly, on tiny
   inputs (``[1, 2, 16, 64]``) so that the kernel costs little.

Each variant is called ``iters`` times in a loop; the per-call time is the loop's wall time divided by
``iters`` (CUDA: synchronised before and after the loop only, so kernels queue as in real use). Every round
times every variant once, interleaved; a variant's overhead in a round is its time minus the group baseline's
time in the same round. Reported: the median of those paired differences over ``repeats`` rounds, and their
quartiles (the spread). Decisions are cached before timing (the first call decides; later calls look it up).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
import types
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


def _noop_flash_attn_func(q: Any, k: Any, v: Any, *, softmax_scale: float | None = None,
                          causal: bool = False) -> Any:
    return q


def _measure(groups: dict[str, dict[str, Callable[[], Any]]], iters: int, repeats: int,
             sync: Callable[[], None]) -> dict[str, dict[str, Any]]:
    """Per group: the baseline's median us/call and, per variant, median and quartiles of the paired
    per-round differences to the baseline (the group's first variant), in us/call."""
    variants = {(g, name): fn for g, fns in groups.items() for name, fn in fns.items()}
    for fn in variants.values():  # warm-up: decisions cached, kernels loaded
        for _ in range(50):
            fn()
    samples: dict[tuple[str, str], list[float]] = {key: [] for key in variants}
    for _ in range(repeats):
        for key, fn in variants.items():
            samples[key].append(_time_loop(fn, iters, sync) * 1e6)
    result: dict[str, dict[str, Any]] = {}
    for group, fns in groups.items():
        names = list(fns)
        base = samples[(group, names[0])]
        entry: dict[str, Any] = {"baseline": names[0], "baseline_us": round(statistics.median(base), 2)}
        for name in names[1:]:
            diffs = [t - b for t, b in zip(samples[(group, name)], base, strict=True)]
            q1, _, q3 = statistics.quantiles(diffs, n=4)
            entry[name] = {"overhead_us": round(statistics.median(diffs), 2),
                           "quartiles_us": [round(q1, 2), round(q3, 2)],
                           "per_call_us": round(statistics.median(samples[(group, name)]), 2)}
        result[group] = entry
    return result


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
    from attnforge.backends import registry
    from attnforge.backends._base import Requirement
    from attnforge.backends.flash import FlashAttnAdapter
    from attnforge.dispatch import runtime
    from attnforge.records import BenchRecord, RecordStore, VerifyRecord
    from attnforge.types.cc import ComputeCapability

    dtype = torch.float16 if args.device == "cuda" else torch.float32
    q, k, v = (torch.randn(1, 2, 16, 64, device=args.device, dtype=dtype) for _ in range(3))
    qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # [B, S, H, D] tensors of their own
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    store = RecordStore(Path(os.environ["ATTNFORGE_HOME"]))
    key = runtime.get_dispatcher()._device(q.device).key
    for name in ("null", "flash-attn-4"):
        store.add_verify(VerifyRecord(device_key=key, backend=name, backend_version=None, ok=True, summary="-"))
    # recorded faster than plain SDPA in the classes timed here (the policy keeps SDPA where nothing is measured)
    store.add_bench([BenchRecord(device_key=key, backend=name, backend_version=None,
                                 dtype=str(dtype).removeprefix("torch."), mode="fwd", causal=causal, batch=1, heads_q=2,
                                 heads_kv=2, head_dim=64, seqlen_q=16, seqlen_k=16, ms=1.0, tflops=tflops,
                                 peak_mem_bytes=None, run_id="overhead")
                     for name, tflops in (("null", 100.0), ("flash-attn-4", 100.0), ("sdpa", 1.0))
                     for causal in (False, True)])

    # 1) a verified backend that does nothing, so no kernel time hides or adds noise
    null = NullAdapter()
    null_dispatcher = runtime.Dispatcher({"null": null}, records=store, priorities={"null": 0})
    # 2) the FlashAttention adapter class over a no-op kernel module, its capabilities opened to this device
    sys.modules["attnforge_noop_flash_attn"] = types.SimpleNamespace(flash_attn_func=_noop_flash_attn_func)  # type: ignore[assignment]
    caps = registry.adapters()["flash-attn-4"].caps  # type: ignore[attr-defined]
    caps = dataclasses.replace(caps, devices=(args.device,), support=dataclasses.replace(
        caps.support, min_cc=ComputeCapability(0, 0), dtypes=(str(dtype).removeprefix("torch."),)))
    fa = FlashAttnAdapter(name="flash-attn-4", caps=caps,
                          requirement=Requirement(modules=("attnforge_noop_flash_attn",)))
    fa_dispatcher = runtime.Dispatcher({"flash-attn-4": fa}, records=store, priorities={"flash-attn-4": 0})

    runtime.set_dispatcher(null_dispatcher)
    assert attnforge.explain(q, k, v).chosen == "null"
    runtime.set_dispatcher(fa_dispatcher)
    assert attnforge.explain(q, k, v).chosen == "flash-attn-4"

    # one dispatcher per group: the null and fa groups run with their own dispatcher installed
    def with_dispatcher(dispatcher: runtime.Dispatcher,
                        fns: dict[str, Callable[[], Any]]) -> dict[str, Callable[[], Any]]:
        def wrap(fn: Callable[[], Any]) -> Callable[[], Any]:
            def call() -> Any:
                runtime._DISPATCHER = dispatcher  # a plain global store: costs the same in every variant
                return fn()
            return call
        return {name: wrap(fn) for name, fn in fns.items()}

    groups = {
        "null": with_dispatcher(null_dispatcher, {
            "null backend directly": lambda: null(q, k, v, causal=False, scale=None),
            "attention() bhsd": lambda: attnforge.attention(q, k, v),
            "attention() bshd": lambda: attnforge.attention(qs, ks, vs, layout="bshd"),
            "attention() causal": lambda: attnforge.attention(q, k, v, causal=True),
            "attention() forced": lambda: attnforge.attention(q, k, v, backend="null"),
        }),
        "fa-noop": with_dispatcher(fa_dispatcher, {
            "no-op kernel directly (bshd)": lambda: _noop_flash_attn_func(qs, ks, vs, softmax_scale=None,
                                                                           causal=False),
            "FlashAttnAdapter directly (bhsd)": lambda: fa(q, k, v, causal=False, scale=None),
            "attention() bhsd": lambda: attnforge.attention(q, k, v),
            "attention() bshd": lambda: attnforge.attention(qs, ks, vs, layout="bshd"),
        }),
    }
    pure = _measure(groups, args.iters, args.repeats, sync)

    # 3) end to end, real registry: the backend chosen here, called directly and through attention()
    runtime.set_dispatcher(None)
    chosen = attnforge.explain(q, k, v).chosen
    assert chosen is not None
    adapter = runtime.get_dispatcher().adapter(chosen)
    real = _measure({"real": {
        f"{chosen} adapter directly": lambda: adapter(q, k, v, causal=False, scale=None),
        f"attention() -> {chosen}": lambda: attnforge.attention(q, k, v),
        "F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, k, v),
    }}, args.iters, args.repeats, sync)

    result = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "chosen": chosen,
        "iters": args.iters,
        "repeats": args.repeats,
        "shape": "[1, 2, 16, 64] " + str(dtype).removeprefix("torch."),
        "groups": {**pure, **real},
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['device']}  torch {result['torch']}  python {result['python']}  {result['shape']}"
              f"  {args.iters} calls x {args.repeats} rounds")
        print("overhead above the group's baseline, us per call: median of paired rounds [quartiles]")
        for group, entry in result["groups"].items():
            print(f"{group}: baseline {entry['baseline']!r} {entry['baseline_us']:.2f} us/call")
            for name, stats in entry.items():
                if isinstance(stats, dict):
                    q1, q3 = stats["quartiles_us"]
                    print(f"  {name:36} {stats['overhead_us']:7.2f}  [{q1:.2f}, {q3:.2f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
