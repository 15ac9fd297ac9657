#!/usr/bin/env python3
"""Host cost per attention call: each kernel's public entry, attnforge's direct entry (the bound route), and
``attnforge.attention``, on a shape whose kernel is far shorter than its launch, so what is timed is the host.

Variants (each skipped, with the reason, where this machine lacks it):

- ``sdpa``: ``F.scaled_dot_product_attention`` on [B, H, S, D];
- ``sdpa_choice``: SDPA's kernel selector alone (``torch._fused_sdp_choice``); ``sdpa_op``: the kernel op it chose
  (``torch._scaled_dot_product_{flash,efficient,cudnn}_attention``) called without the selector;
- ``fa2_public`` / ``fa3_public`` / ``fa4_public``: ``flash_attn.flash_attn_func`` /
  ``flash_attn_interface.flash_attn_func`` / ``flash_attn.cute.flash_attn_func`` on [B, S, H, D];
- ``fa2_direct`` / ``fa3_direct`` / ``fa4_direct``: the adapter's bound call (``attnforge.backends.bound.bound_call``:
  the route the dispatcher serves; FA2 ``flash_attn_2_cuda.fwd`` and FA3 ``torch.ops.flash_attn_3.fwd`` called
  positionally, FA4 ``_flash_attn_fwd`` without ``FlashAttnFunc.apply`` when no gradient is needed) on
  [B, S, H, D] (``*_direct_entry_found``: False means the installed version is not one mirrored, and this row
  times the public function); with a ``--abi torch`` FA3 build, ``fa3_direct`` calls its lean entry and
  ``fa3_ops``, the same route over ``torch.ops.flash_attn_3.fwd``, shows what the entry saves;
- ``attention_fa2`` / ``attention_fa3`` / ``attention_fa4`` / ``attention_flex``: ``attnforge.attention(...,
  backend=...)`` (bshd for the FlashAttention family, bhsd for Flex): the dispatcher's hot path around the route;
- ``attention``: ``attnforge.attention(q, k, v)`` on [B, H, S, D], its own choice (named in the output);
- ``attention_graph``: ``torch.cuda.graph`` capture of ``attention()`` (its choice), then ``graph.replay()``.

Method (docs/research/h100-host-cost-2026-11-26.md): per variant 50 warm-up calls, then 2,000 calls back to back
between two ``torch.cuda.synchronize()``; wall time / 2,000 = host cost per call; 5 rounds, variants
interleaved in a rotating order; the median and the range. ``--grad`` makes the inputs require grad (the forward
then builds the autograd graph, as in training). Outputs of each direct entry are compared with its public
entry (``identical``: bit for bit). ``--device cpu`` is a dry run of this script (what CPU lacks is skipped).

    python scripts/gpu/overhead.py --out overhead.json [--shapes 1,1,128,128] [--causal on] [--grad]
        [--backend flash-attn-3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SHAPES = [(1, 1, 128, 128), (1, 8, 128, 64), (2, 16, 512, 128)]  # (B, H, S, D)


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def per_call_us(fn: Callable[[], Any], *, calls: int, device: str) -> float:
    """Wall time of ``calls`` back-to-back calls between two synchronisations, per call, in us."""
    sync(device)
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    sync(device)
    return (time.perf_counter_ns() - start) / calls / 1e3


def variants(shape: tuple[int, int, int, int], *, causal: bool, grad: bool, device: str,
             only: str | None = None) -> tuple[dict[str, Callable[[], Any]], dict[str, str], dict[str, Any]]:
    """(variant -> fn, variant -> why skipped, notes) for one shape."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    import attnforge
    from attnforge.backends import registry
    from attnforge.backends.bound import bound_call
    from attnforge.dispatch.runtime import get_dispatcher

    b, h, s, d = shape
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v = (torch.randn(b, h, s, d, device=device, dtype=dtype, requires_grad=grad) for _ in range(3))
    qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))
    fns: dict[str, Callable[[], Any]] = {}
    skipped: dict[str, str] = {}
    notes: dict[str, Any] = {}
    fns["sdpa"] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    # SDPA's selector alone, and the kernel op it picks called through torch's own binding without the selector
    # (what a route that chose once per shape class would call): how much of SDPA's host cost is the choice
    fns["sdpa_choice"] = lambda: torch._fused_sdp_choice(q, k, v, is_causal=causal)
    choice = int(torch._fused_sdp_choice(q, k, v, is_causal=causal))
    notes["sdpa_choice"] = choice
    ops: dict[int, Callable[[], Any]] = {
        1: lambda: torch._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)[0],
        2: lambda: torch._scaled_dot_product_efficient_attention(q, k, v, None, grad, 0.0, causal)[0],
        3: lambda: torch._scaled_dot_product_cudnn_attention(q, k, v, None, grad, 0.0, causal, False)[0],
    }
    if choice in ops and device == "cuda":
        fns["sdpa_op"] = ops[choice]
        with torch.no_grad():
            notes["sdpa_op_identical_to_sdpa"] = bool(torch.equal(fns["sdpa"](), fns["sdpa_op"]()))
    else:
        skipped["sdpa_op"] = "needs CUDA" if device != "cuda" else f"SDPA chose backend {choice} here"
    adapters = registry.adapters()

    def add(name: str, make: Callable[[], Callable[[], Any]]) -> None:
        try:
            fn = make()
            fn()  # first call: imports, JIT compiles, the dispatcher's decision
            fns[name] = fn
        except Exception as exc:  # a missing backend, or one that cannot run here
            skipped[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]

    for bid, tag in (("flash-attn", "fa2"), ("flash-attn-3", "fa3"), ("flash-attn-4", "fa4")):
        adapter = adapters[bid]
        problem = adapter.load_error() if device == "cuda" else "needs CUDA"
        if only is not None and only != bid:
            problem = f"not asked (--backend {only})"
        if problem:
            for name in (f"{tag}_public", f"{tag}_direct", f"attention_{tag}"):
                skipped[name] = problem.splitlines()[0][:200]
            continue
        public = adapter.module().flash_attn_func  # type: ignore[attr-defined]
        call = get_dispatcher().describe(q, k, causal=causal, precision="exact", needs_grad=grad)
        add(f"{tag}_public", lambda public=public: lambda: public(qs, ks, vs, causal=causal))

        def direct(adapter: Any = adapter, call: Any = call) -> Callable[[], Any]:
            bound = bound_call(adapter, call, causal=causal, scale=None, bshd=True)
            return lambda: bound(qs, ks, vs)

        add(f"{tag}_direct", direct)
        add(f"attention_{tag}", lambda bid=bid: lambda: attnforge.attention(qs, ks, vs, causal=causal,
                                                                            layout="bshd", backend=bid))
        if f"{tag}_public" in fns and f"{tag}_direct" in fns:
            with torch.no_grad():
                a, b_ = fns[f"{tag}_public"](), fns[f"{tag}_direct"]()
            a = a[0] if isinstance(a, tuple) else a
            notes[f"{tag}_direct_identical_to_public"] = bool(torch.equal(a, b_))
        notes[f"{tag}_direct_entry_found"] = adapter.direct_entry() is not None  # type: ignore[attr-defined]
        if tag == "fa3" and getattr(adapter.direct_entry(), "entry", None) is not None:  # type: ignore[attr-defined]
            # a --abi torch build's lean entry (attnforge_fwd in flash_attn_3._C) serves fa3_direct; the same
            # route over the registered ops, timed in the same rounds: what the lean entry saves
            import dataclasses

            ops = dataclasses.replace(adapter.direct_entry(), entry=None)  # type: ignore[attr-defined]
            notes["fa3_lean_entry"] = True
            # the adapter's own bound route (as fa3_direct), its direct entry the ops alone
            add("fa3_ops", lambda fa3=adapter, ops=ops, call=call: direct(dataclasses.replace(fa3, _direct=[ops]),
                                                                          call))
            if "fa3_ops" in fns and "fa3_direct" in fns:
                with torch.no_grad():
                    notes["fa3_lean_identical_to_ops"] = bool(torch.equal(fns["fa3_ops"](), fns["fa3_direct"]()))
            if grad and getattr(adapter.direct_entry(), "train", None) is not None:  # type: ignore[attr-defined]
                # the build's C++ train node (attnforge_attn) serves fa3_direct; the same lean calls in the Python
                # node (bound.differentiable), timed in the same rounds: what the C++ node saves
                import types

                lean = adapter.direct_entry().entry  # type: ignore[attr-defined]
                # the same entry without its node (Fa3Ops.train is then None)
                no_node = types.SimpleNamespace(attnforge_entry=lean.attnforge_entry, attnforge_fwd=lean.attnforge_fwd,
                                                attnforge_bwd=lean.attnforge_bwd)
                pynode = dataclasses.replace(adapter.direct_entry(), entry=no_node)  # type: ignore[attr-defined]
                notes["fa3_cpp_train_node"] = True
                add("fa3_pynode", lambda fa3=adapter, ops=pynode, call=call: direct(
                    dataclasses.replace(fa3, _direct=[ops]), call))
                notes.update(_grad_gaps({n: fns[n] for n in ("fa3_direct", "fa3_pynode", "fa3_public") if n in fns},
                                        (qs, ks, vs)))
    add("attention_flex", lambda: lambda: attnforge.attention(q, k, v, causal=causal, backend="flex"))
    add("attention", lambda: lambda: attnforge.attention(q, k, v, causal=causal))
    notes["attention_chose"] = attnforge.explain(q, k, v, causal=causal).chosen
    if device != "cuda":
        skipped["attention_graph"] = "CUDA graphs need CUDA"
    elif grad:
        skipped["attention_graph"] = "captured forward only (--grad off)"
    else:
        def captured(fn: Callable[[], Any]) -> tuple[Any, Any]:
            """``fn`` warmed on a side stream, then captured in a CUDA graph: (the graph, its static output)."""
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = fn()
            return graph, static_out

        def attention_eager() -> Any:
            return attnforge.attention(q, k, v, causal=causal)

        def graphed() -> Callable[[], Any]:
            graph, static_out = captured(attention_eager)
            graph.replay()
            torch.cuda.synchronize()
            notes["attention_graph_equals_eager"] = bool(torch.equal(static_out, attention_eager()))
            return graph.replay

        add("attention_graph", graphed)
        # the kernel alone: SDPA's kernel replayed, no host work per call
        add("sdpa_graph", lambda: captured(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))[0].replay)

        def compiled(fn: Callable[..., Any], label: str) -> Callable[[], Any]:
            # torch.compile(mode="reduce-overhead", fullgraph=True): Inductor's CUDA graphs around the call
            step = torch.compile(fn, mode="reduce-overhead", fullgraph=True)
            for _ in range(3):
                out = step(q, k, v)
            notes[f"{label}_equals_eager"] = bool(torch.equal(out.clone(), fn(q, k, v)))
            return lambda: step(q, k, v)

        add("sdpa_compiled", lambda: compiled(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal),
                                              "sdpa_compiled"))
        add("attention_compiled", lambda: compiled(lambda a, b, c: attnforge.attention(a, b, c, causal=causal),
                                                   "attention_compiled"))
    return fns, skipped, notes


def _grad_gaps(fns: dict[str, Callable[[], Any]], leaves: tuple[Any, ...]) -> dict[str, Any]:
    """The largest |difference| of the output and of dq, dk, dv between ``fa3_direct`` (the C++ train node) and each
    other route in ``fns`` (the loss: the output's sum in fp32, so each route gets the same dout). FA3's backward
    accumulates dq with atomics (``deterministic=False``, as the public function calls it), so the gradients may differ
    by a few ulps (the H200 run of 2026-11-30 read 0.0 on all three shapes)."""
    import torch

    def run(fn: Callable[[], Any]) -> list[Any]:
        out = fn()
        out = out[0] if isinstance(out, tuple) else out
        return [out.detach(), *torch.autograd.grad(out.float().sum(), leaves)]

    if "fa3_direct" not in fns:
        return {}
    base = run(fns["fa3_direct"])
    gaps: dict[str, Any] = {}
    for name, fn in fns.items():
        if name != "fa3_direct":
            gaps[f"fa3_direct_vs_{name}_max_abs"] = [float((a.float() - b.float()).abs().max())
                                                     for a, b in zip(base, run(fn), strict=True)]
    return gaps


def measure(shape: tuple[int, int, int, int], *, causal: bool, grad: bool, device: str, calls: int,
            warmup: int, rounds: int, only: str | None) -> dict[str, Any]:
    fns, skipped, notes = variants(shape, causal=causal, grad=grad, device=device, only=only)
    for fn in fns.values():
        per_call_us(fn, calls=warmup, device=device)
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(i + r) % len(names)]
            times[name].append(per_call_us(fns[name], calls=calls, device=device))
    return {"shape_bhsd": list(shape), "causal": causal, "grad": grad, **notes, "skipped": skipped,
            "us_per_call": {n: {"median": statistics.median(t), "min": min(t), "max": max(t)}
                            for n, t in times.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda", help="cuda (the measurement); cpu: a dry run of this script")
    ap.add_argument("--shapes", default="", help="B,H,S,D;B,H,S,D (default: all of SHAPES)")
    ap.add_argument("--causal", choices=("both", "on", "off"), default="on")
    ap.add_argument("--grad", action="store_true", help="inputs require grad (forward timed with autograd on)")
    ap.add_argument("--calls", type=int, default=2000, help="calls per timed loop")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backend", default=None, choices=("flash-attn", "flash-attn-3", "flash-attn-4"),
                    help="time only this FlashAttention version's variants (besides SDPA, Flex, attention())")
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in part.split(",")) for part in args.shapes.split(";") if part] or SHAPES
    causals = {"both": (False, True), "on": (True,), "off": (False,)}[args.causal]

    import torch

    import attnforge

    report: dict[str, Any] = {
        "what": "host cost per attention call (us): public entries, direct entries, attention()",
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__, "attnforge": attnforge.__version__, "calls": args.calls,
        "warmup": args.warmup, "rounds": args.rounds,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": [],
    }
    for shape in shapes:
        for causal in causals:
            try:
                row = measure(shape, causal=causal, grad=args.grad, device=args.device,  # type: ignore[arg-type]
                              calls=args.calls, warmup=args.warmup, rounds=args.rounds, only=args.backend)
            except Exception as exc:
                row = {"shape_bhsd": list(shape), "causal": causal, "error": f"{type(exc).__name__}: {exc}"[:500]}
            report["rows"].append(row)
            print(f"[B,H,S,D]={list(shape)} causal={causal} grad={args.grad}"
                  f" attention() chose {row.get('attention_chose')}")
            for name, t in row.get("us_per_call", {}).items():
                print(f"  {name:<16} {t['median']:8.1f} us  ({t['min']:.1f}-{t['max']:.1f})")
            for name, why in row.get("skipped", {}).items():
                print(f"  {name:<16} skipped: {why}")
            for key, value in row.items():
                if key.endswith(("_identical_to_public", "_equals_eager", "_entry_found")) or key == "error":
                    print(f"  {key}: {value}")
            args.out.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
