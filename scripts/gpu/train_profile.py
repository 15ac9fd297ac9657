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

``--padded``: ``models_e2e.py``'s padded forward instead (4 rows of 2048 tokens, row 1 left-padded by 292, no
grad), where attention() takes FlashAttention-4's varlen kernel (2 calls, 0.51 ms against cuDNN's 1.59 ms on the
H200, 2026-11-29) and still read 0.979-0.985x: each wait is listed with the Python frames that issued it
(``waits_by_stack``), and ``device_idle_ms`` is the step's span on the device less the time a kernel ran (the
device waiting on the host).

``--padded-train``: a train step on that padded batch (``labels``, the padding ignored), where a call autograd records
leaves the rows that see no key to SDPA's kernels when the adapter's probe finds their gradients right.

``--rounds``: the paired rounds (5, as ``models_e2e.py``).

Usage: ``python scripts/gpu/train_profile.py --out train_profile.json [--only llama3-8b]
[--prefill | --padded | --padded-train] [--rounds 9] [--device cpu]``.
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


#: frames worth naming in a wait's stack: the code between the model and the device
_OWN = ("attnforge", "transformers", "flash_attn", "cutlass", "tvm_ffi", "train_profile", "models_e2e")


def _waits_by_stack(prof: Any) -> list[dict[str, Any]]:
    """Each host call that waits on the device, grouped by the Python frames that issued it (the innermost
    :data:`_OWN` frames first): where a sync in the step comes from."""
    out = []
    for e in prof.key_averages(group_by_stack_n=12):
        if e.key not in _WAITS:
            continue
        frames = [f for f in (e.stack or []) if any(o in f for o in _OWN)][:6]
        out.append({"call": e.key, "count": e.count, "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 3),
                    "frames": frames})
    return sorted(out, key=lambda r: -r["self_cpu_ms"])


def _device_idle_ms(prof: Any) -> float:
    """The step's span on the device (first kernel's start to last kernel's end) less the time some kernel or
    copy ran: the device waiting on the host."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start)
    if not spans:
        return 0.0
    busy, (lo, hi) = 0.0, spans[0]
    for a, b in spans[1:]:
        if a > hi:
            busy, lo, hi = busy + hi - lo, a, b
        else:
            hi = max(hi, b)
    busy += hi - lo
    return round((spans[-1][1] - spans[0][0] - busy) / 1e3, 4) if spans else 0.0


def _profile(torch: Any, step: Any) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if e2e.DEV == "cuda" else [])
    step()
    e2e._sync(torch)
    with profile(activities=acts, with_stack=True) as prof:
        t0 = time.perf_counter()
        step()
        e2e._sync(torch)
        wall = (time.perf_counter() - t0) * 1e3
    ev = prof.key_averages()
    kernels = sum(e.self_device_time_total for e in ev if e.device_type.name == "CUDA") / 1e3 if acts[1:] else 0.0
    by_kernel = sorted(((e.key[:90], e.count, round(e.self_device_time_total / 1e3, 4)) for e in ev
                        if e.device_type.name == "CUDA" and e.self_device_time_total > 0), key=lambda r: -r[2])
    return {"wall_ms": wall, "kernel_ms": kernels, "device_idle_ms": _device_idle_ms(prof),
            "kernels": by_kernel[:25],
            "waits": {e.key: [e.count, round(e.self_cpu_time_total / 1e3, 3)] for e in ev if e.key in _WAITS},
            "waits_by_stack": _waits_by_stack(prof),
            "ops": {e.key: e.count for e in ev if e.key.startswith("aten::")}}


def _one(torch: Any, name: str, *, prefill: bool = False, padded: bool = False, padded_train: bool = False,
         rounds: int = 5) -> dict[str, Any]:
    """One decoder's paired train step (``prefill``: generate's prefill; ``padded``: the padded forward;
    ``padded_train``: a train step on the padded batch), its profile per implementation, and explain() of its fwd+bwd
    class."""
    model, _ = e2e.decoder_model(torch, name)
    batch, seq = (2, 48) if e2e.SMALL else (4, 2048)
    ids = torch.randint(0, 2048, (batch, seq), device=e2e.DEV)
    kw = e2e._generate_inputs(torch, batch)[0]
    mask = torch.ones_like(ids)
    mask[1, : seq // 7] = 0  # models_e2e.py's padded row

    def step() -> None:
        if prefill:
            e2e._generate_run(torch, model, kw, 1)
            return
        if padded:
            with torch.no_grad():
                model(input_ids=ids, attention_mask=mask)
            return
        if padded_train:
            out = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
            out.loss.backward()
            model.zero_grad(set_to_none=True)
            return
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        model.zero_grad(set_to_none=True)

    impls = ("sdpa", "attnforge")
    use = {impl: (lambda impl=impl: model.set_attn_implementation(impl)) for impl in impls}
    row: dict[str, Any] = {"step_ms": paired_ms(torch, step, use, rounds=rounds, reps=2)}
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
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--prefill", action="store_true", help="generate's padded prefill instead of a train step")
    mode.add_argument("--padded", action="store_true", help="models_e2e.py's padded forward instead of a train step")
    mode.add_argument("--padded-train", action="store_true", help="a train step on models_e2e.py's padded batch")
    ap.add_argument("--rounds", type=int, default=5, help="paired rounds (each: 2 timed steps per implementation)")
    args = ap.parse_args()
    import torch

    res = e2e.configure(torch, args.device)
    for name in [n for n in args.only.split(",") if n]:
        res[name] = _one(torch, name, prefill=args.prefill, padded=args.padded, padded_train=args.padded_train,
                         rounds=max(1, args.rounds))
        print(name, json.dumps(res[name], indent=1), flush=True)
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
