#!/usr/bin/env python3
"""Issue 30's stall workload: N random ``attnforge.attention`` calls over many shape classes, each call's wall
time (launch to synchronize) recorded, and the compile caches' files counted before and after.

Run it twice against one ``ATTNFORGE_HOME``: the first process measures new classes off the calling thread (no
call should wait for a compile or a timing: ``max_ms`` after the warm-up calls is the figure), the second reads
the records and should compile nothing (``compiled_files`` 0; FA4's CuTe DSL cache and Inductor's under
``$ATTNFORGE_HOME/compile``). Each output is checked against the float32 math (``max_err``).

Usage (on the GPU machine, after ``attnforge verify``):
    python scripts/gpu/no_stall.py --out stall1.json [--calls 200] [--seed 0] [--device cuda]
    python scripts/gpu/no_stall.py --out stall2.json     # the second process: compiled_files must be 0
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any


def _call(rng: random.Random) -> dict[str, Any]:
    """One random call: D, GQA ratio, lengths, causal, window, softcap, grad."""
    d = rng.choice((64, 128, 256))
    hkv = rng.choice((1, 2, 4, 8))
    hq = hkv * rng.choice((1, 2, 4, 8))
    sq = rng.choice((1, 17, 128, 512, 1000, 2048, 4096))
    sk = max(sq, rng.choice((128, 512, 2048, 4096)))
    kw: dict[str, Any] = {"causal": rng.random() < 0.7}
    if rng.random() < 0.2:
        kw["window"] = (rng.choice((128, 1024)), 0)
    if rng.random() < 0.15:
        kw["softcap"] = 50.0
    return {"b": rng.choice((1, 2, 4)), "hq": hq, "hkv": hkv, "sq": sq, "sk": sk, "d": d, "kw": kw,
            "grad": rng.random() < 0.25}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warmup-calls", type=int, default=20, help="calls not counted in max_ms")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    import torch

    import attnforge
    from attnforge._system import compile_cache
    from attnforge.backends.adapter import reference_attention
    from attnforge.dispatch import autotune

    caches = compile_cache.ensure()
    before = compile_cache.count_artifacts(caches.folders)
    rng = random.Random(args.seed)
    specs = [_call(rng) for _ in range(args.calls)]
    rows = []
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for i, s in enumerate(specs):
        dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
        q = torch.randn(s["b"], s["hq"], s["sq"], s["d"], device=args.device, dtype=dtype)
        k, v = (torch.randn(s["b"], s["hkv"], s["sk"], s["d"], device=args.device, dtype=dtype) for _ in "kv")
        for t in (q, k, v):
            t.requires_grad_(s["grad"])
        sync()
        start = time.perf_counter()
        out = attnforge.attention(q, k, v, **s["kw"])
        if s["grad"]:
            out.sum().backward()
        sync()
        ms = (time.perf_counter() - start) * 1e3
        ref = reference_attention(q.detach().float(), k.detach().float(), v.detach().float(), causal=s["kw"]["causal"],
                                  scale=None, **{n: x for n, x in s["kw"].items() if n != "causal"})
        err = float((out.detach().float() - ref).abs().max())
        explained = attnforge.explain(q, k, v, **s["kw"])
        rows.append({"i": i, **{n: x for n, x in s.items() if n != "kw"}, **s["kw"], "ms": ms, "max_err": err,
                     "chosen": explained.chosen, "class": explained.shape_class})
    waited = autotune.background_wait(timeout_s=600)
    after = compile_cache.count_artifacts(caches.folders)
    counted = [r["ms"] for r in rows[args.warmup_calls:]]
    result = {"calls": len(rows), "classes": len({r["class"] for r in rows}), "compiled_files": after - before,
              "max_ms": max(counted, default=0.0), "median_ms": statistics.median(counted) if counted else 0.0,
              "measurements_done": waited, "caches": caches.lines(), "max_err": max(r["max_err"] for r in rows),
              "rows": rows}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    main()
