#!/usr/bin/env python3
"""Where a decoder's train step differs between transformers' SDPA and ``"attnforge"`` when both run SDPA's
kernel (issue 30 item 5): the Llama-3-8B- and Qwen2.5-shaped train steps read 0.975-0.998x in every run of
2026-11-28/29 while ``explain()`` chose plain SDPA for their fwd+bwd class.

Per implementation: the step timed as ``models_e2e.py`` times it (``paired_ms``, interleaved), then one step under
``torch.profiler``: the wall ms, the device ms of all kernels, the host calls that wait on the device
(``cudaDeviceSynchronize``, ``cudaStreamSynchronize``, ``cudaMemcpyAsync``), and the ops whose counts differ.

``--prefill``: the same for ``generate``'s prefill instead (``models_e2e.py``'s padded batch of 4 prompts of 1024
tokens, one new token), where the 2026-11-29 figures read 0.985-0.988x with SDPA chosen on both sides; the
profile adds the kernels' device time by name.

Usage: ``python scripts/gpu/train_profile.py --out train_profile.json [--only llama3-8b] [--prefill] [--device cpu]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import models_e2e as e2e
from _timing import paired_ms

_WAITS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaMemcpyAsync", "cudaEventSynchronize")


def _profile(torch: Any, step: Any) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if e2e.DEV == "cuda" else [])
    step()
    e2e._sync(torch)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        step()
        e2e._sync(torch)
        wall = (time.perf_counter() - t0) * 1e3
    ev = prof.key_averages()
    kernels = sum(e.self_device_time_total for e in ev if e.device_type.name == "CUDA") / 1e3 if acts[1:] else 0.0
    by_kernel = sorted(((e.key[:90], e.count, round(e.self_device_time_total / 1e3, 4)) for e in ev
                        if e.device_type.name == "CUDA" and e.self_device_time_total > 0), key=lambda r: -r[2])
    return {"wall_ms": wall, "kernel_ms": kernels, "kernels": by_kernel[:25],
            "waits": {e.key: [e.count, round(e.self_cpu_time_total / 1e3, 3)] for e in ev if e.key in _WAITS},
            "ops": {e.key: e.count for e in ev if e.key.startswith("aten::")}}


def _one(torch: Any, name: str, *, prefill: bool = False) -> dict[str, Any]:
    """One decoder's paired train step (``prefill``: generate's prefill), its profile per implementation, and
    explain() of its fwd+bwd class."""
    model, _ = e2e.decoder_model(torch, name)
    batch, seq = (2, 48) if e2e.SMALL else (4, 2048)
    ids = torch.randint(0, 2048, (batch, seq), device=e2e.DEV)
    kw = e2e._generate_inputs(torch, batch)[0]

    def step() -> None:
        if prefill:
            e2e._generate_run(torch, model, kw, 1)
            return
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        model.zero_grad(set_to_none=True)

    impls = ("sdpa", "attnforge")
    use = {impl: (lambda impl=impl: model.set_attn_implementation(impl)) for impl in impls}
    row: dict[str, Any] = {"step_ms": paired_ms(torch, step, use, reps=2)}
    for impl in impls:
        use[impl]()
        row[impl] = _profile(torch, step)
    ops_a, ops_b = row["sdpa"].pop("ops"), row["attnforge"].pop("ops")
    row["ops_differ"] = {k: [ops_a.get(k, 0), ops_b.get(k, 0)] for k in sorted(set(ops_a) | set(ops_b))
                         if ops_a.get(k, 0) != ops_b.get(k, 0)}
    try:
        import attnforge

        dt = getattr(torch, e2e.DT)
        q = torch.randn(batch, 32, seq, 128, device=e2e.DEV, dtype=dt, requires_grad=True)
        kv = torch.randn(batch, 8, seq, 128, device=e2e.DEV, dtype=dt, requires_grad=True)
        why = attnforge.explain(q, kv, kv, causal=True)
        row["explain_fwd_bwd"] = [why.chosen, list(why.order), list(why.basis)[:3]]
    except Exception as exc:
        row["explain_fwd_bwd"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", help="cpu: a float32 dry run at tiny sizes")
    ap.add_argument("--only", default="llama3-8b,qwen2.5-7b")
    ap.add_argument("--prefill", action="store_true", help="generate's padded prefill instead of a train step")
    args = ap.parse_args()
    import torch

    res = e2e.configure(torch, args.device)
    for name in [n for n in args.only.split(",") if n]:
        res[name] = _one(torch, name, prefill=args.prefill)
        print(name, json.dumps(res[name], indent=1), flush=True)
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
