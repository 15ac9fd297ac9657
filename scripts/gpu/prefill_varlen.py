"""A padded batch's prefill attention call three ways, per length: transformers' SDPA function on the causal mask
(the default), ``attn_implementation="attnforge"`` with the mask (the route before 2026-11-29's varlen one), and
``"attnforge"`` as varlen sequences (:func:`attnforge.integrations.transformers._padded_prefill`).

Llama-3-8B's attention geometry (32 query heads, 8 K/V heads, head dim 128, bf16), 4 prompts, row 1 left-padded by
``S // 7`` tokens as ``models_e2e.py``'s batch; q/k/v ``[B, H, S, D]`` views of ``[B, S, H, D]`` storage, as a
projection's ``view(...).transpose(1, 2)`` gives them. One mask object per length, built by the integration's mask
builder (what a model's forward passes to each layer). Each call is timed back to back (``_timing.measure_many_ms``:
CUDA events, interleaved rounds) with the L2 flushed, host time included. Outputs are compared on the real rows.

    python prefill_varlen.py [--lengths 128,256,...] [--out prefill-varlen.json]

On a CPU (a dry run) it runs tiny widths; there only the exact math serves varlen, so the third way is the second.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
from collections.abc import Iterator
from typing import Any

from _timing import measure_many_ms


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="128,256,512,1024,2048,4096")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--out", default="prefill-varlen.json")
    args = ap.parse_args()

    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    from attnforge.integrations import transformers as integration

    integration.register()
    cuda = torch.cuda.is_available()
    dev, dt = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    hq, hkv, d = (32, 8, 128) if cuda else (4, 2, 16)

    class Module(torch.nn.Module):
        is_causal = True
        num_key_value_groups = hq // hkv
        layer_idx = 0
        training = False

    module = Module()
    build = integration._mask_builder(sdpa_mask, causal_mask_function)
    rows: list[dict[str, Any]] = []
    for s in (int(x) for x in args.lengths.split(",")):
        b = args.batch
        g = torch.Generator(device=dev).manual_seed(s)
        q, k, v = (torch.randn(b, s, h, d, device=dev, dtype=dt, generator=g).transpose(1, 2)
                   for h in (hq, hkv, hkv))
        padding = torch.ones(b, s, dtype=torch.bool, device=dev)
        padding[1, : s // 7] = False
        mask = build(batch_size=b, q_length=s, kv_length=s, mask_function=causal_mask_function,
                     attention_mask=padding, device=dev)

        forward_args = (module, q, k, v, mask)
        fns = {"default": functools.partial(_forward, sdpa_attention_forward, forward_args),
               "attnforge-masked": functools.partial(_forward, integration.attention_forward, forward_args,
                                                     integration=integration, minimum=1 << 40),
               "attnforge-varlen": functools.partial(_forward, integration.attention_forward, forward_args,
                                                     integration=integration, minimum=1)}
        with torch.no_grad():
            outs = {name: fn().float() for name, fn in fns.items()}  # first calls: compiles, the runs read
            real = padding[:, :, None, None].expand_as(outs["default"])
            row: dict[str, Any] = {"seqlen": s, "batch": b, "heads": [hq, hkv], "head_dim": d, "dtype": str(dt)}
            for name in ("attnforge-masked", "attnforge-varlen"):
                diff = (outs[name] - outs["default"])[real]
                row[f"{name}_max_abs_diff"] = float(diff.abs().max())
            with _varlen_min(integration, 1):
                row["varlen_taken"] = integration._padded_prefill(q, k, v, mask, {"scale": None}) is not None
            timed = measure_many_ms(torch, fns, set_bytes=3 * q.numel() * q.element_size())
        row.update({name: t.get("median_ms", t) for name, t in timed.items()})
        row["spread"] = {name: [t.get("lo_ms"), t.get("hi_ms")] for name, t in timed.items()}
        for name in ("attnforge-masked", "attnforge-varlen"):
            if isinstance(row[name], float) and isinstance(row["default"], float):
                row[f"speedup_{name}"] = round(row["default"] / row[name], 3)
        rows.append(row)
        print(json.dumps({k2: row[k2] for k2 in row if k2 != "spread"}), flush=True)
    out = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__, "rows": rows}
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
    return 0


@contextlib.contextmanager
def _varlen_min(integration: Any, minimum: int) -> Iterator[None]:
    """``integration.PREFILL_VARLEN_MIN`` set to ``minimum`` for the block (1: the varlen route wherever it applies;
    a huge value: never), put back after it."""
    saved, integration.PREFILL_VARLEN_MIN = integration.PREFILL_VARLEN_MIN, minimum
    try:
        yield
    finally:
        integration.PREFILL_VARLEN_MIN = saved


def _forward(fn: Any, args: tuple[Any, ...], *, integration: Any = None, minimum: int = 0) -> Any:
    """``fn(module, q, k, v, mask)``, an ``AttentionInterface`` function (transformers' SDPA one, the default, or
    ``"attnforge"``'s, with the varlen route's threshold at ``minimum`` in ``integration``): its output."""
    with _varlen_min(integration, minimum) if integration is not None else contextlib.nullcontext():
        return fn(*args, dropout=0.0, scaling=None)[0]


if __name__ == "__main__":
    sys.exit(main())
