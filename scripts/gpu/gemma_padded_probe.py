#!/usr/bin/env python3
"""Where Gemma-2's padded forward loses to eager when attnforge hands every call to Gemma's own eager function.

The thirty-ninth session (H200, FlexAttention not verified) timed a 2-layer Gemma-2-9B-shaped decoder's padded
forward through ``"attnforge"`` at 0.974x of eager, every softcap call handed to ``eager_attention_forward``
(logits equal). The calls are the same; what differs is the mask: ``"attnforge"`` builds it with transformers'
``sdpa_mask``, whose causal-skip check reads the 2D padding mask on the host (a sync, once per mask: the full and
the sliding one), where eager's ``eager_mask`` never asks. This times, interleaved in the same rounds: eager,
``"attnforge"``, and ``"attnforge"`` with that check answered False without reading the mask (no sync), and counts
each one's host syncs. ``--device cpu`` is a dry run at tiny sizes. Prints JSON; ``--out`` writes it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import models_e2e as e2e
from _timing import paired_ms


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    import torch
    from transformers import masking_utils

    res: dict[str, Any] = e2e.configure(torch, args.device)
    model, _ = e2e.decoder_model(torch, "gemma2-9b")
    batch, seq = (2, 48) if e2e.SMALL else (4, 2048)
    ids = torch.randint(0, 2048, (batch, seq), device=e2e.DEV)
    mask = torch.ones_like(ids)
    mask[1, : seq // 7] = 0
    original = masking_utils._ignore_causal_mask_sdpa

    def use(impl: str, skip_check: bool = True) -> Any:
        def switch() -> None:
            masking_utils._ignore_causal_mask_sdpa = original if skip_check else (lambda *a, **k: False)
            model.set_attn_implementation(impl)
        return switch

    variants = {"eager": use("eager"), "attnforge": use("attnforge"),
                "attnforge-no-skip-check": use("attnforge", skip_check=False)}

    def fwd() -> Any:
        return model(input_ids=ids, attention_mask=mask).logits

    with torch.no_grad():
        outs = {}
        for name, switch in variants.items():
            switch()
            outs[name] = fwd()
            res[f"{name}_syncs"] = e2e._syncs(torch, fwd)
        valid = mask.bool()
        res["max_abs_diff_vs_eager"] = {n: float((o - outs["eager"])[valid].abs().max()) for n, o in outs.items()}
        samples: dict[str, list[float]] = {}
        res["ms"] = paired_ms(torch, fwd, variants, reps=3, rounds=max(1, args.rounds), samples=samples)
        res["samples_ms"] = samples
    masking_utils._ignore_causal_mask_sdpa = original
    res["speedup_vs_eager"] = {n: res["ms"]["eager"] / ms for n, ms in res["ms"].items()}
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
