#!/usr/bin/env python3
"""FlexAttention and short GQA queries: which (Hq, Hkv, Sq, Sk, D, grad, causal) compile on this GPU.

Each case runs attnforge's FlexAttention adapter with an empty compiled cache (a fresh compile) against the
float64 reference and prints ``ok err=<max abs error>`` or the exception. On an H100 with torch 2.11 it found
that a causal BlockMask with Hq != Hkv fails to lower below Sq 128 (``runtime.toml``:
``gqa_masked_min_seqlen_q``; docs/data/h100_2026-11-25-rerun/flex-gqa-short-q.txt). Recent attnforge declines
those calls for flex, so this script calls the adapter directly, past the capability check.

Usage (GPU machine, attnforge importable): python scripts/gpu/flex_gqa.py
"""

from __future__ import annotations

import dataclasses
import itertools

import torch
import torch._dynamo

from attnforge.backends import registry
from attnforge.backends.exact import reference_attention


def main() -> None:
    flex = registry.adapters()["flex"]
    for (hq, hkv), (sq, sk), d, grad, causal in itertools.product(
            ((8, 2), (8, 8)), ((96, 160), (160, 96), (128, 256), (100, 100), (256, 256)), (64, 128), (False, True),
            (True, False)):
        torch._dynamo.reset()
        adapter = dataclasses.replace(flex, _compiled={})  # a fresh compiled cache: every case compiles
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(2, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(grad)
                   for h, s in ((hq, sq), (hkv, sk), (hkv, sk)))
        try:
            out = adapter(q, k, v, causal=causal, scale=None)
            ref = reference_attention(q.detach(), k.detach(), v.detach(), causal=causal, scale=None)
            err = float((out.detach().double() - ref).abs().max())
            if grad:
                torch.autograd.grad(out.float().sum(), (q, k, v))
            res = f"ok err={err:.3g}"
        except Exception as exc:  # the point is to record what fails
            res = "ERR " + type(exc).__name__ + ": " + str(exc).splitlines()[0][:120]
        print(f"hq={hq} hkv={hkv} sq={sq} sk={sk} d={d} grad={grad} causal={causal}: {res}", flush=True)


if __name__ == "__main__":
    main()
