#!/usr/bin/env python3
"""A padded batch through four layers that share one mask (as transformers passes it): SDPA called directly
with the mask, ``attnforge.attention`` with the SDPA adapter's kept mask preparation, and the same with the
preparation redone on every call (the adapter before it kept one per mask object).

Shapes of the tiny Llama of ``models_gpu.py``: B4 Hq8 Hkv2 S2048 D128 bf16, a causal [B, 1, S, S] bool mask with
left padding on row 1. Timed by :func:`attnforge.bench.timing.measure` (``_timing.measure_ms``); one step = four
layers. Run in a home with no records and ``ATTNFORGE_AUTOTUNE=0`` so the SDPA adapter serves (what a masked
call gets when SDPA is chosen).

``--shape llama3-8b``: one Llama-3-8B prefill layer's call as ``generate`` issues it (B4 Hq32 Hkv8 S1024 D128, the
prompt of row 1 left-padded by S/5), and two more questions about it (the prefill figures of 2026-11-29 read
0.985-0.988x with SDPA chosen on both sides):

- ``kernels``: per SDPA kernel forced (cuDNN, memory-efficient, math) and per mask form (the caller's bool mask,
  the adapter's additive one with the hidden rows opened, and an additive one not opened): what the rows that see
  no key hold (NaN, zeros, other), the largest error on the other rows against float32 math, whether the
  gradients are finite (with no gradient arriving on those rows, and with one arriving on every row, as a padded
  training batch's next layer sends), and ``torch._fused_sdp_choice`` (the kernel SDPA itself picks for the call);
- ``parts``: the call as transformers makes it (the bool mask, ``enable_gqa``), SDPA on the adapter's opened
  mask alone and on the mask with those rows not opened, the adapter's zeroing pass alone, and ``attention()``,
  timed in interleaved rounds; ``zeroing_kernels``: what the adapter's probe (``sdpa._zeroing_kernels``) answers
  at head dims 64, 128 and 256.

Usage: ATTNFORGE_AUTOTUNE=0 python scripts/gpu/mask_reuse.py --out mask.json [--shape llama3-8b] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from _timing import measure_many_ms, measure_ms

#: per --shape: B, Hq, Hkv, S, D on a GPU, and the padded row's hidden prefix (keys of row 1 before it are padding)
SHAPES = {"tiny": ((4, 8, 2, 2048, 128), 7), "llama3-8b": ((4, 32, 8, 1024, 128), 5)}


def _rows(out: object, hidden: object) -> dict[str, object]:
    """What ``out [B, H, S, D]`` holds on the rows ``hidden`` (``[B, 1, S, 1]`` bool) marks."""
    rows = out.float()[hidden.expand_as(out)]  # type: ignore[attr-defined]
    return {"nan": int(rows.isnan().sum()), "all_zero": bool((rows == 0).all()),
            "max_abs": float(rows.nan_to_num().abs().max()) if rows.numel() else 0.0}


def kernels(torch: object, q: object, k: object, v: object, *, mask: object, opened: object) -> dict[str, object]:
    """The ``kernels`` section (see the module's docstring); ``opened``: the adapter's additive mask for ``mask``."""
    import torch.nn.functional as F  # noqa: N812
    from torch.nn.attention import SDPBackend, sdpa_kernel

    t = torch  # type: ignore[assignment]
    seen = mask.any(-1, keepdim=True)  # type: ignore[attr-defined]
    hidden = ~seen
    plain = t.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))  # type: ignore
    g = q.shape[1] // k.shape[1]  # type: ignore[attr-defined]
    ref = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(g, 1),  # type: ignore[attr-defined]
                                         v.float().repeat_interleave(g, 1), attn_mask=opened.float())  # type: ignore
    # the exact gradients (float32 math on the opened mask, the hidden rows zeroed as the adapter does) for an
    # upstream gradient arriving on every row, K/V expanded; per kernel each call's gradients are compared with them
    upstream = t.randn(q.shape, dtype=t.float32, device=q.device, generator=t.Generator(q.device).manual_seed(7))  # type: ignore
    rq, rk, rv = (x.float().repeat_interleave(r, 1).detach().requires_grad_()  # type: ignore[attr-defined]
                  for x, r in ((q, 1), (k, g), (v, g)))
    ((F.scaled_dot_product_attention(rq, rk, rv, attn_mask=opened.float()) * seen) * upstream).sum().backward()  # type: ignore
    from attnforge.backends.sdpa import _zeroing_kernels

    doc: dict[str, object] = {"hidden_rows": int(hidden.sum()), "zeroing_kernels": {
        d: {"fwd": sorted(_zeroing_kernels(q.device, q.dtype, d, d, False)),  # type: ignore[attr-defined]
            "grad": sorted(_zeroing_kernels(q.device, q.dtype, d, d, True))}  # type: ignore[attr-defined]
        for d in (64, 128, 256)}}
    forms = {"bool": mask, "additive_opened": opened, "additive_plain": plain}
    for form, m in forms.items():
        try:
            doc[f"sdpa_choice_{form}"] = SDPBackend(int(t._fused_sdp_choice(q, k, v, attn_mask=m, dropout_p=0.0,  # type: ignore
                                                                           is_causal=False, enable_gqa=True))).name
        except Exception as exc:
            doc[f"sdpa_choice_{form}"] = f"{type(exc).__name__}: {exc}"[:200]
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("math", SDPBackend.MATH)):
        for form, m in forms.items():
            for gqa in ("enable_gqa", "expanded"):
                kk, vv = (k, v) if gqa == "enable_gqa" else (k.repeat_interleave(g, 1), v.repeat_interleave(g, 1))  # type: ignore
                row: dict[str, object] = {}
                try:
                    with sdpa_kernel([backend]), t.no_grad():
                        out = F.scaled_dot_product_attention(q, kk, vv, attn_mask=m,
                                                             enable_gqa=gqa == "enable_gqa")
                    row.update(_rows(out, hidden))
                    row["seen_max_err"] = float((out.float() - ref)[seen.expand_as(ref)].abs().max())
                    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, kk, vv))
                    with sdpa_kernel([backend]):
                        o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=m, enable_gqa=gqa == "enable_gqa")
                        (o.float() * seen).sum().backward()
                    row["grads_finite"] = all(bool(x.grad.isfinite().all()) for x in (qg, kg, vg))
                    # a gradient arriving on the hidden rows too (a padded training batch's next layer sends one):
                    # whether a call that records grad could leave those rows to the kernel as well
                    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, kk, vv))
                    with sdpa_kernel([backend]):
                        o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=m, enable_gqa=gqa == "enable_gqa")
                        (o.float() * upstream).sum().backward()
                    row["grads_finite_all_rows"] = all(bool(x.grad.isfinite().all()) for x in (qg, kg, vg))
                    row["dq_hidden_rows_zero"] = not bool(qg.grad[hidden.expand_as(qg.grad)].any())
                    # against the exact gradients (K/V's summed over each group where K/V were not expanded)
                    errs = {}
                    for label, got, exact in (("dq", qg.grad, rq.grad), ("dk", kg.grad, rk.grad),
                                              ("dv", vg.grad, rv.grad)):
                        want = exact if got.shape == exact.shape else exact.unflatten(1, (got.shape[1], g)).sum(2)
                        errs[label] = round(float((got.float() - want).abs().max() / want.abs().max()), 5)
                    row["grad_rel_err_all_rows"] = errs
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {exc}"[:200]
                doc[f"{name}/{form}/{gqa}"] = row
    return doc


def parts(torch: object, q: object, k: object, v: object, *, mask: object, opened: object,
          seen: object) -> dict[str, object]:
    """The ``parts`` section (see the module's docstring): each median ms over interleaved rounds."""
    import torch.nn.functional as F  # noqa: N812

    import attnforge

    out = F.scaled_dot_product_attention(q, k, v, attn_mask=opened, enable_gqa=True)  # type: ignore[arg-type]
    plain = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))  # type: ignore
    fns = {"sdpa_bool_as_transformers": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=None,  # type: ignore
                                                                                 enable_gqa=True),
           "sdpa_opened_mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=opened, enable_gqa=True),  # type: ignore
           "sdpa_plain_mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=plain, enable_gqa=True),  # type: ignore
           "zeroing_pass": lambda: out.mul_(seen),
           "attention": lambda: attnforge.attention(q, k, v, attn_mask=mask)}  # type: ignore[arg-type]
    set_bytes = sum(x.numel() * x.element_size() for x in (q, k, v))  # type: ignore[attr-defined]
    with torch.no_grad():  # type: ignore[attr-defined]
        return {name: m.get("median_ms", m) for name, m in measure_many_ms(torch, fns, set_bytes=set_bytes).items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F  # noqa: N812

    import attnforge
    from attnforge.backends import sdpa as sdpa_module

    cuda = args.device == "cuda"
    (b, hq, hkv, s, d), pad = SHAPES[args.shape]
    if not cuda:
        b, hq, hkv, s, d = 2, hq // hkv * 2, 2, 64, 32
    dtype = torch.bfloat16 if cuda else torch.float32
    if not cuda:  # CPU SDPA zeroes rows that see no key itself; take the CUDA path for a dry run
        sdpa_module._safe_softmax_on_cpu = lambda: False  # type: ignore[assignment]
    torch.manual_seed(0)
    layers = [tuple(torch.randn(b, h, s, d, device=args.device, dtype=dtype) for h in (hq, hkv, hkv))
              for _ in range(4)]
    mask = torch.ones(s, s, dtype=torch.bool, device=args.device).tril().expand(b, 1, s, s).clone()
    mask[1, :, :, : s // pad] = False

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
    q0, k0, v0 = layers[0]
    opened, seen = sdpa_module.SdpaAdapter._sdpa_mask(mask, q0, sq=s, sk=s, causal=False, top_left=True,
                                                      window=None)
    if seen is not None:
        doc["kernels"] = kernels(torch, q0, k0, v0, mask=mask, opened=opened)
        print(json.dumps(doc["kernels"], indent=1), flush=True)
        doc["parts"] = parts(torch, q0, k0, v0, mask=mask, opened=opened, seen=seen)
        print(json.dumps(doc["parts"], indent=1), flush=True)
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
