#!/usr/bin/env python3
"""A padded batch through four layers that share one mask (as transformers passes it): SDPA called directly
with the mask, ``attnforge.attention`` with the SDPA adapter's kept mask preparation, and the same with the
preparation redone on every call (the adapter before it kept one per mask object).

Shapes of the tiny Llama of ``models_gpu.py``: B4 Hq8 Hkv2 S2048 D128 bf16, a causal [B, 1, S, S] bool mask with
left padding on row 1. Timed by :func:`attnforge.bench.timing.measure` (``_timing.measure_ms``); one step = four
layers. Run in a home with no records and ``ATTNFORGE_AUTOTUNE=0`` so the SDPA adapter serves (what a masked
call gets when SDPA is chosen).

Usage: ATTNFORGE_AUTOTUNE=0 python scripts/gpu/mask_reuse.py --out mask.json [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from _timing import measure_ms


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F  # noqa: N812

    import attnforge
    from attnforge.backends import sdpa as sdpa_module

    cuda = args.device == "cuda"
    b, hq, hkv, s, d = (4, 8, 2, 2048, 128) if cuda else (2, 4, 2, 64, 32)
    dtype = torch.bfloat16 if cuda else torch.float32
    if not cuda:  # CPU SDPA zeroes rows that see no key itself; take the CUDA path for a dry run
        sdpa_module._safe_softmax_on_cpu = lambda: False  # type: ignore[assignment]
    torch.manual_seed(0)
    layers = [tuple(torch.randn(b, h, s, d, device=args.device, dtype=dtype) for h in (hq, hkv, hkv))
              for _ in range(4)]
    mask = torch.ones(s, s, dtype=torch.bool, device=args.device).tril().expand(b, 1, s, s).clone()
    mask[1, :, :, : s // 7] = False

    class Redo(sdpa_module.KeptPerMask):
        def get(self, mask: object, params: object) -> None:  # type: ignore[override]
            return None

    kept, redo = sdpa_module._OPENED, Redo()

    def step(fn: object) -> object:
        def run() -> object:
            return [fn(q, k, v) for q, k, v in layers]  # type: ignore[operator]
        return run

    def direct(q: object, k: object, v: object) -> object:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # type: ignore[arg-type]

    def forge(q: object, k: object, v: object) -> object:
        return attnforge.attention(q, k, v, attn_mask=mask)  # type: ignore[arg-type]

    def forge_redo(q: object, k: object, v: object) -> object:
        sdpa_module._OPENED = redo
        try:
            return attnforge.attention(q, k, v, attn_mask=mask)  # type: ignore[arg-type]
        finally:
            sdpa_module._OPENED = kept

    doc: dict[str, object] = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "shape": [b, hq, hkv, s, d], "dtype": str(dtype), "layers": 4}
    with torch.no_grad():
        outs = {name: step(fn)() for name, fn in (("sdpa", direct), ("attnforge", forge),
                                                   ("attnforge_redo", forge_redo))}
        valid = mask.any(-1, keepdim=True)  # [B, 1, S, 1]: rows that see a key (SDPA's others are not compared)
        doc["max_abs_diff_vs_sdpa"] = max(float((a - c).abs()[valid.expand_as(a)].max())
                                          for a, c in zip(outs["attnforge"], outs["sdpa"], strict=True))
        doc["kept_equals_redo"] = all(torch.equal(a, c) for a, c in
                                      zip(outs["attnforge"], outs["attnforge_redo"], strict=True))
        set_bytes = sum(t.numel() * t.element_size() for t in layers[0])
        for _round in range(2):  # interleaved
            for name, fn in (("sdpa", direct), ("attnforge", forge), ("attnforge_redo", forge_redo)):
                m = measure_ms(torch, step(fn), set_bytes=set_bytes)
                doc.setdefault(name, []).append(m["median_ms"])  # type: ignore[union-attr]
    print(json.dumps(doc, indent=1))
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
