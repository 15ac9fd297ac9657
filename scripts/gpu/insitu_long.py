#!/usr/bin/env python3
"""The in-situ check on long calls (issue 30 item 4; ``attnforge.dispatch.insitu``, ``638bdbe``), measured in a
model: a Wan-2.1 (1.3B) block through diffusers' ``"attnforge"`` backend for ``--steps`` denoising steps after its
warm-up, each step timed between two device syncs.

Wan's self-attention (32760 tokens, 8-17 ms a call on an H200) is longer than ``insitu.MAX_CALL_MS``, so once a
non-SDPA route has served ``insitu.SAMPLE_AFTER`` calls of its class the check times the class's next live calls,
``insitu.SLICES`` on SDPA and as many on the route. The script reports:

- every step's ms, and which steps the check served on SDPA or timed on the route (none is extra: a step with a
  checked call is one step, only slower where SDPA is slower);
- the slices' timings and the verdict (``insitu.verdict`` wrapped to read what it was given and returned);
- the classes counted, checked and reverted, and ``explain()`` of the self-attention call after the run.

Usage: ``python scripts/gpu/insitu_long.py --out insitu_long.json [--steps 80] [--warmup] [--device cpu]``;
``--device cpu`` is a float32 dry run at tiny sizes (the calls are short there, so no long-call check runs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import models_e2e as e2e


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", help="cpu: a float32 dry run at tiny sizes")
    ap.add_argument("--steps", type=int, default=80, help="timed denoising steps (the check needs > 64 + 6)")
    ap.add_argument("--warmup", action="store_true", help="`attnforge warmup` the block's classes first")
    args = ap.parse_args()
    import torch

    import attnforge
    from attnforge.dispatch import insitu, runtime
    from attnforge.integrations.diffusers import register

    res: dict[str, Any] = {**e2e.configure(torch, args.device), "sample_after": insitu.SAMPLE_AFTER,
                           "max_call_ms": insitu.MAX_CALL_MS, "slices": insitu.SLICES}
    model, inputs, kw = e2e.wan_block(torch)
    if args.warmup:
        res["warmup"] = e2e.warm_diffusion(**kw)
    verdicts: list[dict[str, Any]] = []
    original = insitu.verdict

    def spy(dispatcher: Any, q: Any, *, call: Any, route: str, timings: dict[str, Any]) -> str | None:
        out = original(dispatcher, q, call=call, route=route, timings=timings)
        verdicts.append({"route": route, "q": list(q.shape), "reverted": out,
                         **{f"{n}_ms": {"median": t.median_ms, "lo": t.lo_ms, "hi": t.hi_ms, "mad": t.mad_ms}
                            for n, t in timings.items()}})
        return out

    insitu.verdict = spy  # the long-call check reads insitu.verdict at its call
    register()
    model.set_attention_backend("attnforge")
    steps_ms: list[float] = []
    with torch.no_grad():
        for _ in range(args.steps):
            e2e._sync(torch)
            t0 = time.perf_counter()
            model(**inputs)
            e2e._sync(torch)
            steps_ms.append((time.perf_counter() - t0) * 1e3)
        res["calls_after"] = e2e._spy_calls(torch, lambda: model(**inputs))
    insitu.verdict = original
    state = insitu._STATE.get(runtime.get_dispatcher())
    res["insitu"] = {"counts": dict(state.counts) if state else {}, "checked": sorted(state.checked) if state else [],
                     "reverted": dict(state.reverted) if state else {}, "verdicts": verdicts}
    res["steps_ms"] = [round(x, 3) for x in steps_ms]
    tail = sorted(steps_ms[5:])
    res["step_ms_median"] = tail[len(tail) // 2] if tail else None
    res["step_ms_max_after_5"] = tail[-1] if tail else None
    res["attnforge_version"] = attnforge.__version__
    print(json.dumps({k: v for k, v in res.items() if k != "steps_ms"}, indent=1))
    print("steps_ms", res["steps_ms"])
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
