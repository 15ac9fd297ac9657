#!/usr/bin/env python3
"""What FlashAttention-4's backward hands its compiled kernels, for a backward replay (issue 30 item 1; the next
run's call 5 in scripts/gpu/README.md).

FA4's forward already runs from a recorded compiled call (:class:`attnforge.backends._fa4_direct.Replayer`); its
backward still goes through ``flash_attn.cute.interface._flash_attn_bwd``, whose Python work (input checks, three
compile keys, the scratch buffers) made a short fwd+bwd call host-bound on an H200: MHA 1k causal fwd+bwd, FA4's route
0.87 ms back to back against its kernel's 0.43 ms (docs/benchmarks.md, twenty-first session). In the 4.0.0b36 wheel
``_flash_attn_bwd`` calls up to three compiled functions, each from its own cache: ``_bwd_preprocess`` (dpsum,
lse_log2, and dq_accum zeroed; interface.py 2075-2140), the main kernel (``_flash_attn_bwd.compile_cache``, line
3105), and ``_bwd_postprocess_convert`` (fp32 accumulators to dq, and to dk/dv with GQA; lines 2190-2236).

This probe runs ``flash_attn_func`` forward and backward on a few shapes, the second backward with the three caches
wrapped, and writes every compiled call's arguments, each classified (:func:`classify`): one of the call's own
tensors (q, k, v, out, dout, lse, and the dq/dk/dv the backward returned), a scratch tensor allocated inside the
backward (shape, dtype, whether another compiled call of the same backward shares it), or a non-tensor value (its
type and repr). It also times ``_flash_attn_bwd`` on the host against its compiled calls alone, the gain a replay
would have. A replay needs: the slots of the call's own tensors, fresh scratch of the recorded shapes (zeros where
the source allocates zeros: dk_accum/dv_accum with GQA, lines 2656-2686), and the non-tensor values as recorded.

Usage (on the device, FA4 installed): ``python scripts/gpu/fa4_bwd_probe.py --out $OUT/fa4-bwd-probe.json``.
Without FlashAttention-4 it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

#: (name, B, Hq, Hkv, S, D, causal): MHA 1k causal (the grid's row), GQA 4 (dk/dv through the postprocess), D64
SHAPES = (
    ("mha-1k-causal", 8, 16, 16, 1024, 128, True),
    ("gqa4-2k-causal", 2, 32, 8, 2048, 128, True),
    ("mha-2k-d64", 4, 16, 16, 2048, 64, False),
)
#: the caches ``_flash_attn_bwd`` takes its compiled functions from (attribute owners in ``interface``)
CACHES = ("_bwd_preprocess", "_flash_attn_bwd", "_bwd_postprocess_convert")


def classify(arg: Any, own: dict[str, Any], scratch: dict[int, dict[str, Any]], call_index: int) -> dict[str, Any]:
    """One compiled-call argument: ``{"own": name}`` for a tensor that is (the same memory, shape and strides as)
    one of ``own``; ``{"scratch": id}`` for any other tensor, with its shape, dtype and the compiled calls that
    received it collected in ``scratch`` (keyed by data pointer); else ``{"value": repr, "type": name}``."""
    if hasattr(arg, "data_ptr") and hasattr(arg, "stride") and hasattr(arg, "shape"):
        for name, t in own.items():
            if (t is not None and arg.data_ptr() == t.data_ptr() and tuple(arg.shape) == tuple(t.shape)
                    and tuple(arg.stride()) == tuple(t.stride())):
                return {"own": name}
        entry = scratch.setdefault(arg.data_ptr(), {"id": len(scratch), "shape": list(arg.shape),
                                                    "stride": list(arg.stride()), "dtype": str(arg.dtype),
                                                    "calls": []})
        if call_index not in entry["calls"]:
            entry["calls"].append(call_index)
        return {"scratch": entry["id"], "shape": list(arg.shape), "dtype": str(arg.dtype)}
    return {"value": repr(arg)[:160], "type": type(arg).__name__}


class _Wrapped:
    """A compile cache whose handed-out functions record their arguments and host time into ``seen``."""

    def __init__(self, cache: Any, owner: str, seen: list[dict[str, Any]]) -> None:
        self.cache, self.owner, self.seen = cache, owner, seen

    def __contains__(self, key: Any) -> bool:
        return key in self.cache

    def __setitem__(self, key: Any, fn: Any) -> None:
        self.cache[key] = fn

    def __getitem__(self, key: Any) -> Callable[..., Any]:
        fn = self.cache[key]

        def recorded(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            self.seen.append({"cache": self.owner, "args": args, "kwargs": kwargs,
                              "host_us": (time.perf_counter() - start) * 1e6})
            return result

        return recorded


def probe(torch: Any, interface: Any, flash_attn_func: Any, shape: tuple[Any, ...]) -> dict[str, Any]:
    """One shape: the recorded compiled calls of its second backward, classified, and the host times."""
    name, b, hq, hkv, s, d, causal = shape
    gen = torch.Generator(device="cuda").manual_seed(0)

    def leaf(h: int) -> Any:
        return torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_(True)

    q, k, v = leaf(hq), leaf(hkv), leaf(hkv)
    dout = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    for _ in range(2):  # compile, then warm
        out = flash_attn_func(q, k, v, causal=causal)
        out = out[0] if isinstance(out, tuple) else out
        torch.autograd.grad(out, (q, k, v), dout)
    out, lse = interface._flash_attn_fwd(q.detach(), k.detach(), v.detach(), causal=causal, return_lse=True)[:2]
    seen: list[dict[str, Any]] = []
    owners = {n: getattr(interface, n) for n in CACHES}
    originals = {n: f.compile_cache for n, f in owners.items()}
    torch.cuda.synchronize()
    try:
        for n, f in owners.items():
            f.compile_cache = _Wrapped(originals[n], n, seen)
        start = time.perf_counter()
        result = interface._flash_attn_bwd(q.detach(), k.detach(), v.detach(), out, dout, lse,
                                           d ** -0.5, causal, 0.0)
        bwd_host_us = (time.perf_counter() - start) * 1e6
    finally:
        for n, f in owners.items():
            f.compile_cache = originals[n]
    torch.cuda.synchronize()
    dq, dk, dv = result[:3]
    own = {"q": q, "k": k, "v": v, "out": out, "dout": dout, "lse": lse, "dq": dq, "dk": dk, "dv": dv}
    scratch: dict[int, dict[str, Any]] = {}
    calls = [{"cache": c["cache"], "host_us": round(c["host_us"], 1),
              "args": [classify(a, own, scratch, i) for a in c["args"]],
              "kwargs": sorted(c["kwargs"])} for i, c in enumerate(seen)]
    # the same backward again, unwrapped, for its host time alone
    torch.cuda.synchronize()
    start = time.perf_counter()
    interface._flash_attn_bwd(q.detach(), k.detach(), v.detach(), out, dout, lse, d ** -0.5, causal, 0.0)
    plain_host_us = (time.perf_counter() - start) * 1e6
    torch.cuda.synchronize()
    return {"shape": name, "b": b, "hq": hq, "hkv": hkv, "s": s, "d": d, "causal": causal,
            "bwd_host_us_recorded": round(bwd_host_us, 1), "bwd_host_us": round(plain_host_us, 1),
            "compiled_host_us": round(sum(c["host_us"] for c in seen), 1), "calls": calls,
            "scratch": sorted(scratch.values(), key=lambda e: e["id"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    try:
        import torch
        from flash_attn.cute import flash_attn_func, interface
    except Exception as exc:
        print(f"fa4_bwd_probe: FlashAttention-4 is not importable here ({type(exc).__name__}: {exc})",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("fa4_bwd_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    import importlib.metadata as md

    rows = []
    for shape in SHAPES:
        try:
            rows.append(probe(torch, interface, flash_attn_func, shape))
        except Exception as exc:
            rows.append({"shape": shape[0], "error": f"{type(exc).__name__}: {exc}"[:500]})
        print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("calls", "scratch")}))
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "flash_attn_4": md.version("flash-attn-4"), "rows": rows}
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
