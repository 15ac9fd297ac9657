#!/usr/bin/env python3
"""A tiny random Llama (transformers) and a small random Flux transformer (diffusers) on the GPU: attnforge's
integration against the model's own default attention, outputs compared and time per step measured; and a
tiny random Gemma-2 (softcap 50, sliding window 1024, D256) against its default (eager) attention.

No weights are downloaded: both models are built from configs with random weights (seed 0), bf16 on CUDA.
- Llama: ``attn_implementation="sdpa"`` (transformers' default) vs ``"attnforge"``
  (:func:`attnforge.integrations.transformers.register`), logits of one forward pass over a left-padded batch,
  and the time of one forward+backward training step.
- Flux: the default attention vs ``model.set_attention_backend("attnforge")``
  (:func:`attnforge.integrations.diffusers.register`), the output of one denoising step at 4096 image tokens.

Usage: ``python scripts/gpu/models_gpu.py --out models.json`` (run.sh `models` runs it). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from _timing import wall_ms

DEV, DT, SMALL = "cuda", "bfloat16", False


def _sync(torch: Any) -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def llama(torch: Any) -> dict[str, Any]:
    return causal_lm(torch, "llama")


def gemma2(torch: Any) -> dict[str, Any]:
    """Gemma-2's features: logit softcap 50 and a 1024-token sliding window on every other layer, D256;
    transformers' default attention for it is eager (its SDPA path cannot softcap)."""
    return causal_lm(torch, "gemma2")


def causal_lm(torch: Any, kind: str) -> dict[str, Any]:
    import transformers

    from attnforge.integrations.transformers import register

    register()
    common: dict[str, Any] = {"vocab_size": 1024, "hidden_size": 1024, "intermediate_size": 2816,
                              "num_hidden_layers": 4, "num_attention_heads": 8, "max_position_embeddings": 4096}
    if kind == "gemma2":
        cfg = transformers.Gemma2Config(**common, num_key_value_heads=4, head_dim=256, sliding_window=1024,
                                        attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
        model_cls, default = transformers.Gemma2ForCausalLM, "eager"
        label = "gemma2 (random, 4 layers, H8/KV4, D256, softcap 50, window 1024)"
    else:
        cfg = transformers.LlamaConfig(**common, num_key_value_heads=2)
        model_cls, default = transformers.LlamaForCausalLM, "sdpa"
        label = "llama (random, 4 layers, H8/KV2, D128)"
    torch.manual_seed(0)
    base = model_cls(cfg).to(DEV, getattr(torch, DT))
    seq = 64 if SMALL else 2048
    ids = torch.randint(0, 1024, (4, seq), device=DEV)
    mask = torch.ones_like(ids)
    mask[1, : seq // 7] = 0  # left padding on one row
    res: dict[str, Any] = {"model": label, "default": default, "batch": 4, "seqlen": seq}
    logits = {}
    for impl in (default, "attnforge"):
        base.set_attn_implementation(impl)  # the same weights for both
        with torch.no_grad():
            logits[impl] = base(input_ids=ids, attention_mask=mask).logits.float()
            res[f"{impl}_fwd_ms"] = wall_ms(torch, lambda: base(input_ids=ids, attention_mask=mask))
            res[f"{impl}_fwd_kernels"] = _kernels(torch, lambda: base(input_ids=ids, attention_mask=mask))

        def step() -> None:
            out = base(input_ids=ids, attention_mask=mask, labels=ids)
            out.loss.backward()
            base.zero_grad(set_to_none=True)
        res[f"{impl}_train_step_ms"] = wall_ms(torch, step, reps=5)
    valid = mask.bool()
    diff = (logits["attnforge"] - logits[default]).abs()[valid]
    res["max_abs_diff_logits"] = float(diff.max())
    res["ref_abs_max"] = float(logits[default].abs()[valid].max())
    import attnforge

    d, hkv = (256, 4) if kind == "gemma2" else (128, 2)
    q = torch.randn(4, 8, seq, d, device=DEV, dtype=getattr(torch, DT))
    kv = torch.randn(4, hkv, seq, d, device=DEV, dtype=getattr(torch, DT))
    extra = {"softcap": 50.0, "window": (1023, 0)} if kind == "gemma2" else {}
    res["attnforge_chosen_for_causal_prefill"] = attnforge.explain(q, kv, kv, causal=True, **extra).chosen
    if kind == "llama":  # the padded batch's calls: transformers' [B, 1, S, S] bool mask (causal + left padding)
        padded = torch.ones(seq, seq, dtype=torch.bool, device=DEV).tril().expand(4, 1, seq, seq).clone()
        padded[1, :, :, : seq // 7] = False
        why = attnforge.explain(q, kv, kv, attn_mask=padded)
        res["attnforge_chosen_for_padded_prefill"] = why.chosen
        res["attnforge_order_for_padded_prefill"] = list(why.order)
    return res


def _kernels(torch: Any, fn: Any, top: int = 12) -> list[dict[str, Any]]:
    """The GPU kernels of one ``fn()`` call (after a warm-up call) by total device time: where a gap between
    two implementations of the same model goes. Empty off CUDA."""
    if DEV != "cuda":
        return []
    from torch.profiler import ProfilerActivity, profile

    fn()
    _sync(torch)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        _sync(torch)
    rows = sorted(prof.key_averages(), key=lambda e: e.device_time_total, reverse=True)
    return [{"name": e.key[:120], "calls": e.count, "device_ms": round(e.device_time_total / 1e3, 4)}
            for e in rows[:top] if e.device_time_total > 0]


def flux(torch: Any) -> dict[str, Any]:
    import diffusers

    from attnforge.integrations.diffusers import register

    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=2, num_single_layers=4, attention_head_dim=128,
        num_attention_heads=8, joint_attention_dim=512, pooled_projection_dim=256,
        axes_dims_rope=(16, 56, 56)).to(DEV, getattr(torch, DT)).eval()
    n_img, side = (64, 8) if SMALL else (4096, 64)
    img_ids = torch.zeros(n_img, 3, device=DEV)
    img_ids[:, 1], img_ids[:, 2] = torch.arange(n_img) // side, torch.arange(n_img) % side
    inputs = {"hidden_states": torch.randn(1, n_img, 64, device=DEV, dtype=getattr(torch, DT)),
              "encoder_hidden_states": torch.randn(1, 512, 512, device=DEV, dtype=getattr(torch, DT)),
              "pooled_projections": torch.randn(1, 256, device=DEV, dtype=getattr(torch, DT)),
              "timestep": torch.tensor([0.5], device=DEV, dtype=getattr(torch, DT)),
              "img_ids": img_ids, "txt_ids": torch.zeros(512, 3, device=DEV)}
    res: dict[str, Any] = {"model": "flux transformer (random, 2+4 blocks, H8, D128)", "tokens": n_img + 512}
    with torch.no_grad():
        ref = model(**inputs).sample.float()
        res["default_step_ms"] = wall_ms(torch, lambda: model(**inputs))
        register()
        model.set_attention_backend("attnforge")
        got = model(**inputs).sample.float()
        res["attnforge_step_ms"] = wall_ms(torch, lambda: model(**inputs))
    res["max_abs_diff"] = float((got - ref).abs().max())
    res["ref_abs_max"] = float(ref.abs().max())
    res["rel_l2"] = float((got - ref).norm() / ref.norm())
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", help="cpu: a float32 smoke test at small sizes")
    args = ap.parse_args()
    import torch

    global DEV, DT, SMALL
    DEV, DT, SMALL = args.device, ("bfloat16" if args.device == "cuda" else "float32"), args.device != "cuda"
    name = torch.cuda.get_device_name() if DEV == "cuda" else "cpu"
    results: dict[str, Any] = {"device": name, "torch": torch.__version__}
    for name, fn in (("gemma2", gemma2), ("llama", llama), ("flux", flux)):
        try:
            results[name] = fn(torch)
        except Exception as exc:
            import traceback

            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        print(name, json.dumps(results[name], indent=1), flush=True)
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
