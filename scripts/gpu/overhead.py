#!/usr/bin/env python3
"""Dispatch overhead of ``attnforge.attention`` per call on the GPU: the chosen backend called directly vs
through
the dispatcher, on small shapes where the host-side cost is what a model feels (target: <= 5 us per call).

For each shape, ``attnforge.explain`` names the chosen backend; four ways of running it are timed:

- ``raw``: the backend's own function (``F.scaled_dot_product_attention`` inside its ``sdpa_kernel`` context,
  ``flash_attn_func``, ``flash_attn.cute.flash_attn_func``, ``sageattn``, ``memory_efficient_attention``) on
  inputs
  already in its native layout;
- ``adapter``: attnforge's adapter object for that backend (``attnforge.backends.registry``), [B, H, S, D];
- ``dispatch``: ``attnforge.attention(q, k, v)`` with [B, H, S, D] inputs (the default layout);
- ``dispatch_native``: ``attnforge.attention`` with the backend's native layout (``layout="bshd"`` for the
  FlashAttention family and xFormers), so no layout conversion separates it from ``raw``.

Method (device/METHOD.md): the host time to issue N calls back to back (``perf_counter_ns`` around the loop,
the
GPU synchronised before, not inside: what the Python caller pays per call), and the wall time per call
including
the final synchronisation; R rounds with the variants interleaved in a rotating order, after warm-up; medians
with p10/p90. Overhead = median host time of ``dispatch`` minus that of ``raw`` (and of ``adapter``). The
outputs of ``raw`` and ``dispatch`` are compared: bit-identical means the dispatcher ran the same kernel.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SHAPES = [  # (B, H, S, D): small enough that the host side dominates
    (1, 8, 128, 64),
    (1, 16, 512, 128),
    (4, 16, 1024, 128),
]


def chosen_name(expl: Any) -> str | None:
    for attr in ("chosen", "backend", "chosen_backend", "selected", "name"):
        val = expl.get(attr) if isinstance(expl, dict) else getattr(expl, attr, None)
        if isinstance(val, str):
            return val
        inner = getattr(val, "name", None)
        if isinstance(inner, str):
            return inner
    return None


def raw_callable(name: str, q: Any, k: Any, v: Any, causal: bool, *,
                 bhsd_views: bool = False) -> tuple[Callable[[], Any], Any, str]:
    """(fn, factory of the context to hold while timing, native layout) for the backend's own entry point;
    ``bhsd_views``: a BSHD kernel gets ``transpose(1, 2)`` views of the bhsd tensors made in each call, and its
    output is transposed back (what a caller holding bhsd tensors writes by hand)."""
    import torch.nn.functional as F  # noqa: N812
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))  # [B, S, H, D] views, last dim contiguous
    kernels = {
        "sdpa-flash": SDPBackend.FLASH_ATTENTION,
        "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
        "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
        "sdpa-math": SDPBackend.MATH,
    }
    if name in kernels:
        return (
            (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)),
            (lambda: sdpa_kernel(kernels[name])),
            "bhsd",
        )
    if name in ("sdpa", "flex"):
        return (
            (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)),
            contextlib.nullcontext,
            "bhsd",
        )
    def bshd_kernel(kernel: Callable[..., Any]) -> tuple[Callable[[], Any], Any, str]:
        if bhsd_views:
            return ((lambda: first(kernel(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          causal=causal)).transpose(1, 2)), contextlib.nullcontext, "bshd")
        return (lambda: kernel(qs, ks, vs, causal=causal)), contextlib.nullcontext, "bshd"

    if name == "flash-attn":
        from flash_attn import flash_attn_func

        return bshd_kernel(flash_attn_func)
    if name == "flash-attn-3":
        from flash_attn_interface import flash_attn_func as fa3

        return bshd_kernel(fa3)
    if name == "flash-attn-4":
        from flash_attn.cute import flash_attn_func as fa4

        return bshd_kernel(fa4)
    if name.startswith("sageattention"):
        from sageattention import sageattn

        return (
            (lambda: sageattn(q, k, v, tensor_layout="HND", is_causal=causal)),
            contextlib.nullcontext,
            "bhsd",
        )
    if name == "xformers":
        import xformers.ops as xops

        bias = xops.LowerTriangularMask() if causal else None
        return (
            (lambda: xops.memory_efficient_attention(qs, ks, vs, attn_bias=bias)),
            contextlib.nullcontext,
            "bshd",
        )
    raise KeyError(name)


def first(x: Any) -> Any:
    return x[0] if isinstance(x, tuple) else x


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_variant(fn: Callable[[], Any], ctx: Callable[[], Any], n: int) -> tuple[float, float]:
    """(host us per call, wall us per call) for n back-to-back calls."""
    with ctx():  # a fresh context each time: sdpa_kernel() is a one-shot context manager
        sync()
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        t1 = time.perf_counter_ns()
        sync()
        t2 = time.perf_counter_ns()
    return (t1 - t0) / n / 1e3, (t2 - t0) / n / 1e3


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]


def measure_shape(
    shape: tuple[int, int, int, int], *, causal: bool, n: int, rounds: int, device: str,
    backend: str | None = None,
) -> dict[str, Any]:
    import torch

    import attnforge

    b, h, s, d = shape
    q, k, v = (torch.randn(b, h, s, d, device=device, dtype=torch.bfloat16) for _ in range(3))
    expl = attnforge.explain(q, k, v, causal=causal, backend=backend)
    name = chosen_name(expl)
    row: dict[str, Any] = {"shape_bhsd": list(shape), "causal": causal, "dtype": "bfloat16", "chosen": name}
    if name is None:
        row["error"] = f"explain() named no backend: {expl!r}"[:500]
        return row
    variants: dict[str, tuple[Callable[[], Any], Any]] = {}
    try:
        raw, raw_ctx, native = raw_callable(name, q, k, v, causal)
        variants["raw"] = (raw, raw_ctx)
    except Exception as exc:
        native = "bhsd"
        row["raw_error"] = f"{type(exc).__name__}: {exc}"[:300]
    try:
        from attnforge.backends import registry

        adapter = registry.adapters().get(name) or registry.fallback()
        variants["adapter"] = (lambda: adapter(q, k, v, causal=causal, scale=None), contextlib.nullcontext)
    except Exception as exc:
        row["adapter_error"] = f"{type(exc).__name__}: {exc}"[:300]
    variants["dispatch"] = (lambda: attnforge.attention(q, k, v, causal=causal, backend=backend),
                            contextlib.nullcontext)
    if native == "bshd":
        qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))
        variants["dispatch_native"] = (
            lambda: attnforge.attention(qs, ks, vs, causal=causal, layout="bshd", backend=backend),
            contextlib.nullcontext,
        )
        try:  # what a caller holding bhsd tensors pays to call the kernel by hand: the views, both ways
            raw_views, raw_ctx, _ = raw_callable(name, q, k, v, causal, bhsd_views=True)
            variants["raw_bhsd"] = (raw_views, raw_ctx)
        except Exception as exc:
            row["raw_bhsd_error"] = f"{type(exc).__name__}: {exc}"[:300]
    variants["empty_loop"] = (lambda: None, contextlib.nullcontext)

    for fn, ctx in variants.values():  # warm-up: JIT, autotuning, caches, the dispatcher's choice cache
        for _ in range(3):
            time_variant(fn, ctx, n)
    host: dict[str, list[float]] = {v: [] for v in variants}
    wall: dict[str, list[float]] = {v: [] for v in variants}
    names = list(variants)
    for r in range(rounds):
        for i in range(len(names)):
            vname = names[(i + r) % len(names)]
            fn, ctx = variants[vname]
            hu, wu = time_variant(fn, ctx, n)
            host[vname].append(hu)
            wall[vname].append(wu)
    row["variants"] = {
        v: {
            "host_us_median": statistics.median(host[v]),
            "host_us_p10": pct(host[v], 0.1),
            "host_us_p90": pct(host[v], 0.9),
            "wall_us_median": statistics.median(wall[v]),
        }
        for v in variants
    }
    med = {v: row["variants"][v]["host_us_median"] for v in variants}
    if "raw" in med:
        row["overhead_vs_raw_us"] = med["dispatch"] - med["raw"]
        if "dispatch_native" in med:
            row["overhead_native_layout_vs_raw_us"] = med["dispatch_native"] - med["raw"]
    if "raw_bhsd" in med:
        row["overhead_bhsd_vs_raw_bhsd_us"] = med["dispatch"] - med["raw_bhsd"]
    if "adapter" in med:
        row["overhead_vs_adapter_us"] = med["dispatch"] - med["adapter"]
    if "raw" in variants:
        with torch.no_grad(), variants["raw"][1]():
            a = first(variants["raw"][0]())
        out = attnforge.attention(q, k, v, causal=causal, backend=backend)
        a_bhsd = a.transpose(1, 2) if native == "bshd" else a
        row["dispatch_output_bit_identical_to_raw"] = bool(torch.equal(out, a_bhsd))
        row["max_abs_diff_vs_raw"] = (out.float() - a_bhsd.float()).abs().max().item()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--calls", type=int, default=100, help="calls per timed loop (N)")
    ap.add_argument("--rounds", type=int, default=40, help="interleaved rounds (R)")
    ap.add_argument("--target-us", type=float, default=5.0)
    ap.add_argument(
        "--device", default="cuda", help="cuda (the real measurement); cpu only to test this script"
    )
    ap.add_argument("--backend", default=None, help="force this backend (the route is the same hot path)")
    ap.add_argument("--shapes", default="", help="B,H,S,D;B,H,S,D (default: all of SHAPES)")
    ap.add_argument("--causal", choices=("both", "on", "off"), default="both")
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in part.split(",")) for part in args.shapes.split(";") if part] or SHAPES
    causals = {"both": (False, True), "on": (True,), "off": (False,)}[args.causal]

    import torch

    import attnforge

    report: dict[str, Any] = {
        "what": "attnforge.attention dispatch overhead per call",
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "attnforge": attnforge.__version__,
        "calls_per_loop": args.calls,
        "rounds": args.rounds,
        "target_us": args.target_us,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": [],
    }
    print(
        f"{'shape [B,H,S,D]':<20} {'causal':<6} {'chosen':<16} {'raw us':>8} {'adapter':>8} {'dispatch':>9} "
        f"{'native':>8} {'overhead':>9}  identical"
    )
    for shape in shapes:
        for causal in causals:
            try:
                row = measure_shape(
                    shape, causal=causal, n=args.calls, rounds=args.rounds, device=args.device,  # type: ignore[arg-type]
                    backend=args.backend,
                )
            except Exception as exc:
                row = {
                    "shape_bhsd": list(shape),
                    "causal": causal,
                    "error": f"{type(exc).__name__}: {exc}"[:500],
                }
            report["rows"].append(row)
            var = row.get("variants", {})

            def us(v: str, var: dict[str, Any] = var) -> str:
                return f"{var[v]['host_us_median']:.1f}" if v in var else "-"

            ov = row.get("overhead_vs_raw_us", row.get("overhead_vs_adapter_us"))
            if "overhead_bhsd_vs_raw_bhsd_us" in row:
                print(f"    bhsd vs the kernel called on transposed views by hand: "
                      f"{row['overhead_bhsd_vs_raw_bhsd_us']:+.1f} us; bshd vs raw: "
                      f"{row.get('overhead_native_layout_vs_raw_us', float('nan')):+.1f} us")
            print(
                f"{list(shape)!s:<20} {causal!s:<6} {row.get('chosen') or '-':<16} {us('raw'):>8} "
                f"{us('adapter'):>8} {us('dispatch'):>9} {us('dispatch_native'):>8} "
                f"{(f'{ov:+.1f}' if isinstance(ov, float) else '-'):>9}  "
                f"{row.get('dispatch_output_bit_identical_to_raw', '-')}  {row.get('error', '')}"
            )
            args.out.write_text(json.dumps(report, indent=2, default=str))
    overheads = [r["overhead_vs_raw_us"] for r in report["rows"] if "overhead_vs_raw_us" in r]
    report["summary"] = {
        "median_overhead_vs_raw_us": statistics.median(overheads) if overheads else None,
        "max_overhead_vs_raw_us": max(overheads) if overheads else None,
        "within_target": bool(overheads) and max(overheads) <= args.target_us,
    }
    args.out.write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps(report["summary"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
