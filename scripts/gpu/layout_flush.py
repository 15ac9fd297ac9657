#!/usr/bin/env python3
"""Why do short FA3/FA4 kernels read slower on first use than called directly? (docs/benchmarks.md §1)

Two explanations fit the 2026-11-25 H100 data: (a) the bhsd-strided call (``q.transpose(1, 2)`` views of
``[B, H, S, D]`` tensors) is slower for these kernels than contiguous bshd; (b) the L2 flush before each timed
repetition leaves the GPU idle while the host launches the next call, so a kernel shorter than its host launch
cost is timed as its launch. This script separates them on a few short cells (the grid's chunked prefill, GQA
decode, MHA 1k): every backend called directly on contiguous bshd and on bhsd views, and ``attnforge.attention``
forced to that backend (the route first use times), each timed by :func:`attnforge.bench.timing.measure` with the
L2 flush and without it, plus the host microseconds per call (perf_counter over back-to-back calls, no sync).

Usage (GPU machine, after ``install``/``verify``; run.sh's ``layout`` stage):
    python scripts/gpu/layout_flush.py --out layout.json [--cells chunked-prefill-gqa,...] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

CELLS = ("chunked-prefill-gqa", "decode-gqa", "mha-1k")


def host_us(torch: Any, fn: Callable[[], Any], calls: int = 200) -> float:
    """Host µs per call of ``fn`` issued back to back (the launch cost the GPU waits for when it is idle)."""
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    took = time.perf_counter() - start
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return took / calls * 1e6


def timed_ms(torch: Any, fn: Callable[[], Any], flush: int) -> dict[str, float]:
    from attnforge.bench import timing as t

    cuda = torch.cuda.is_available()
    config = t.GPU_EVENTS if cuda else t.CPU_PERF_COUNTER
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rounds = [t.measure(lambda _i: fn(), sets=1, config=config, sync=sync, flush_bytes=flush if cuda else 0)
              for _ in range(config.rounds)]
    got = t.combine_rounds(rounds)
    return {"median_ms": got.median_ms, "lo_ms": got.lo_ms, "hi_ms": got.hi_ms}


def variants(torch: Any, attnforge: Any, qkv: tuple[Any, Any, Any], *, causal: bool) -> dict[str, Callable[[], Any]]:
    """label -> call: ``<backend>/<how>`` with how = bshd (contiguous), bhsd-view, attnforge-bhsd, attnforge-bshd."""
    import torch.nn.functional as F  # noqa: N812

    q, k, v = qkv
    qs, ks, vs = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    qv, kv, vv = (x.transpose(1, 2) for x in (q, k, v))
    gqa = q.shape[1] != k.shape[1]
    br = causal and q.shape[-2] != k.shape[-2]
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril(
        k.shape[-2] - q.shape[-2]) if br else None
    out: dict[str, Callable[[], Any]] = {
        "sdpa/bhsd": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and not br,
                                                            enable_gqa=gqa),
        "sdpa/attnforge-bhsd": lambda: attnforge.attention(q, k, v, causal=causal, backend="sdpa"),
    }
    kernels: dict[str, Callable[..., Any]] = {}
    try:
        import flash_attn_interface as fa3

        kernels["flash-attn-3"] = fa3.flash_attn_func
    except Exception as exc:
        print(f"flash-attn-3 not importable: {exc}")
    try:
        from flash_attn.cute import flash_attn_func as fa4

        kernels["flash-attn-4"] = fa4
    except Exception as exc:
        print(f"flash-attn-4 not importable: {exc}")
    for name, fn in kernels.items():
        out[f"{name}/bshd"] = lambda fn=fn: fn(qs, ks, vs, causal=causal)
        out[f"{name}/bhsd-view"] = lambda fn=fn: fn(qv, kv, vv, causal=causal)
        out[f"{name}/attnforge-bhsd"] = lambda n=name: attnforge.attention(q, k, v, causal=causal, backend=n)
        out[f"{name}/attnforge-bshd"] = lambda n=name: attnforge.attention(qs, ks, vs, causal=causal, backend=n,
                                                                           layout="bshd")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--device", default="cuda", help="cpu: a dry run at tiny sizes")
    args = ap.parse_args()
    import torch

    import attnforge
    from attnforge.bench import timing as t
    from attnforge.bench.grid import REAL_GRID

    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                           "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": []}
    wanted = args.cells.split(",")
    for name, *dims, causal, _train in REAL_GRID:
        if name not in wanted:
            continue
        b, hq, hkv, sq, sk, d = dims
        if not cuda:
            b, hq, hkv, sq, sk, d = 1, 4, max(1, 4 * hkv // hq), max(1, sq // 64), sk // 64, 64
        torch.manual_seed(0)
        q = torch.randn(b, hq, sq, d, device=args.device, dtype=dtype)
        k = torch.randn(b, hkv, sk, d, device=args.device, dtype=dtype)
        v = torch.randn(b, hkv, sk, d, device=args.device, dtype=dtype)
        flush = t.flush_bytes(sum(x.numel() * x.element_size() for x in (q, k, v))) if cuda else 0
        row: dict[str, Any] = {"cell": name, "shape_bhsd": [b, hq, sq, d], "seqlen_k": sk, "heads_kv": hkv,
                               "causal": causal, "flush_bytes": flush, "variants": {}}
        for label, fn in variants(torch, attnforge, (q, k, v), causal=causal).items():
            try:
                with torch.no_grad():
                    row["variants"][label] = {"flush": timed_ms(torch, fn, flush), "no_flush": timed_ms(torch, fn, 0),
                                              "host_us": host_us(torch, fn)}
            except Exception as exc:
                row["variants"][label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            got = row["variants"][label]
            print(f"{name:20s} {label:30s} " + (got.get("error") or
                  f"flush {got['flush']['median_ms']:.4f} ms  no-flush {got['no_flush']['median_ms']:.4f} ms  "
                  f"host {got['host_us']:.1f} us"), flush=True)
        doc["rows"].append(row)
        with open(args.out, "w") as fh:
            json.dump(doc, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
