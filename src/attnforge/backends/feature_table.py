"""``docs/features.md``: the feature x backend table, generated from the capability data.

Regenerate after changing ``catalog/data/runtime.toml`` or ``backends.toml``::

    PYTHONPATH=src python -m attnforge.backends.feature_table docs/features.md

``tests/dispatch/test_feature_doc.py`` fails when the page and the data disagree.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from attnforge.backends.adapter import FEATURES
from attnforge.backends.capabilities import SDPA_FALLBACK, Capabilities, load_capabilities
from attnforge.catalog import DATA_DIR
from attnforge.catalog._check import read_toml

_HEAD = """# Features x backends

Generated from `src/attnforge/catalog/data/runtime.toml` and `backends.toml` by
`python -m attnforge.backends.feature_table docs/features.md`; a test keeps this page in sync. Do not edit by hand.

`attnforge.attention()` routes a call only to a backend that supports **every** feature the call uses (and that
verify passed on this device); what no verified backend supports is served by `exact`, attnforge's own
float32-accumulating math in torch, which supports all of them. Nothing is dropped.

- **yes**: the adapter serves the feature; `attnforge verify` checks it against the float64 reference.
- **kernel only**: the kernel has it, but attnforge does not route it there yet (the call goes elsewhere).
- **decode only**: a decode step's mask; a padded batch's (one run of keys per row) runs on the kernel as varlen
  sequences, any other mask on the exact math.
- **-**: not available.

## Semantics (the same on every backend; `attnforge/backends/exact.py` is the definition)

- **causal**: `causal=True` with `causal_alignment="bottom_right"` (default, FlashAttention) lets query `i` see
  key `j <= i + Sk - Sq`; `"top_left"` `j <= i`. `is_causal=True` means what it means in SDPA: causal, top-left
  (`causal=True, causal_alignment="top_left"`); `causal=True` together with `is_causal` is refused unless
  `causal_alignment="top_left"` (they would disagree when Sq != Sk).
- **window** `(left, right)` of ints: query `i` sees keys `i' - left .. i' + right`, `i'` aligned as above; None
  or -1 leaves a side unbounded (< -1 is refused); a side >= max(Sq, Sk) hides no key and is made unbounded, so
  `(10**30, 0)` is exact and never reaches a kernel. `attn_mask`, `causal` and `window` all apply together.
- **attn_mask**: bool (True = attend) or additive float16/bfloat16/float32/float64 (no float8: no type promotion
  takes it), broadcastable to `[B, Hq, Sq, Sk]` on q's device (SDPA's rule); a `[Sk]` or scalar mask is passed on
  as a `[1, Sk]` view (SDPA's kernels need two dimensions).
- **scale** and **softcap** are finite Python or numpy numbers, scale > 0, softcap >= 0 (0 or None: off) and at
  most float32's largest, each (larger, either is infinite in float32 math: NaN logits; a scale of 1e39 gave
  all-NaN output until 2026-12-03); a softcap at least float32's smallest normal (1.2e-38: below, it is 0 or
  subnormal there), and `scale / softcap`, the one factor the kernels multiply the logits by, at most float32's
  largest too (`scale=1e30, softcap=1e-10` gave NaN rows); `dropout_p` a number in [0, 1);
  `causal`, `is_causal`, `enable_gqa`, `return_lse` are bools. A bool is not a number here (`scale=True` is
  refused, even after a `scale=1.0` call), nor is a tensor; an int past float's range is refused as infinite.
- **additive masks** wider than q's dtype (a float32 mask on bfloat16 inputs) keep their finite values finite:
  `torch.finfo(torch.float32).min` hides a key as a large negative logit, not as `-inf`, so a row hidden
  everywhere by it averages v as the exact math does. On a CPU they keep their precision too (SDPA gets them in
  float32); CUDA's SDPA kernels take them in q's dtype. A mask that requires grad (a learned bias) gets its
  gradient: the call goes only to a backend with a backward pass.
- **softcap** `c`: logits become `c * tanh(logits / c)` after scaling, before masks (Gemma 2).
- **sinks** `[Hq]`: one extra logit per head in the softmax denominator that carries no value (GPT-OSS `s_aux`).
- **lse**: float32 `log(sum exp(logits) [+ exp(sink)])`, `[B, Hq, Sq]` (`[Hq, total_q]` for varlen).
- **rows that see no key** are zeros (their lse is `-inf`); zero-sized inputs return the empty or zero result
  without running a kernel.
- **dropout** on the normalised probabilities, scaled by `1 / (1 - p)`, from torch's RNG (`torch.manual_seed`
  makes it reproducible); applied whenever `dropout_p > 0`, as SDPA does.
- **varlen**: packed `[total, H, D]` with int32 `cu_seqlens_q/k` `[batch + 1]` on q's device: they start at 0,
  never decrease and end at the packed rows; `max_seqlen_q/k` None or at least the longest sequence;
  **paged KV**: page pools `[num_blocks, page_size, Hkv, D]` (v's pool pairs k's page for page; only its head
  dim may differ), int32 `block_table [B, blocks]` and `seqused_k [B]`.
- Nested (jagged) tensors, numpy arrays and lists are refused with a hint (pass `values()` and `offsets()` as
  varlen; `torch.as_tensor` for arrays). Every refusal is a `DispatchError` with a hint, raised before any backend
  runs (`attnforge/dispatch/inputs.py`).

## When a backend raises

An accepted call that makes a backend raise (a kernel limit its capability table does not know) is served by the
next backend of its order, the exact math last. The backend is then skipped for that call's exact **signature**
(sizes, dtype, device, causal, features, scale, each feature argument's shape and value) for the rest of the
process, with one warning line; other calls of the same shape class keep it. Only after it raised on 3 distinct
signatures of one shape class is it skipped for the whole class. At most 256 signatures are remembered per
backend. `attnforge.explain()` says so: `note: flash-attn-3 raised on this signature: <first line>; served by
sdpa`. A forced backend (`backend=`, `use_backend`) is never skipped: its error reaches the caller.

A call that ran inside something its signature does not hold is served by the next backend too, but nothing is
remembered: a `torch.func` transform (`vmap`, `grad`, `jvp`), forward-mode AD (`torch.autograd.forward_ad`), a
Python dispatch mode (`FakeTensorMode`, a profiler's or a FLOP counter's `TorchDispatchMode`), an `sdpa_kernel`
context that leaves out some of SDPA's kernels (SDPA raises "No viable backend" where none of the allowed ones
serves), a CUDA graph capture or a tensor subclass as q, k or v. The warning line says so. Before, one
`torch.func.jvp` over `attention()` on a CPU (SDPA's CPU kernel has no forward-AD formula in torch 2.13), or one
call inside such an `sdpa_kernel` context, skipped SDPA for that signature, and every later plain call of it ran on
the exact math, ~6x slower (36.6 against 6.4 µs a call on this repository's 2-core development machine).

Non-reentrant activation checkpointing (`torch.utils.checkpoint`, `use_reentrant=False`) stops a recomputation by
raising from inside the backend's call; that signal reaches the caller as it is, and no backend is skipped for it
(nor for its `CheckpointError`). Inside such a region (saved-tensor hooks on the thread: the forward and its
recomputation in the backward) nothing is measured or checked in situ, and the recomputation is served by the backend
that served its forward, whatever was decided in between: it must save what the forward saved (a class decided anew
in between, or the in-situ check's own calls inside the region, made the backward raise `CheckpointError`,
2026-12-02). A class met only inside such regions keeps the decision its records give (first use does not measure
it there); `attnforge warmup` measures it ahead.
"""

_FEATURE_LEGEND = "\n".join(f"- `{name}`: {text}" for name, text in FEATURES.items())


def _compiled(c: Capabilities) -> str:
    """The Limits table's "compiled on first call" cell: per exact shape (chosen only with a measured win), per
    kernel variant (timed by warmup and bench, not by measure-on-first-use), or not at all."""
    if c.jit_per_shape:
        return "per shape"
    return "per variant (timed by warmup/bench)" if c.jit_per_variant else "-"


def render(caps: Mapping[str, Capabilities], sources: Mapping[str, Sequence[str]]) -> str:
    """The page for these capabilities (catalog backends in the given order, then the two fallbacks)."""
    rows = [*caps.values(), SDPA_FALLBACK]
    names = list(FEATURES)
    lines = [_HEAD, "## Features", "", "| backend | " + " | ".join(f"`{n}`" for n in names) + " |",
             "|---|" + "---|" * len(names)]
    for c in rows:
        cells = ["yes" if n in c.features else ("kernel only" if n in c.offers else "-") for n in names]
        if "mask" in c.features and (c.mask_max_seqlen_q or c.mask_with is not None):
            limits = [f"decode only (Sq <= {c.mask_max_seqlen_q})"] if c.mask_max_seqlen_q else []
            if c.mask_with is not None:
                limits.append(f"beside {', '.join(sorted(c.mask_with)) or 'no other feature'} only")
            cells[names.index("mask")] = "; ".join(limits)
        lines.append(f"| `{c.backend}` | " + " | ".join(cells) + " |")
    lines.append("| `exact` | " + " | ".join("yes" for _ in names) + " |")
    lines += ["", _FEATURE_LEGEND, "", "## Limits", "",
              "| backend | devices | compute capability | dtypes | max head dim | causal | GQA | backward |"
              " compiled on first call | chosen only with a measured win on |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for c in rows:
        backward = "-" if not c.backward else "/".join(c.backward_devices or c.devices)
        span = c.support.cc_range_text() if "cuda" in c.devices else "-"
        if c is SDPA_FALLBACK:
            span = "any"
        head_dim = "any" if c.support.max_head_dim >= 1 << 20 else str(c.support.max_head_dim)
        if c.head_dim_multiple > 1:
            head_dim += f" (multiple of {c.head_dim_multiple})"
        lines.append(f"| `{c.backend}` | {'/'.join(c.devices)} | {span} | {', '.join(c.support.dtypes)} | {head_dim} |"
                     f" {c.causal.value} | {c.gqa.value} | {backward} | {_compiled(c)} |"
                     f" {'/'.join(c.devices) if c.jit_per_shape else '/'.join(c.win_required_on) or '-'} |")
    lines.append("| `exact` | cuda/cpu | any | any float | any | any alignment | native | cuda/cpu | - | - |")
    lines += ["", "## Sources", ""]
    for bid in caps:
        lines.append(f"- `{bid}`: " + "; ".join(sources.get(bid, ())))
    lines.append("- `sdpa` (the fallback): `attnforge/backends/capabilities.py` `SDPA_FALLBACK`"
                 " (docs/research/runtime-anchors.md §3.1, §3.3)")
    lines.append("- `exact`: `attnforge/backends/exact.py` (attnforge's own code; semantics in its docstring)")
    return "\n".join(lines) + "\n"


def packaged_page() -> str:
    """The page for the packaged catalog."""
    doc = read_toml(DATA_DIR / "runtime.toml")
    sources = {bid: tuple(row.get("sources", ())) for bid, row in doc.get("runtime", {}).items()}
    return render(load_capabilities(), sources)


def main(argv: Sequence[str]) -> int:
    """Write the page to ``argv[0]`` (stdout when absent)."""
    page = packaged_page()
    if argv:
        Path(argv[0]).write_text(page, encoding="utf-8")
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
