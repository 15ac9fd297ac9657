"""The Gemma-2-style call of issue 22 through attnforge's FlexAttention adapter against flex_attention called
directly with the same semantics, and against the exact math fallback (GPU only).

The call: softcap 50, sliding window (1024, 0), causal, B1 H8 S4096 D256, bfloat16 (issue 22: 7.09 ms through
the exact fallback, 0.25 ms through flex_attention). "direct" is ``torch.compile(flex_attention)`` with a
score_mod doing the softcap and a block mask built once (what a user would write); "adapter" is
:class:`attnforge.backends.flex.FlexAdapter` as the registry holds it; "exact" is
:func:`attnforge.backends.exact.exact_attention`. Each is the median of ``triton.testing.do_bench`` over
``--rounds`` interleaved rounds, after a warm-up that compiles. The adapter's output is also compared with the
float64 reference (max abs error) and with the direct call. Prints one JSON object.

Usage: ``PYTHONPATH=src python3 scripts/flex_features.py [--rounds 5] [--seqlen 4096] [--head-dim 256]``
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--head-dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    args = parser.parse_args()

    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from triton.testing import do_bench

    from attnforge.backends import registry
    from attnforge.backends.exact import exact_attention, reference_attention

    cap, left, s = 50.0, 1024, args.seqlen
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, args.heads, s, args.head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))

    def softcap(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return cap * torch.tanh(score / cap)

    def sliding_causal(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (kv_idx <= q_idx) & (kv_idx >= q_idx - left)

    block_mask = create_block_mask(sliding_causal, None, None, s, s, device="cuda")
    compiled = torch.compile(flex_attention, dynamic=False)
    flex = registry.adapters()["flex"]
    opts = {"softcap": cap, "window": (left, 0)}
    variants = {
        "direct": lambda: compiled(q, k, v, score_mod=softcap, block_mask=block_mask),
        "adapter": lambda: flex(q, k, v, causal=True, scale=None, **opts),
        "exact": lambda: exact_attention(q, k, v, causal=True, **opts),
    }
    outs = {name: fn() for name, fn in variants.items()}  # warm-up: compiles
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(args.rounds):
        names = list(variants)
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(do_bench(variants[name], warmup=25, rep=100))
    ref = reference_attention(q, k, v, causal=True, **opts)
    median = {name: statistics.median(t) for name, t in times.items()}
    print(json.dumps({
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "call": f"B1 H{args.heads} S{s} D{args.head_dim} bf16 causal softcap {cap} window ({left}, 0)",
        "median_ms": median, "rounds_ms": times,
        "adapter_over_direct": median["adapter"] / median["direct"],
        "exact_over_adapter": median["exact"] / median["adapter"],
        "adapter_max_abs_err_vs_fp64": float((outs["adapter"].double() - ref).abs().max()),
        "direct_max_abs_err_vs_fp64": float((outs["direct"].double() - ref).abs().max()),
        "compiled_signatures": flex.compiled_signatures, "block_masks_built": flex.block_masks_built,
    }, indent=1))


if __name__ == "__main__":
    main()
