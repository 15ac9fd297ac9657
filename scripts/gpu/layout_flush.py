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
import contextlib
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from _timing import measure_ms
from grid_check import direct_backends
from overhead import time_variant

CELLS = ("chunked-prefill-gqa", "decode-gqa", "mha-1k")


def variants(torch: Any, attnforge: Any, qkv: tuple[Any, Any, Any], *, causal: bool) -> dict[str, Callable[[], Any]]:
    """label -> call: ``<backend>/<how>`` with how = bshd (contiguous), bhsd-view, attnforge-bhsd, attnforge-bshd;
    the backends called directly are ``grid_check.direct_backends``' (the check's own calls)."""
    import io

    q, k, v = qkv
    qs, ks, vs = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    qv, kv, vv = (x.transpose(1, 2) for x in (q, k, v))
    with contextlib.redirect_stdout(io.StringIO()):  # "not importable" lines: those backends are just absent
        direct = direct_backends(torch)
    out: dict[str, Callable[[], Any]] = {
        "sdpa/bhsd": lambda: direct["sdpa"][1](q, k, v, causal),
        "sdpa/attnforge-bhsd": lambda: attnforge.attention(q, k, v, causal=causal, backend="sdpa"),
    }
    for name in ("flash-attn-3", "flash-attn-4"):
        if name not in direct:
            print(f"{name} not importable")
            continue
        fn = direct[name][1]
        out[f"{name}/bshd"] = lambda fn=fn: fn(qs, ks, vs, causal)
        out[f"{name}/bhsd-view"] = lambda fn=fn: fn(qv, kv, vv, causal)
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
                    timed = {way: measure_ms(torch, fn, flush=f) for way, f in (("flush", flush), ("no_flush", 0))}
                    fn()  # warm, then host µs per call issued back to back (the launch the GPU waits for)
                    row["variants"][label] = {**{w: {k: m[k] for k in ("median_ms", "lo_ms", "hi_ms")}
                                                 for w, m in timed.items()},
                                              "host_us": time_variant(fn, contextlib.nullcontext, 200)[0]}
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
