"""A tiny Llama's ``generate`` with ``attn_implementation="attnforge"`` next to plain ``"sdpa"``, after the
README's own flow (``attnforge verify``, then ``attnforge bench``) has stored records for the dispatcher.

Usage: ``python3 scripts/bench_generate.py [--device cpu] [--home DIR] [--skip-setup] [--tokens 20]
[--rounds 5] [--json]`` (PYTHONPATH=src when running from a checkout). Results: docs/integrations.md.

1. Setup (unless ``--skip-setup``): ``python -m attnforge verify`` and ``python -m attnforge bench --device D``
   with ``ATTNFORGE_HOME`` set to ``--home`` (a fresh temp dir by default), so the dispatcher decides from
   records of this machine and nothing else.
2. Two copies of one random tiny Llama (the same weights), one per attention implementation, in this process.
   One warm-up ``generate`` each (first-call costs: compilation, record loading), then ``--rounds`` rounds that
   time one greedy ``generate`` of ``--tokens`` new tokens per implementation, interleaved, so that both see the
   same machine load. Reported: the median time per implementation, the ratio of the medians, the median of the
   per-round ratios (paired: robust to load that changes between rounds), the spread (min..max), whether both
   produced the same tokens, and which backend attnforge chose for the prefill and a decode step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _setup(home: Path, device: str) -> list[dict[str, Any]]:
    from attnforge._system.runner import SubprocessRunner

    env = {**os.environ, "ATTNFORGE_HOME": str(home)}
    steps = []
    for argv in ([sys.executable, "-m", "attnforge", "verify"],
                 [sys.executable, "-m", "attnforge", "bench", "--device", device]):
        done = SubprocessRunner().run(argv, env=env, timeout_s=1800)
        steps.append({"argv": " ".join(argv[3:]), "returncode": done.returncode, "duration_s": done.duration_s})
        if done.returncode not in (0, 1):  # 1: only the CPU fallback runs here, still records
            sys.stderr.write(done.output[-4000:])
            raise SystemExit(f"error: {' '.join(argv[1:])} failed with exit code {done.returncode}")
    return steps


def _model(impl: str, device: str) -> Any:
    import torch
    import transformers

    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation=impl).to(device).eval()


def _generate(model: Any, ids: Any, tokens: int) -> tuple[float, list[int]]:
    start = time.perf_counter()
    out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0)
    return time.perf_counter() - start, out[0].tolist()


def _chosen(device: str) -> dict[str, str]:
    """What attnforge picks for this model's prefill and decode calls (q ``[1, 4, S, 16]``, k/v 2 heads)."""
    import torch

    import attnforge

    picks = {}
    for label, sq, sk in (("prefill", 8, 8), ("decode", 1, 20)):
        q = torch.randn(1, 4, sq, 16, device=device)
        k = torch.randn(1, 2, sk, 16, device=device)
        why = attnforge.explain(q, k, k, causal=sq > 1)
        picks[label] = f"{why.chosen} ({why.basis[0] if why.basis else 'no basis'})"
    return picks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--home", type=Path, default=None, help="ATTNFORGE_HOME (default: a fresh temp dir)")
    parser.add_argument("--skip-setup", action="store_true", help="use --home's records as they are")
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="attnforge-bench-generate-"))
    steps = [] if args.skip_setup else _setup(home, args.device)
    os.environ["ATTNFORGE_HOME"] = str(home)  # read by the dispatcher on its first call, below

    import torch

    from attnforge.integrations import transformers as tf_integration

    tf_integration.register()
    models = {impl: _model(impl, args.device) for impl in ("sdpa", "attnforge")}
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1)).to(args.device)
    warmup = {impl: _generate(model, ids, args.tokens)[0] for impl, model in models.items()}
    times: dict[str, list[float]] = {impl: [] for impl in models}
    outputs: dict[str, list[int]] = {}
    for _ in range(args.rounds):
        for impl, model in models.items():
            duration_s, outputs[impl] = _generate(model, ids, args.tokens)
            times[impl].append(duration_s)
    median = {impl: statistics.median(ts) for impl, ts in times.items()}
    result = {
        "device": args.device, "home": str(home), "setup": steps, "tokens": args.tokens, "rounds": args.rounds,
        "torch": torch.__version__, "warmup_s": warmup, "median_s": median,
        "spread_s": {impl: [min(ts), max(ts)] for impl, ts in times.items()},
        "ratio": median["attnforge"] / median["sdpa"],
        "paired_ratio": statistics.median(a / b for a, b in zip(times["attnforge"], times["sdpa"], strict=True)),
        "same_tokens": outputs["sdpa"] == outputs["attnforge"],
        "chosen": _chosen(args.device),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for step in steps:
        print(f"setup: attnforge {step['argv']} -> exit {step['returncode']} in {step['duration_s']:.1f} s")
    for impl in models:
        lo, hi = result["spread_s"][impl]
        print(f"{impl:9} generate {args.tokens} tokens: median {median[impl] * 1e3:.1f} ms "
              f"(min {lo * 1e3:.1f}, max {hi * 1e3:.1f}; warm-up {warmup[impl] * 1e3:.1f} ms)")
    print(f"ratio attnforge / sdpa: {result['ratio']:.2f}x of the medians, {result['paired_ratio']:.2f}x median of"
          f" the per-round ratios; same tokens: {result['same_tokens']}")
    for label, pick in result["chosen"].items():
        print(f"attnforge {label}: {pick}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
