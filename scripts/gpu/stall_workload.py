#!/usr/bin/env python3
"""No stalls (issue 30 item 3, issue 34 item 3): a random workload of attention calls over many shape classes.

``N`` calls (default 200) drawn with a fixed seed over >= 50 distinct classes: head dim 64/128/256, GQA ratios
1-8, decode (Sq 1) to prefill (Sq 4096), Sq != Sk, causal or not, softcap, sliding windows, padded bool masks,
varlen (packed sequences with ``cu_seqlens``), bf16 and fp16; forward, and forward + backward on some.

Pass 1 runs every call once as a cold process meets it (first use of each class; each call's row names the backend
``explain()`` gives it afterwards and what it compiled or traced, and the summary adds them up by backend for the
calls over 100 ms: where a restarted process's first calls spend their time); pass 2 runs the same calls
again: its longest call is "the longest call after warm-up" (target: <= 100 ms for measurement, i.e. no call
much longer than its kernel). Every output is compared with the exact math (``backend="exact"``, float32
accumulation) on the same inputs. Compiles are counted in-process: Inductor FX-graph cache misses and hits
(``torch._dynamo.utils.counters["inductor"]``) and CuTe DSL compiles (``cutlass.cute.compile`` wrapped by a
counter when FlashAttention-4 is importable). Run it twice in two processes on the same ``ATTNFORGE_HOME``: the
second must compile nothing (0 FX-graph misses, 0 CuTe compiles).

Usage: ``python scripts/gpu/stall_workload.py --out stall.json [--calls 200] [--device cpu]`` (cpu: float32 dry
run at small sizes).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any

import _timing

COMPILES = {"cute": 0}


def _count_cute_compiles() -> None:
    try:
        from cutlass import cute
    except Exception:
        return
    original = cute.compile

    def counting(*args: Any, **kwargs: Any) -> Any:
        COMPILES["cute"] += 1
        return original(*args, **kwargs)

    cute.compile = counting  # FA4 calls cute.compile(...) through the module attribute


def make_calls(n: int, seed: int, small: bool) -> list[dict[str, Any]]:
    """``n`` call specs over many classes; deterministic for ``seed``."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret
    calls = []
    for _ in range(n):
        d = rng.choice((64, 128, 256))
        hkv = rng.choice((1, 2, 4, 8))
        ratio = rng.choice((1, 2, 4, 8))
        kind = rng.choice(("prefill", "prefill", "decode", "chunk", "cross"))
        sk = rng.choice((256, 1024, 2048, 4096))
        sq = {"prefill": sk, "decode": 1, "chunk": min(512, sk), "cross": rng.choice((128, 333, 1000))}[kind]
        spec: dict[str, Any] = {
            "b": rng.choice((1, 2, 4)), "hkv": hkv, "hq": hkv * ratio, "d": d, "sq": sq, "sk": sk,
            "dtype": rng.choice(("bfloat16", "bfloat16", "float16")), "causal": kind != "cross" and rng.random() < 0.8,
            "feature": rng.choice((None, None, None, "softcap", "window", "mask", "varlen")),
            "backward": kind == "prefill" and rng.random() < 0.3, "layout": rng.choice(("bhsd", "bshd"))}
        if small:
            spec.update(b=1, hq=min(spec["hq"], 4), hkv=min(spec["hkv"], spec["hq"]), d=min(d, 32),
                        sq=min(sq, 32), sk=min(sk, 64), dtype="float32")
            spec["hkv"] = max(1, min(spec["hkv"], spec["hq"]))
            while spec["hq"] % spec["hkv"]:
                spec["hkv"] -= 1
        calls.append(spec)
    return calls


def class_of(spec: dict[str, Any]) -> tuple[Any, ...]:
    return (spec["d"], spec["hq"] // spec["hkv"], spec["sq"] == 1, spec["sq"] != spec["sk"], spec["causal"],
            spec["feature"], spec["backward"], spec["dtype"], spec["layout"])


def build(torch: Any, spec: dict[str, Any], device: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    dt = getattr(torch, spec["dtype"])
    b, hq, hkv, d, sq, sk = (spec[x] for x in ("b", "hq", "hkv", "d", "sq", "sk"))
    g = torch.Generator(device="cpu").manual_seed(hash(tuple(sorted(spec.items()))) & 0xFFFF)
    need = spec["backward"]

    def t(*shape: int) -> Any:
        return torch.randn(*shape, generator=g).to(device, dt).requires_grad_(need)

    kw: dict[str, Any] = {"causal": spec["causal"]}
    if spec["feature"] == "varlen":
        lens = [max(1, sq // 2), sq - max(1, sq // 2)] if sq > 1 else [1]
        klens = [max(1, sk // 2), sk - max(1, sk // 2)] if sq > 1 else [sk]
        lens = [x for x in lens if x > 0]
        klens = klens[: len(lens)]
        cu_q = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
        cu_k = torch.tensor([0, *torch.tensor(klens).cumsum(0).tolist()], dtype=torch.int32, device=device)
        q, k, v = t(sum(lens), hq, d), t(sum(klens), hkv, d), t(sum(klens), hkv, d)
        kw.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens), max_seqlen_k=max(klens))
        return (q, k, v), kw
    if spec["layout"] == "bshd":
        q, k, v = t(b, sq, hq, d), t(b, sk, hkv, d), t(b, sk, hkv, d)
        kw["layout"] = "bshd"
    else:
        q, k, v = t(b, hq, sq, d), t(b, hkv, sk, d), t(b, hkv, sk, d)
    if spec["feature"] == "softcap":
        kw["softcap"] = 30.0
    elif spec["feature"] == "window":
        kw["window"] = (min(255, sk - 1), 0)
    elif spec["feature"] == "mask":
        mask = torch.ones(b, 1, sq, sk, dtype=torch.bool, device=device)
        mask[0, :, :, : sk // 5] = False  # left padding of the first sequence
        kw["attn_mask"] = mask
    return (q, k, v), kw


def _compile_counts(torch: Any) -> dict[str, int]:
    """CuTe DSL compiles, Inductor FX-graph cache misses and hits, and Dynamo graphs so far in this process."""
    from torch._dynamo.utils import counters

    return {"cute": COMPILES["cute"], "inductor_fxgraph_miss": counters["inductor"]["fxgraph_cache_miss"],
            "inductor_fxgraph_hit": counters["inductor"]["fxgraph_cache_hit"],
            "dynamo_unique_graphs": counters["stats"]["unique_graphs"]}


def _first_use_facts(torch: Any, attnforge: Any, qkv: tuple[Any, ...], kw: dict[str, Any],
                     before: dict[str, int]) -> dict[str, Any]:
    """The backend ``explain()`` names for the call now, and the compiles and traces since ``before``."""
    try:
        chosen = attnforge.explain(*(t.detach() for t in qkv), **kw).chosen
    except Exception as exc:
        chosen = f"explain raised {type(exc).__name__}"
    now = _compile_counts(torch)
    return {"chosen": chosen, **{key: now[key] - before[key] for key in now if now[key] != before[key]}}


def _by_chosen(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per backend that served them: how many of ``rows``, their total and longest ms, and the compiles and traces
    their calls made."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        agg = out.setdefault(str(r.get("chosen")), {"calls": 0, "total_ms": 0.0, "longest_ms": 0.0})
        agg["calls"] += 1
        agg["total_ms"] = round(agg["total_ms"] + r["ms"], 1)
        agg["longest_ms"] = round(max(agg["longest_ms"], r["ms"]), 1)
        for key in ("cute", "inductor_fxgraph_miss", "inductor_fxgraph_hit", "dynamo_unique_graphs"):
            if key in r:
                agg[key] = agg.get(key, 0) + r[key]
    return out


def run_pass(torch: Any, attnforge: Any, calls: list[dict[str, Any]], device: str,
             check: bool) -> list[dict[str, Any]]:
    rows = []
    before = _compile_counts(torch)
    for i, spec in enumerate(calls):
        (q, k, v), kw = build(torch, spec, device)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = attnforge.attention(q, k, v, **kw)
        if spec["backward"]:
            out.float().sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        row: dict[str, Any] = {"i": i, "ms": (time.perf_counter() - t0) * 1e3, "class": repr(class_of(spec))}
        if not check:  # pass 1: what served the call and what it compiled or traced (where a first call's time went)
            row.update(_first_use_facts(torch, attnforge, (q, k, v), kw, before))
            before = _compile_counts(torch)
        if check:
            with torch.no_grad():
                ref = attnforge.attention(q.detach().float(), k.detach().float(), v.detach().float(),
                                          backend="exact", **kw).to(out.dtype)
            err = (out.detach().float() - ref.float()).abs().max().item()
            row["max_abs_err"] = err
            row["ok"] = bool(err <= (0.05 if spec["dtype"] != "float32" else 1e-4) * max(1.0, ref.abs().max().item()))
        rows.append(row)
        if not check and (i + 1) % 20 == 0:  # a pass cut short by the call's time limit still says how far it got
            print(f"pass 1: {i + 1}/{len(calls)} calls, longest {max(r['ms'] for r in rows):.0f} ms, "
                  f"CuTe compiles {COMPILES['cute']}", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    import torch

    _count_cute_compiles()
    import attnforge

    small = args.device != "cuda"
    calls = make_calls(args.calls, args.seed, small)
    classes = {class_of(c) for c in calls}
    t0 = time.perf_counter()
    first = run_pass(torch, attnforge, calls, args.device, check=False)
    pass1_s = time.perf_counter() - t0
    waited_s = _timing.waited_s(timeout_s=300)
    second = run_pass(torch, attnforge, calls, args.device, check=True)
    longest = max(second, key=lambda r: r["ms"])
    result = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
        "calls": len(calls), "classes": len(classes), "pass1_s": round(pass1_s, 2),
        "pass1_longest_ms": round(max(r["ms"] for r in first), 2),
        "pass1_over_100ms": sum(r["ms"] > 100 for r in first), "measurements_after_pass1_s": round(waited_s, 2),
        "pass1_over_100ms_by_chosen": _by_chosen([r for r in first if r["ms"] > 100]),
        "pass2_longest_ms": round(longest["ms"], 2), "pass2_longest_class": longest["class"],
        "pass2_over_100ms": sum(r["ms"] > 100 for r in second),
        "wrong": [r for r in second if not r.get("ok", True)],
        "compiles": _compile_counts(torch),
        "pass1": first, "pass2": second}
    print(json.dumps({k: v for k, v in result.items() if k not in ("pass1", "pass2")}, indent=1))
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
