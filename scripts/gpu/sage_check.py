#!/usr/bin/env python3
"""SageAttention 2 called directly, without attnforge: is its own output right on this GPU?

For head dims 64/128, float16/bfloat16, causal off/on and a few lengths, ``sageattention.sageattn`` on contiguous
``[B, H, S, D]`` tensors (``tensor_layout="HND"``) is compared with a float32 reference: relative L1 error and
cosine similarity (the gate of issue 17: rel L1 <= 0.05, cosine >= 0.999). Then the SASS/PTX each of its
extension modules carries (``cuobjdump --list-elf/--list-ptx``), which says whether the Hopper kernels were
built for sm_90a. Prints a table; ``--out`` writes JSON.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
from typing import Any


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import sageattention
    import torch

    rows: list[dict[str, Any]] = []
    torch.manual_seed(0)
    for d in (64, 128):
        for dtype in (torch.float16, torch.bfloat16):
            for causal in (False, True):
                for s in (650, 4096):
                    q, k, v = (torch.randn(1, 8, s, d, device="cuda", dtype=dtype) for _ in range(3))
                    out = sageattention.sageattn(q, k, v, tensor_layout="HND", is_causal=causal).float()
                    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                                           is_causal=causal)
                    rel_l1 = float((out - ref).abs().sum() / ref.abs().sum())
                    cos = float(torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0))
                    rows.append({"d": d, "dtype": str(dtype), "causal": causal, "s": s, "rel_l1": rel_l1,
                                 "cosine": cos})
                    print(f"D{d} {dtype} causal={causal} S{s}: rel L1 {rel_l1:.4f} cosine {cos:.5f}", flush=True)
    mods = {}
    for so in sorted(glob.glob(os.path.join(os.path.dirname(sageattention.__file__), "*.so"))):
        found = []
        for flag in ("--list-elf", "--list-ptx"):
            done = subprocess.run(["cuobjdump", flag, so], capture_output=True, text=True, check=False)
            found += sorted({w for w in done.stdout.split() if ".sm_" in w})
        mods[os.path.basename(so)] = found
        print(os.path.basename(so), found)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"rows": rows, "modules": mods, "version": getattr(sageattention, "__version__", None)}, fh,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
