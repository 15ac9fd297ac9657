#!/usr/bin/env python3
"""``attnforge.attention`` against every backend called directly, over the issue-17 shape grid (GPU only).

For every cell (shape x mode) of the grid below, each installed backend is called *directly* through its own
library function in its native layout (no attnforge code on the timed path), and ``attnforge.attention`` is
called the way a user would (bhsd tensors, and bshd tensors with ``layout="bshd"``). Every timing goes through
:func:`_timing.measure_many_ms`: rounds of :func:`attnforge.bench.timing.measure` (CUDA events, L2 flushed), the
harness bench and measure-on-first-use use, for both sides, every candidate of a cell once per round and the order
rotated round by round. The first ``attnforge.attention`` call
of each cell, mode and precision is timed alone first (``first_use_s``: with measure-on-first-use on, the cost
of measuring the candidates of that class); the ratios are from the second call on.

Per cell it reports: TFLOP/s of each candidate (bench's count: ``4 B Hq D`` x attended query-key pairs,
backward = 2.5x forward; the 2026-11-22 JSON predates this: it halved only square causal shapes and
counted fwd+bwd as 2.5x forward), the best exact
backend, attnforge's ratio to it, its
ratio to plain SDPA; and, on ``--quantized`` cells, the best with SageAttention allowed and attnforge with
``precision="allow_quantized"``. Each direct backend's output is checked against a float32 reference on one
(batch, head) slice; a backend whose error is over the bound is not counted as "best".

Usage (on the GPU machine, after ``attnforge verify``; run.sh's ``check`` stage, in a home without bench records):
    python scripts/gpu/grid_check.py --out grid.json [--cells NAME,...] [--budget-s 400] [--device cpu]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from _timing import first_call_s, measure_many_ms, ratio_spread, round_ratios, waited_s


@dataclass(frozen=True)
class Cell:
    name: str
    b: int
    hq: int
    hkv: int
    sq: int
    sk: int
    d: int
    causal: bool
    modes: tuple[str, ...] = ("fwd", "fwdbwd")
    quantized: bool = False  # also measure with SageAttention allowed


def grid() -> tuple[Cell, ...]:
    """The cells: ``attnforge bench --shapes grid`` (:data:`attnforge.bench.grid.REAL_GRID`) and
    ``--shapes diffusion`` (:data:`attnforge.bench.grid.DIFFUSION`, also measured with SageAttention allowed), so
    this check times exactly the shape classes that bench measured for the policy."""
    from attnforge.bench.grid import DIFFUSION, REAL_GRID

    cells = [Cell(name, b, hq, hkv, sq, sk, d, causal, modes=("fwd", "fwdbwd") if train else ("fwd",))
             for name, b, hq, hkv, sq, sk, d, causal, train in REAL_GRID]
    cells += [Cell(name, b, h, h, s, s, d, False, quantized=True) for name, b, h, s, d in DIFFUSION]
    return tuple(cells)


#: ``--grid unseen``: shapes neither bench's grid nor this repository's earlier runs used (issue 30's acceptance
#: grid is of this kind: GQA ratios 2-7, Sq != Sk, D 64/128/256, decode, diffusion lengths; fwd and fwd+bwd),
#: plus the two cells issue 30 names (D256 causal B2 H8 S4096 forward; MHA 1k fwd+bwd)
UNSEEN = (
    Cell("d256-b2h8-4k-causal", 2, 8, 8, 4096, 4096, 256, True),
    Cell("mha-1k-b4h32", 4, 32, 32, 1024, 1024, 128, False),
    Cell("qwen-gqa7-2k-causal", 2, 28, 4, 2048, 2048, 128, True),
    Cell("llama-gqa4-3k-causal", 1, 32, 8, 3072, 3072, 128, True),
    Cell("gemma-d256-gqa2-2k", 2, 16, 8, 2048, 2048, 256, True),
    Cell("cross-333x4096", 2, 16, 4, 333, 4096, 128, False),
    Cell("chunk-1k-of-6k-causal", 1, 32, 8, 1024, 6144, 128, True),
    Cell("decode-gqa7-16k", 16, 28, 4, 1, 16384, 128, False, modes=("fwd",)),
    Cell("decode-gqa4-2k-d64", 32, 16, 4, 1, 2048, 64, False, modes=("fwd",)),
    Cell("d64-8k-causal", 2, 12, 12, 8192, 8192, 64, True),
    Cell("sd3-4250", 2, 24, 24, 4250, 4250, 64, False, modes=("fwd",)),
    Cell("wan1.3b-32760", 1, 12, 12, 32760, 32760, 128, False, modes=("fwd",), quantized=True),
    Cell("flux-4608-h24", 1, 24, 24, 4608, 4608, 128, False, modes=("fwd",), quantized=True),
    Cell("hunyuan-d128-18k", 1, 24, 24, 18432, 18432, 128, False, modes=("fwd",), quantized=True),
)


def shrink(c: Cell) -> Cell:
    """The cell's structure at CPU size (dry runs): lengths / 64, at most 4 query heads, batch 1."""
    ratio = c.hq // c.hkv
    hq = max(ratio, min(c.hq, 4))
    return Cell(c.name, 1, hq, max(1, hq // ratio), 1 if c.sq == 1 else max(8, c.sq // 64), max(8, c.sk // 64),
                min(c.d, 64), c.causal, c.modes, c.quantized)


@dataclass
class Row:
    cell: str
    mode: str
    shape: dict[str, Any]
    tflops: dict[str, float] = field(default_factory=dict)
    ms: dict[str, float] = field(default_factory=dict)
    spread: dict[str, float] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    first_use_s: dict[str, float] = field(default_factory=dict)
    chosen: str | None = None
    #: the choice after the timed calls (the in-situ check runs after 64 calls of a class and may revert it)
    chosen_after: str | None = None
    #: the same for the bshd tensors' class (``layout="bshd"`` is a class of its own, decided and checked apart):
    #: the 2026-11-30 runs read attention() on bshd 2-12 % under its bhsd twin in four fwd(+bwd) rows, same backend
    chosen_bshd: str | None = None
    chosen_bshd_after: str | None = None
    chosen_quantized: str | None = None
    best_exact: str | None = None
    ratio_to_best: float | None = None
    ratio_bshd_to_best: float | None = None
    #: attention() on bhsd against the best public function called on the same bhsd tensors (SDPA's kernels, and
    #: FA3/FA4 on their transposed views): the 2026-11-30 run's three bhsd misses at 8k-16k were the kernels'
    #: stride penalty, which ``best_exact`` (FA3/FA4 timed on contiguous bshd copies) does not pay
    best_on_bhsd: str | None = None
    ratio_to_best_on_bhsd: float | None = None
    ratio_to_sdpa: float | None = None
    #: attention() on bshd tensors against plain SDPA on the same tensors' bhsd views (``sdpa-bshd``)
    ratio_bshd_to_sdpa_bshd: float | None = None
    best_quantized: str | None = None
    ratio_quantized_to_best: float | None = None
    ratio_quantized_to_sdpa: float | None = None
    #: per interleaved round, ``best_exact``'s median over attention()'s (bhsd) and plain SDPA's over attention()'s:
    #: ``[least, median, most]`` (:func:`_timing.round_ratios`). The ratios above divide two medians taken over all
    #: rounds; a round that ran slow for every side (the GPU's clock: the 2026-12-01 run's 16k fwd+bwd rows spread
    #: 4-9 % with one route timed twice at 17.85 and 18.98 ms) divides out here
    round_ratio_to_best: list[float] | None = None
    round_ratio_to_sdpa: list[float] | None = None
    #: each side's round medians (ms), in round order: what the round ratios pair
    rounds_ms: dict[str, list[float]] = field(default_factory=dict)
    #: the in-situ checks that ran inside this row's timed rounds (:func:`_log_insitu`): route, layout, verdict
    #: (None: kept; a string: reverted; "undecided"), seconds. A check times SDPA on live calls once per class (after
    #: 64 calls), so a round holding one runs slower for attention() alone (the forty-second session's D256 fwd+bwd
    #: row: rounds 1.100 / 1.204 / 1.230 ms against FA3's public 1.123-1.125; the cause not yet shown)
    insitu_checks: list[dict[str, Any]] = field(default_factory=list)


#: every in-situ check of the process, in order (:func:`_log_insitu`)
INSITU_LOG: list[dict[str, Any]] = []


def _log_insitu() -> None:
    """Wrap ``attnforge.dispatch.insitu.check`` and ``verdict`` (each looked up by name at each call) so each check is
    logged: a short call's check (``check``, its extra calls timed back to back) and a long call's (``verdict`` alone,
    reached after its live calls were timed in slices, SDPA serving half of them: ``"slices": True``; the
    forty-third session's Wan and HunyuanVideo bshd rows ran 3-4 % over FA3's own call in every round after warm-up,
    with no ``check`` logged)."""
    from attnforge.dispatch import insitu

    real, real_verdict = insitu.check, insitu.verdict
    if getattr(real, "logged", False):
        return
    inside: list[bool] = []

    def log(kwargs: dict[str, Any], reverted: Any, t0: float, *, slices: bool) -> None:
        call = kwargs.get("call")
        verdict = reverted if reverted is None or isinstance(reverted, str) else "undecided"
        INSITU_LOG.append({"route": kwargs.get("route"), "layout": str(getattr(call, "layout", None)),
                           "verdict": verdict, "s": round(time.perf_counter() - t0, 4), "slices": slices})

    def check(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        inside.append(True)
        try:
            reverted = real(*args, **kwargs)
        finally:
            inside.pop()
        log(kwargs, reverted, t0, slices=False)
        return reverted

    def verdict(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        reverted = real_verdict(*args, **kwargs)
        if not inside:  # a long call's check: its live calls were the slices
            log(kwargs, reverted, t0, slices=True)
        return reverted

    check.logged = True  # type: ignore[attr-defined]
    insitu.check, insitu.verdict = check, verdict


def flops(c: Cell, mode: str) -> float:
    """bench's FLOP count (:func:`attnforge.bench.flops.attention_flops`: attended pairs; backward = 2.5x forward)."""
    from attnforge.bench.flops import attention_flops
    from attnforge.types.shapes import Mode

    return attention_flops(batch=c.b, heads_q=c.hq, seqlen_q=c.sq, seqlen_k=c.sk, head_dim=c.d, causal=c.causal,
                           mode=Mode.FWD_BWD if mode == "fwdbwd" else Mode.FWD)


def fa3_entry_calls(torch: Any) -> dict[str, tuple[str, Callable[..., Any]]]:
    """Diagnostic baselines (never "the best"): the lean entry an ``--abi torch`` FA3 build carries
    (``flash_attn_3._C``, src/attnforge/backends/_fa3_direct.py), called here without ``attention()`` around it, on
    bhsd tensors as ``attention()`` calls it: ``-entry`` its C++ autograd node (``attnforge_attn``, one split, the
    train route, and a forward with no gradient), ``-entry-splits0`` its forward with FA3's split heuristic (the
    route of a call that needs no gradient; forward only). The forty-third and forty-fourth sessions' Wan and
    HunyuanVideo bhsd rows ran 2-3 % over FA3's public function on the same views in every round, the D256
    fwd+bwd row 6 %, while the bshd rows through FA4 matched FA4's own: these two say whether the entry or what
    ``attention()`` adds around it is the part."""
    import sys

    entry = sys.modules.get("flash_attn_3._C")
    if entry is None or not hasattr(entry, "attnforge_attn"):
        return {}

    def train_node(q: Any, k: Any, v: Any, causal: bool) -> Any:
        return entry.attnforge_attn(q, k, v, q.shape[-1] ** -0.5, causal, -1, -1, 0.0, True)

    def forward_splits0(q: Any, k: Any, v: Any, causal: bool) -> Any:
        if torch.is_grad_enabled() and q.requires_grad:
            raise RuntimeError("forward only (no autograd node)")
        a = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return entry.attnforge_fwd(*a, q.shape[-1] ** -0.5, causal, -1, -1, 0.0, 0)[0].transpose(1, 2)

    return {"flash-attn-3-entry": ("bhsd", train_node), "flash-attn-3-entry-splits0": ("bhsd", forward_splits0)}


def direct_backends(torch: Any) -> dict[str, tuple[str, Callable[..., Any]]]:
    """name -> (layout, fn(q, k, v, causal) -> out) for every backend importable here, each called directly."""
    import torch.nn.functional as F  # noqa: N812
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def bottom_right_mask(q: Any, k: Any) -> Any:
        sq, sk = q.shape[-2], k.shape[-2]
        return torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)

    def sdpa(kernel: Any) -> Callable[..., Any]:
        def call(q: Any, k: Any, v: Any, causal: bool) -> Any:
            gqa = q.shape[1] != k.shape[1]
            mask = bottom_right_mask(q, k) if causal and q.shape[-2] != k.shape[-2] else None
            if kernel is None:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                                      enable_gqa=gqa)
            with sdpa_kernel([kernel]):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                                      enable_gqa=gqa)
        return call

    def sdpa_bshd(q: Any, k: Any, v: Any, causal: bool) -> Any:
        """Plain SDPA as a ``[B, S, H, D]`` caller calls it (diffusers' native backend, a model whose projections
        give bshd): on the transposed views, the output transposed back."""
        return sdpa(None)(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal).transpose(1, 2)

    out: dict[str, tuple[str, Callable[..., Any]]] = {
        "sdpa": ("bhsd", sdpa(None)),
        "sdpa-bshd": ("bshd", sdpa_bshd),
        "sdpa-cudnn": ("bhsd", sdpa(SDPBackend.CUDNN_ATTENTION)),
        "sdpa-flash": ("bhsd", sdpa(SDPBackend.FLASH_ATTENTION)),
        "sdpa-efficient": ("bhsd", sdpa(SDPBackend.EFFICIENT_ATTENTION)),
    }
    def bshd_out(kernel: Callable[..., Any]) -> Callable[..., Any]:
        """A FlashAttention kernel that returns ``out`` or ``(out, lse)`` depending on its version: ``out``."""
        def call(q: Any, k: Any, v: Any, causal: bool) -> Any:
            o = kernel(q, k, v, causal=causal)
            return o[0] if isinstance(o, tuple) else o
        return call

    def on_bhsd_views(kernel: Callable[..., Any]) -> Callable[..., Any]:
        """A bshd public function as a caller holding ``[B, H, S, D]`` tensors calls it: on their
        ``transpose(1, 2)`` views (no copy; stride(-1) stays 1), the output transposed back to bhsd."""
        def call(q: Any, k: Any, v: Any, causal: bool) -> Any:
            return kernel(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal).transpose(1, 2)
        return call

    try:
        import flash_attn_interface as fa3

        out["flash-attn-3"] = ("bshd", bshd_out(fa3.flash_attn_func))
        out["flash-attn-3-on-bhsd"] = ("bhsd", on_bhsd_views(bshd_out(fa3.flash_attn_func)))
        out.update(fa3_entry_calls(torch))
    except Exception as exc:
        print(f"flash-attn-3 not importable: {exc}")
    try:
        from flash_attn.cute import flash_attn_func as fa4_func

        out["flash-attn-4"] = ("bshd", bshd_out(fa4_func))
        out["flash-attn-4-on-bhsd"] = ("bhsd", on_bhsd_views(bshd_out(fa4_func)))
    except Exception as exc:
        print(f"flash-attn-4 not importable: {exc}")
    try:
        import sageattention

        def sage_call(q: Any, k: Any, v: Any, causal: bool) -> Any:
            if causal and q.shape[-2] != k.shape[-2]:
                raise RuntimeError("sageattention: causal with Sq != Sk is top-left aligned; not comparable")
            return sageattention.sageattn(q, k, v, tensor_layout="HND", is_causal=causal)
        out["sageattention-2"] = ("bhsd", sage_call)
    except Exception as exc:
        print(f"sageattention not importable: {exc}")
    return out


QUANTIZED = {"sageattention-2"}
#: baselines only, never "the best backend" (plain SDPA on bshd views: what attention() on bshd is held to)
BASELINES = {"sdpa-bshd", "flash-attn-3-entry", "flash-attn-3-entry-splits0"}


def outside_build(name: str, cell: Cell, mode: str, dtype: Any) -> str | None:
    """Why the installed build of ``name`` has no kernel for this cell (its recorded slim capabilities)."""
    try:
        from attnforge.cache.capabilities import backend_capabilities
    except ImportError:
        return None
    # the same build, called on views or through its lean entry
    base = "flash-attn-3" if name.startswith("flash-attn-3-entry") else name.removesuffix("-on-bhsd")
    caps = backend_capabilities(base)
    if caps is None:
        return None
    why = caps.outside(dtype=str(dtype).removeprefix("torch."), head_dim=cell.d, backward=mode == "fwdbwd")
    return f"outside this build: {why}" if why else None


def reference(torch: Any, q: Any, k: Any, v: Any, causal: bool) -> Any:
    """float32 reference on batch 0, head 0 (bhsd): q [Sq, D], k/v [Sk, D] of the matching kv head."""
    q0, k0, v0 = q[0, 0].float(), k[0, 0].float(), v[0, 0].float()
    s = (q0 @ k0.T) / math.sqrt(q0.shape[-1])
    if causal:
        sq, sk = s.shape
        s = s.masked_fill(~torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril(sk - sq), float("-inf"))
    return torch.softmax(s, dim=-1) @ v0


def inputs(torch: Any, cell: Cell, *, grad: bool, dtype: Any, dev: str) -> tuple[Any, ...]:
    """The cell's ``q, k, v`` as bhsd leaves and as bshd leaves (contiguous copies), seeded."""
    torch.manual_seed(0)
    qb = torch.randn(cell.b, cell.hq, cell.sq, cell.d, device=dev, dtype=dtype, requires_grad=grad)
    kb = torch.randn(cell.b, cell.hkv, cell.sk, cell.d, device=dev, dtype=dtype, requires_grad=grad)
    vb = torch.randn(cell.b, cell.hkv, cell.sk, cell.d, device=dev, dtype=dtype, requires_grad=grad)
    qs, ks, vs = (t.detach().transpose(1, 2).contiguous().requires_grad_(grad) for t in (qb, kb, vb))
    return qb, kb, vb, qs, ks, vs


def as_timed(torch: Any, fn: Callable[[], Any], grad: bool) -> Callable[[], Any]:
    """``fn`` as one timed call: the forward alone, or forward then ``backward(ones_like(out))``."""
    if not grad:
        return fn

    def fb() -> None:
        o = fn()
        o.backward(torch.ones_like(o))
    return fb


def profile_cell(torch: Any, attnforge: Any, backends: dict[str, tuple[str, Callable[..., Any]]], *,
                 cell: Cell, mode: str, dtype: Any, dev: str = "cuda", calls: int = 5,
                 settle: int = 0) -> dict[str, Any]:
    """Where a gap between ``attention()`` and a backend's public function lies: per candidate (each public
    function, attention() on bhsd and bshd, ``attention(backend=<the chosen one>)``), the device µs per call of
    every kernel and of every CUDA API call over ``calls`` calls (torch.profiler), and the wall ms per call.

    The candidates are timed as in :func:`measure` (forward, or forward + ``backward(ones_like(out))``); leaves'
    ``.grad`` is reset before each candidate, so each profile sees the same accumulation. ``settle``: calls each
    candidate makes before it is timed, past attention()'s in-situ check (64 calls of a class): the grid times
    attention() in that steady state, a bare profile before it. Every candidate settles alike: on the H200
    (2026-11-30, ``--profile-settle 100`` applied to attention()'s candidates alone, which ran last) the same
    kernels read 4-8 % more device time for attention() than for the public functions profiled before them, while
    the grid's interleaved rounds read them even: sustained load moves the clocks."""
    grad = mode == "fwdbwd"
    qb, kb, vb, qs, ks, vs = inputs(torch, cell, grad=grad, dtype=dtype, dev=dev)
    chosen = getattr(attnforge.explain(qb, kb, vb, causal=cell.causal), "chosen", None)
    cands: dict[str, Callable[[], Any]] = {}
    for name, (lay, fn) in backends.items():
        if name in QUANTIZED or outside_build(name, cell, mode, dtype):
            continue
        a = (qs, ks, vs) if lay == "bshd" else (qb, kb, vb)
        cands[name] = as_timed(torch, lambda fn=fn, a=a: fn(*a, cell.causal), grad)
    cands["attnforge"] = as_timed(torch, lambda: attnforge.attention(qb, kb, vb, causal=cell.causal), grad)
    cands["attnforge-bshd"] = as_timed(torch, lambda: attnforge.attention(qs, ks, vs, causal=cell.causal,
                                                                          layout="bshd"), grad)
    if chosen:
        cands[f"attnforge-forced-{chosen}-bshd"] = as_timed(torch, lambda: attnforge.attention(
            qs, ks, vs, causal=cell.causal, layout="bshd", backend=chosen), grad)
    # each FlashAttention route forced on both layouts, whether chosen or not: on the H200 (2026-11-30, the
    # twenty-fifth session) the in-situ check timed FA3's route on bhsd fwd+bwd at 1k keys 30-38 % slower than SDPA
    # (two sessions) while warm-up timed it 8-11 % faster and FA3's public function on the same bhsd views ran 8 %
    # faster in the grid: these say whether the route or the check's timing is off
    for name in ("flash-attn-3", "flash-attn-4"):
        if name not in backends or outside_build(name, cell, mode, dtype):
            continue
        cands[f"attnforge-forced-{name}"] = as_timed(torch, lambda name=name: attnforge.attention(
            qb, kb, vb, causal=cell.causal, backend=name), grad)
        cands.setdefault(f"attnforge-forced-{name}-bshd", as_timed(torch, lambda name=name: attnforge.attention(
            qs, ks, vs, causal=cell.causal, layout="bshd", backend=name), grad))
    out: dict[str, Any] = {"cell": cell.name, "mode": mode, "chosen": chosen, "calls": calls, "settle": settle,
                           "candidates": {}}
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    for name, fn in cands.items():
        for t in (qb, kb, vb, qs, ks, vs):
            t.grad = None
        try:
            for _ in range(3 + settle):  # every candidate alike: the settle calls also warm the device's clocks
                fn()
            sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            wall_ms = (time.perf_counter() - t0) / calls * 1e3
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
            with profile(activities=acts) as prof:
                for _ in range(calls):
                    fn()
                sync()
            evs = prof.key_averages()
            kernels = sorted(({"name": e.key[:140], "per_call": e.count / calls,
                               "device_us_per_call": round(e.device_time_total / calls, 1)}
                              for e in evs if e.device_time_total > 0 and e.self_cpu_time_total == 0),
                             key=lambda r: -r["device_us_per_call"])
            ops = sorted(({"name": e.key[:140], "per_call": e.count / calls,
                           "self_cpu_us_per_call": round(e.self_cpu_time_total / calls, 1)}
                          for e in evs if e.self_cpu_time_total > 0), key=lambda r: -r["self_cpu_us_per_call"])
            out["candidates"][name] = {"wall_ms": round(wall_ms, 4),
                                       "device_us_per_call": round(sum(k["device_us_per_call"] for k in kernels), 1),
                                       "kernels": kernels[:20], "host_ops": ops[:25]}
        except Exception as exc:
            out["candidates"][name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print(f"profile {cell.name}/{mode} {name}: " + json.dumps(
            {k: v for k, v in out["candidates"][name].items() if k in ("wall_ms", "device_us_per_call", "error")}),
            flush=True)
    out["chosen_after"] = getattr(attnforge.explain(qb, kb, vb, causal=cell.causal), "chosen", None)
    out["chosen_bshd_after"] = getattr(attnforge.explain(qs, ks, vs, causal=cell.causal, layout="bshd"),
                                       "chosen", None)
    return out


def measure(torch: Any, attnforge: Any, backends: dict[str, tuple[str, Callable[..., Any]]], *,
            cell: Cell, mode: str, dtype: Any, dev: str = "cuda") -> Row:
    """One cell in one mode: every direct backend and attnforge, timed in interleaved rounds."""
    row = Row(cell=cell.name, mode=mode, shape=asdict(cell))
    grad = mode == "fwdbwd"
    qb, kb, vb, qs, ks, vs = inputs(torch, cell, grad=grad, dtype=dtype, dev=dev)
    ref = reference(torch, qb.detach(), kb.detach(), vb.detach(), cell.causal)
    cands: dict[str, Callable[[], Any]] = {}

    def timed(fn: Callable[[], Any], grad: bool = grad) -> Callable[[], Any]:
        return as_timed(torch, fn, grad)

    for name, (lay, fn) in backends.items():
        args_ = (qs, ks, vs) if lay == "bshd" else (qb, kb, vb)
        why = outside_build(name, cell, mode, dtype)
        if why:  # a slim build has no kernel here: calling it directly would crash (SIGSEGV), not raise
            row.failed[name] = why
            continue
        try:
            with torch.no_grad():
                o = fn(*(a.detach() for a in args_), cell.causal)
            o0 = (o[0, :, 0] if lay == "bshd" else o[0, 0]).float()
            row.errors[name] = float((o0 - ref).norm() / ref.norm())
            cands[name] = timed(lambda fn=fn, a=args_: fn(*a, cell.causal))
        except Exception as exc:
            row.failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    precisions = ["exact"] + (["allow_quantized"] if cell.quantized else [])
    for prec in precisions:
        label = "attnforge" if prec == "exact" else "attnforge-q"
        try:
            row.first_use_s[label] = first_call_s(torch, timed(
                lambda p=prec: attnforge.attention(qb, kb, vb, causal=cell.causal, precision=p)))
            row.first_use_s[label + "-measured"] = waited_s(timeout_s=120)  # first use measures off the calling thread
            row.first_use_s[label + "-bshd"] = first_call_s(torch, timed(
                lambda p=prec: attnforge.attention(qs, ks, vs, causal=cell.causal, precision=p, layout="bshd")))
            row.first_use_s[label + "-bshd-measured"] = waited_s(timeout_s=120)
            ex = attnforge.explain(qb, kb, vb, causal=cell.causal, precision=prec)
            chosen = getattr(ex, "chosen", None)
            if prec == "exact":
                row.chosen = chosen
                row.chosen_bshd = getattr(attnforge.explain(qs, ks, vs, causal=cell.causal, layout="bshd"),
                                          "chosen", None)
            else:
                row.chosen_quantized = chosen
            with torch.no_grad():
                o = attnforge.attention(qb.detach(), kb.detach(), vb.detach(), causal=cell.causal,
                                        precision=prec)
            row.errors[label] = float((o[0, 0].float() - ref).norm() / ref.norm())
            cands[label] = timed(lambda p=prec: attnforge.attention(qb, kb, vb, causal=cell.causal,
                                                                    precision=p))
            cands[label + "-bshd"] = timed(lambda p=prec: attnforge.attention(qs, ks, vs, causal=cell.causal,
                                                                              layout="bshd", precision=p))
        except Exception as exc:
            row.failed[label] = f"{type(exc).__name__}: {exc}"[:300]
            traceback.print_exc()
    f = flops(cell, mode)
    set_bytes = sum(t.numel() * t.element_size() for t in (qb, kb, vb))
    def reset_grads(_name: str) -> None:
        if grad:
            for t in (qb, kb, vb, qs, ks, vs):
                t.grad = None

    logged = len(INSITU_LOG)
    timed_all = measure_many_ms(torch, {n: fn for n, fn in cands.items() if n not in row.failed},
                                set_bytes=set_bytes, after=reset_grads)
    row.insitu_checks = INSITU_LOG[logged:]
    for n, m in timed_all.items():
        if "error" in m:
            row.failed[n] = m["error"]
            continue
        row.ms[n] = m["median_ms"]
        row.rounds_ms[n] = m["rounds_ms"]
        row.spread[n] = (m["hi_ms"] - m["lo_ms"]) / m["median_ms"] if m["median_ms"] else 0.0
        row.tflops[n] = f / (m["median_ms"] * 1e-3) / 1e12
    if "attnforge" in cands:
        row.chosen_after = getattr(attnforge.explain(qb, kb, vb, causal=cell.causal), "chosen", None)
        row.chosen_bshd_after = getattr(attnforge.explain(qs, ks, vs, causal=cell.causal, layout="bshd"),
                                        "chosen", None)
    exact_ok = [n for n in backends if n in row.ms and n not in QUANTIZED | BASELINES
                and row.errors.get(n, 1) < 2e-2]
    if exact_ok and "attnforge" in row.ms:
        best = min(exact_ok, key=lambda n: row.ms[n])
        row.best_exact = best
        row.ratio_to_best = row.ms[best] / row.ms["attnforge"]
        if "attnforge-bshd" in row.ms:
            row.ratio_bshd_to_best = row.ms[best] / row.ms["attnforge-bshd"]
        same = [n for n in exact_ok if backends[n][0] == "bhsd"]
        if same:
            row.best_on_bhsd = min(same, key=lambda n: row.ms[n])
            row.ratio_to_best_on_bhsd = row.ms[row.best_on_bhsd] / row.ms["attnforge"]
        row.round_ratio_to_best = ratio_spread(round_ratios(row.rounds_ms, base=best, new="attnforge", reps=1))
        if "sdpa" in row.ms:
            row.ratio_to_sdpa = row.ms["sdpa"] / row.ms["attnforge"]
            row.round_ratio_to_sdpa = ratio_spread(round_ratios(row.rounds_ms, base="sdpa", new="attnforge", reps=1))
        if "sdpa-bshd" in row.ms and "attnforge-bshd" in row.ms:
            row.ratio_bshd_to_sdpa_bshd = row.ms["sdpa-bshd"] / row.ms["attnforge-bshd"]
    if cell.quantized and "attnforge-q" in row.ms:
        q_ok = [n for n in backends if n in row.ms and row.errors.get(n, 1) < 0.1]
        if q_ok:
            bq = min(q_ok, key=lambda n: row.ms[n])
            row.best_quantized = bq
            row.ratio_quantized_to_best = row.ms[bq] / row.ms["attnforge-q"]
        if "sdpa" in row.ms:
            row.ratio_quantized_to_sdpa = row.ms["sdpa"] / row.ms["attnforge-q"]
    return row


def summarize(rows: list[Row], device: str, torch_version: str) -> dict[str, Any]:
    """The issue-22 figures over the rows so far: ratios to the best, >= 0.97x count, geomean over SDPA (exact),
    quantized speed-up over SDPA on >= 16k-token cells, first-use seconds per class."""
    ratios = [r.ratio_to_best for r in rows if r.ratio_to_best]
    on_bhsd = [r.ratio_to_best_on_bhsd for r in rows if r.ratio_to_best_on_bhsd]
    vs_sdpa = [r.ratio_to_sdpa for r in rows if r.ratio_to_sdpa]
    vs_sdpa_bshd = [r.ratio_bshd_to_sdpa_bshd for r in rows if r.ratio_bshd_to_sdpa_bshd]
    return {
        "cells": len(rows),
        "geomean_ratio_to_best": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
        "min_ratio_to_best": min(ratios) if ratios else None,
        "cells_ge_0.97": sum(1 for x in ratios if x >= 0.97),
        "cells_with_ratio": len(ratios),
        "cells_ge_0.97_on_bhsd_tensors": sum(1 for x in on_bhsd if x >= 0.97),
        "min_ratio_to_best_on_bhsd_tensors": min(on_bhsd) if on_bhsd else None,
        "chosen_is_fastest": sum(1 for r in rows if r.chosen and r.chosen == r.best_exact),
        "geomean_over_sdpa": math.exp(sum(map(math.log, vs_sdpa)) / len(vs_sdpa)) if vs_sdpa else None,
        "cells_ge_sdpa": sum(1 for x in vs_sdpa if x >= 1.0),
        # the same two counts on the per-round ratios' medians (Row.round_ratio_to_best / _to_sdpa)
        "cells_ge_0.97_round_median": sum(1 for r in rows
                                          if r.round_ratio_to_best and r.round_ratio_to_best[1] >= 0.97),
        "cells_ge_sdpa_round_median": sum(1 for r in rows if r.round_ratio_to_sdpa and r.round_ratio_to_sdpa[1] >= 1.0),
        "geomean_bshd_over_sdpa_bshd": (math.exp(sum(map(math.log, vs_sdpa_bshd)) / len(vs_sdpa_bshd))
                                        if vs_sdpa_bshd else None),
        "cells_bshd_ge_sdpa_bshd": sum(1 for x in vs_sdpa_bshd if x >= 1.0),
        "quantized_over_sdpa": {f"{r.cell}/{r.mode}": r.ratio_quantized_to_sdpa for r in rows
                                if r.ratio_quantized_to_sdpa},
        "quantized_ge16k_over_sdpa": [r.ratio_quantized_to_sdpa for r in rows if r.ratio_quantized_to_sdpa
                                      and r.shape["sq"] >= 16384],
        "first_use_s": {f"{r.cell}/{r.mode}": r.first_use_s for r in rows},
        "max_first_use_s": max((v for r in rows for v in r.first_use_s.values()), default=None),
        "device": device,
        "torch": torch_version,
    }


def write(path: str, rows: list[Row], summary: dict[str, Any]) -> None:
    """The JSON so far (after every row: a stage killed at its time limit keeps what was measured)."""
    with open(path, "w") as fh:
        json.dump({"summary": summary, "rows": [asdict(r) for r in rows]}, fh, indent=1)


def warm(cells: tuple[Cell, ...], wanted: set[str], args: Any, t_start: float) -> None:
    """``attnforge warmup`` of the cells' shapes (each mode), timed; prints one line per class. The quantized cells'
    shapes are warmed again with ``precision="allow_quantized"`` (``attnforge warmup --precision allow_quantized``),
    as a deployment that serves such calls does: warmed exact only, their first quantized call took 0.96-1.81 s
    on an H200 (2026-12-03, the forty-fourth session)."""
    from attnforge.dispatch.warmup import warmup
    from attnforge.types.shapes import AttentionShape, Layout, Mode

    shapes, quantized = [], []
    for cell in cells:
        if wanted and cell.name not in wanted:
            continue
        c = cell if args.device == "cuda" else shrink(cell)
        for mode in c.modes:
            # both layouts: the grid calls attention() in each (a first call at other strides may build again)
            shapes += [AttentionShape(batch=c.b, heads_q=c.hq, heads_kv=c.hkv, seqlen_q=c.sq, seqlen_k=c.sk,
                                      head_dim=c.d, causal=c.causal, dtype=args.dtype.removeprefix("torch."),
                                      mode=Mode.FWD_BWD if mode == "fwdbwd" else Mode.FWD, layout=layout)
                       for layout in (Layout.BHSD, Layout.BSHD)]
            if c.quantized and mode == "fwd":
                quantized += shapes[-2:]
    reports = [("exact", warmup(shapes, device=args.device, rounds=args.warmup_rounds,
                                budget_s=args.warmup_budget_s))]
    if quantized:
        reports.append(("allow_quantized", warmup(quantized, device=args.device, rounds=args.warmup_rounds,
                                                   budget_s=args.warmup_budget_s, precision="allow_quantized")))
    for precision, report in reports:
        for w in report.classes:
            again = " [contested: timed again]" if w.timed_again else ""
            print(f"warmup {w.shape_class} {w.shape.layout.value} {precision}: {w.chosen} ({w.basis}){again} "
                  f"{w.duration_s:.1f} s {w.error}", flush=True)
    print(f"warmup: {sum(len(r.classes) for _, r in reports)} classes in {time.monotonic() - t_start:.0f} s, "
          f"measuring={reports[0][1].measuring}, compiled files {sum(r.compiled_files for _, r in reports)}",
          flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default="")
    ap.add_argument("--modes", default="",
                    help="fwd,fwdbwd: only these modes of the chosen cells (warm-up included); Wan-720p's fwd+bwd row "
                         "alone did not fit a call after its fwd row in three sessions")
    ap.add_argument("--skip", default="",
                    help="backends not timed (e.g. sdpa-efficient,sdpa-flash: 2-5x the best at >= 16k tokens, "
                         "~1 s a fwd+bwd call at Wan-720p's 32760 tokens); the JSON names them under each row's failed")
    ap.add_argument("--grid", choices=("bench", "unseen", "all"), default="bench",
                    help="bench: bench's grid + diffusion; unseen: UNSEEN (shapes bench never measured); all: both")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the flow at tiny sizes")
    ap.add_argument("--budget-s", type=float, default=480)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--warmup", action="store_true",
                    help="first `attnforge warmup` the chosen cells (attnforge.dispatch.warmup, the CLI's code), so "
                         "the check times what a deployment gets after its warm-up step")
    ap.add_argument("--warmup-rounds", type=int, default=5,
                    help="interleaved rounds per candidate in the warm-up (attnforge.autotune's rounds)")
    ap.add_argument("--warmup-budget-s", type=float, default=1.0,
                    help="the warm-up's timing budget per class, s (attnforge.autotune's budget_s)")
    ap.add_argument("--profile", default="",
                    help="CELL:MODE,...: instead of the check, profile those cells (profile_cell) into --out")
    ap.add_argument("--profile-settle", type=int, default=0,
                    help="calls each attention() candidate makes before its profile (100: past the in-situ check, "
                         "the state the grid times)")
    args = ap.parse_args()

    import torch

    import attnforge

    _log_insitu()
    t_start = time.monotonic()
    dtype = getattr(torch, args.dtype)
    wanted = {n for n in args.cells.split(",") if n}
    modes = {m for m in args.modes.split(",") if m}
    if modes - {"fwd", "fwdbwd"}:
        ap.error(f"--modes takes fwd and fwdbwd, not {sorted(modes - {'fwd', 'fwdbwd'})}")
    backends = direct_backends(torch)
    skipped = {n for n in args.skip.split(",") if n}
    for name in skipped:
        backends.pop(name, None)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    rows: list[Row] = []
    cells = {"bench": grid(), "unseen": UNSEEN, "all": grid() + UNSEEN}[args.grid]
    if modes:
        cells = tuple(dataclasses.replace(c, modes=tuple(m for m in c.modes if m in modes)) for c in cells)
    if args.warmup:
        warm(cells, wanted, args, t_start)
    if args.profile:
        by_name = {c.name: c for c in cells}
        profiles = []
        for item in args.profile.split(","):
            name, _, mode = item.partition(":")
            c = by_name[name] if args.device == "cuda" else shrink(by_name[name])
            profiles.append(profile_cell(torch, attnforge, backends, cell=c, mode=mode or "fwd", dtype=dtype,
                                         dev=args.device, settle=args.profile_settle))
            with open(args.out, "w") as fh:
                json.dump({"device": device, "torch": torch.__version__, "profiles": profiles}, fh, indent=1)
        return 0
    for cell in cells:
        if wanted and cell.name not in wanted:
            continue
        for mode in cell.modes:
            if time.monotonic() - t_start > args.budget_s:
                print(f"budget spent: stopping before {cell.name}/{mode}")
                break
            c = cell if args.device == "cuda" else shrink(cell)
            t_row = time.monotonic()
            row = measure(torch, attnforge, backends, cell=c, mode=mode, dtype=dtype, dev=args.device)
            row.failed.update(dict.fromkeys(sorted(skipped), "skipped (--skip)"))
            rows.append(row)
            print(f"# {cell.name}/{mode}: {time.monotonic() - t_row:.0f} s", flush=True)
            print(f"{cell.name:22s} {mode:7s} chosen={row.chosen} best={row.best_exact} "
                  f"ratio={row.ratio_to_best} on_bhsd={row.ratio_to_best_on_bhsd} vs_sdpa={row.ratio_to_sdpa} "
                  f"bshd_vs_sdpa_bshd={row.ratio_bshd_to_sdpa_bshd} "
                  f"q={row.ratio_quantized_to_sdpa} "
                  f"failed={list(row.failed)}", flush=True)
            write(args.out, rows, summarize(rows, device, torch.__version__))
            if args.device == "cuda":
                torch.cuda.empty_cache()

    summary = summarize(rows, device, torch.__version__)
    write(args.out, rows, summary)
    print("\n| cell | mode | chosen | best exact | attnforge/best | bshd/best | attnforge vs SDPA "
          "| bshd vs SDPA on bshd | q vs SDPA |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        def fmt(x: float | None) -> str:
            return "-" if x is None else f"{x:.3f}"
        print(f"| {r.cell} | {r.mode} | {r.chosen} | {r.best_exact} | {fmt(r.ratio_to_best)} | "
              f"{fmt(r.ratio_bshd_to_best)} | {fmt(r.ratio_to_sdpa)} | {fmt(r.ratio_bshd_to_sdpa_bshd)} | "
              f"{fmt(r.ratio_quantized_to_sdpa)} |")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
