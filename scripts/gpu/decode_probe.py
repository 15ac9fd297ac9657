#!/usr/bin/env python3
"""Where a padded decode loses (issue 30, docs/benchmarks.md 2026-11-27: Llama-3-8B-shaped ``generate`` decoded
0.77x the default's tokens/s with the same kernels): the SDPA calls of one decode step, timed as a model issues
them: SDPA with a bool mask (transformers' default), SDPA with that mask additive (what the SDPA adapter hands it
now, prepared once per mask object), SDPA on transformers' packed query, and ``attention()``.

1. ``calls``: Llama-3-8B's decode call (``q [4, 32, 1, 128]``, ``k/v [4, 8, Sk, 128]`` bf16, a ``[4, 1, 1, Sk]``
   bool padding mask), ``Sk`` growing by one each call (a new K/V tensor each time, as ``DynamicCache`` cats), 64
   calls back to back between two synchronizes, wall µs per call, for each variant above; each also at a fixed
   ``Sk``, and with four calls sharing each mask object (``*_layers4``, as a model's layers do; ``*_new_lengths``:
   lengths no call had before, as a generate loop's next tokens). Each variant's
   GPU kernels and CUDA API calls (torch.profiler) and its host syncs
   (``set_sync_debug_mode``). (2026-11-28, H100: the packed query took cuDNN's 64-row kernel, 2.5x the device time
   of the ``enable_gqa`` call's; attention()'s extra cost was the mask preparation's kernel launches.)
2. ``generate``: the 2-layer Llama-3-8B-shaped model's padded ``generate`` (prefill, decode tokens/s) with
   transformers' SDPA and ``attnforge``, interleaved (the host's pace drifts).

Usage: ``python scripts/gpu/decode_probe.py --out decode.json [--device cpu]`` (cpu: float32 at tiny sizes).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import time
from collections.abc import Callable
from typing import Any

import models_e2e
from _timing import median


def _tensors(torch: Any, dev: str, dt: Any, small: bool, *, batch: int = 4, keys: int = 1024) -> tuple[Any, ...]:
    b, hq, hkv, d, s0 = (batch, 8, 2, 16, keys // 16) if small else (batch, 32, 8, 128, keys)
    torch.manual_seed(0)
    q = torch.randn(b, hq, 1, d, device=dev, dtype=dt)
    kv = torch.randn(2, b, hkv, s0 + 460, d, device=dev, dtype=dt)
    return q, kv, s0


def _step_inputs(torch: Any, kv: Any, s0: int, n: int, grow: bool) -> list[tuple[Any, Any, Any]]:
    out = []
    for i in range(n):
        sk = s0 + (i if grow else 0) + 1
        k, v = (t[:, :, :sk].clone() for t in kv)  # a new tensor per call, as DynamicCache's torch.cat makes
        mask = torch.ones(k.shape[0], 1, 1, sk, dtype=torch.bool, device=k.device)
        mask[min(1, k.shape[0] - 1), ..., : s0 // 5] = False  # left padding on one row
        out.append((k, v, mask))
    return out


def calls(torch: Any, dev: str, dt: Any, small: bool) -> dict[str, Any]:
    import torch.nn.functional as F  # noqa: N812

    import attnforge

    q, kv, s0 = _tensors(torch, dev, dt, small)
    hq, hkv = q.shape[1], kv.shape[2]
    g = hq // hkv

    def gqa(k: Any, v: Any, m: Any) -> Any:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)

    def packed(k: Any, v: Any, m: Any) -> Any:
        out = F.scaled_dot_product_attention(q.reshape(q.shape[0], hkv, g, q.shape[3]), k, v, attn_mask=m)
        return out.reshape(q.shape)

    def additive(k: Any, v: Any, m: Any) -> Any:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=adds[id(m)], enable_gqa=True)

    def af(k: Any, v: Any, m: Any) -> Any:
        return attnforge.attention(q, k, v, attn_mask=m)

    variants: dict[str, Callable[..., Any]] = {"sdpa_enable_gqa": gqa, "sdpa_additive": additive,
                                               "sdpa_packed": packed, "attention": af,
                                               "sdpa_enable_gqa_layers4": gqa, "attention_layers4": af}
    res: dict[str, Any] = {"q": list(q.shape), "k0": [kv.shape[1], hkv, s0 + 1, kv.shape[4]]}
    ref = None
    for grow in (True, False):
        inputs = _step_inputs(torch, kv, s0, 64, grow)
        adds = {id(m): torch.zeros(m.shape, dtype=dt, device=m.device).masked_fill_(~m, float("-inf"))
                for _, _, m in inputs}
        # "_layers4": four calls share each mask object, as four layers of one forward do
        layered = [x for x in inputs[:16] for _ in range(4)]
        for name, fn in variants.items():
            calls_of = layered if name.endswith("_layers4") else inputs
            for k, v, m in calls_of[:4]:
                fn(k, v, m)  # first use, caches
            best, out = _best_us_per_call(torch, fn, [calls_of] * 5)
            res[f"{name}{'' if grow else '_fixed_sk'}_us"] = best
            if grow and not name.endswith("_layers4"):
                if ref is None:
                    ref = out.float()
                res[f"{name}_max_abs_diff"] = float((out.float() - ref).abs().max())
                res[f"{name}_syncs"] = models_e2e._syncs(torch, lambda fn=fn, xs=inputs[:8]: [fn(*x) for x in xs])
                res[f"{name}_profile"] = _profile(torch, dev, lambda fn=fn, xs=inputs[:8]: [fn(*x) for x in xs])
    # "_new_lengths": as "_layers4", but every round's 16 steps have lengths no call had before, as a generate
    # loop's next tokens do (the rounds above repeat their lengths, so from the second round on each was seen)
    fresh_variants = (("sdpa_enable_gqa_layers4_new_lengths", gqa), ("attention_layers4_new_lengths", af))
    for j, (name, fn) in enumerate(fresh_variants):
        rounds = [[x for x in _step_inputs(torch, kv, s0 + 100 + 16 * r + 90 * j, 16, True) for _ in range(4)]
                  for r in range(5)]
        res[f"{name}_us"] = _best_us_per_call(torch, fn, rounds)[0]
    res["first_call_on_a_new_length"] = _first_calls(torch, dev, q, kv, s0, gqa=gqa, af=af)
    return res


def _first_calls(torch: Any, dev: str, q: Any, kv: Any, s0: int, *, gqa: Callable[..., Any],
                 af: Callable[..., Any]) -> dict[str, Any]:
    """Each variant's first call on a length it never had, one call between two synchronizes (wall µs: median, max
    of 8 lengths; then the same calls again), and the kernels of one call. 2026-11-28 (H200): 16 new lengths x
    4 calls cost ~11.6 ms a call for SDPA with ``enable_gqa`` and a bool mask, and for attention(); cuDNN's
    attention builds a graph per sequence length (ml-explore/mlx#2743 on cuDNN SDPA). ``sdpa_repeat_kv`` is
    transformers' masked path (K/V repeated to Hq heads, no ``enable_gqa``); ``*_no_cudnn`` excludes cuDNN;
    ``*_unmasked*`` is an unpadded batch's step (no mask), whose plain route the SDPA adapter does not touch."""
    import torch.nn.functional as F  # noqa: N812
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import attnforge
    from attnforge.backends.sdpa import _decode_without_cudnn

    g = q.shape[1] // kv.shape[2]

    def repeat_kv(k: Any, v: Any, m: Any) -> Any:
        k2, v2 = (t.repeat_interleave(g, dim=1) for t in (k, v))
        return F.scaled_dot_product_attention(q, k2, v2, attn_mask=m)

    def no_cudnn(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(k: Any, v: Any, m: Any) -> Any:
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
                return fn(k, v, m)
        return run

    adds: dict[int, Any] = {}  # each bool mask as the adapter hands it over: additive, in q's dtype

    def folded(k: Any, v: Any, m: Any) -> Any:  # the SDPA adapter's decode path alone (query heads folded)
        return _decode_without_cudnn(F.scaled_dot_product_attention, q, k, v,
                                     {"attn_mask": adds[id(m)], "enable_gqa": True})

    def unmasked_sdpa(k: Any, v: Any, m: Any) -> Any:  # an unpadded batch's decode step: no mask at all
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    def unmasked_af(k: Any, v: Any, m: Any) -> Any:
        return attnforge.attention(q, k, v, causal=True)  # bottom-right causal, one row: no mask (hides_keys)

    variants = {"sdpa_enable_gqa": gqa, "sdpa_repeat_kv": repeat_kv, "attention": af,
                "sdpa_enable_gqa_no_cudnn": no_cudnn(gqa), "sdpa_folded_no_cudnn": folded,
                "sdpa_unmasked": unmasked_sdpa, "attention_unmasked_causal": unmasked_af}
    res: dict[str, Any] = {}
    for j, (name, fn) in enumerate(variants.items()):
        inputs = _step_inputs(torch, kv, s0 + 300 + 20 * j, 9, True)  # lengths no call above had
        adds.update({id(m): torch.zeros(m.shape, dtype=q.dtype, device=m.device).masked_fill_(~m, float("-inf"))
                     for _, _, m in inputs})
        res[name] = _first_and_again(torch, dev, fn, inputs[:8], inputs[8])
    return res


def _first_and_again(torch: Any, dev: str, fn: Callable[..., Any], calls: list[tuple[Any, ...]],
                     spare: tuple[Any, ...]) -> dict[str, Any]:
    """``fn(*call)`` for each of ``calls`` (each a shape ``fn`` never had), one call between two synchronizes:
    wall µs median and max, ``first`` time and ``again``; and the kernels of a call on ``spare``."""
    walls: dict[str, list[float]] = {"first": [], "again": []}
    for label in ("first", "again"):
        for x in calls:
            models_e2e._sync(torch)
            t0 = time.perf_counter()
            fn(*x)
            models_e2e._sync(torch)
            walls[label].append((time.perf_counter() - t0) * 1e6)
    res: dict[str, Any] = {label: {"median_us": round(median(w), 1), "max_us": round(max(w), 1)}
                           for label, w in walls.items()}
    res["kernels"] = [r["name"] for r in _profile(torch, dev, lambda: fn(*spare)) if r["device_us"] > 0][:8]
    return res


def prefill_first_calls(torch: Any, dev: str, dt: Any, small: bool) -> dict[str, Any]:
    """A prefill's first call at a length never seen (``q [2, 32, S, 128]``, ``k/v [2, 8, S, 128]``, S = 1000 +
    8 i), plain causal and with a left-padding bool mask, SDPA and ``attention()``: wall µs between two
    synchronizes, median and max of 6 lengths, then the same calls again, and the kernels of one call. Whether
    cuDNN's graph per sequence length (measured for decode, 2026-11-28) stalls prefill too, where the SDPA adapter's
    decode path (<= 16 query rows) does not reach (it does: ~40-50 ms, 2026-11-28). On CUDA also the candidates
    that build no graph, for the rule to reach prefill: the memory-efficient op (masked) and the flash op (causal),
    K/V expanded, and the flash op given fewer K/V heads."""
    import torch.nn.functional as F  # noqa: N812

    import attnforge

    b, hq, hkv, d, base = (2, 4, 2, 16, 40) if small else (2, 32, 8, 128, 1000)
    res: dict[str, Any] = {}

    def tensors(s: int, masked: bool) -> tuple[Any, ...]:
        q = torch.randn(b, hq, s, d, device=dev, dtype=dt)
        k, v = (torch.randn(b, hkv, s, d, device=dev, dtype=dt) for _ in range(2))
        if not masked:
            return q, k, v, None
        allowed = torch.ones(s, s, dtype=torch.bool, device=dev).tril().expand(b, 1, s, s).clone()
        allowed[1, :, :, : s // 5] = False
        allowed[1, :, : s // 5, : s // 5] |= torch.eye(s // 5, dtype=torch.bool, device=dev)  # padded rows see one key
        return q, k, v, allowed

    def sdpa(q: Any, k: Any, v: Any, m: Any) -> Any:
        if m is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)

    def af(q: Any, k: Any, v: Any, m: Any) -> Any:
        return attnforge.attention(q, k, v, causal=m is None, attn_mask=m)

    def expanded(k: Any, v: Any) -> tuple[Any, Any]:  # K/V repeated to the query's heads (a copy each)
        return (t.repeat_interleave(hq // hkv, dim=1) for t in (k, v))  # type: ignore[return-value]

    def efficient_masked(q: Any, k: Any, v: Any, m: Any) -> Any:
        """Candidate for a masked prefill at a new length: the memory-efficient op, K/V expanded, the mask additive
        and aligned as the SDPA adapter prepares it (no graph to build)."""
        from attnforge.backends import sdpa as sdpa_module

        add = torch.zeros(m.shape, dtype=dt, device=dev).masked_fill_(~m, float("-inf"))
        ke, ve = expanded(k, v)
        bias = sdpa_module._efficient_bias(add, q, ke)
        return torch.ops.aten._scaled_dot_product_efficient_attention(q, ke, ve, bias, False, 0.0, False)[0]

    def flash_causal(q: Any, k: Any, v: Any, m: Any) -> Any:
        """Candidate for a plain causal prefill at a new length: SDPA's flash kernel's op (FlashAttention-2, no
        graph to build), K/V expanded (whether the op takes fewer K/V heads is the second variant's question)."""
        ke, ve = expanded(k, v)
        return torch.ops.aten._scaled_dot_product_flash_attention(q, ke, ve, 0.0, True, False)[0]

    def flash_causal_gqa(q: Any, k: Any, v: Any, m: Any) -> Any:
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False)[0]

    variants: list[tuple[str, Callable[..., Any], bool]] = [
        ("sdpa_causal", sdpa, False), ("attention_causal", af, False), ("sdpa_masked", sdpa, True),
        ("attention_masked", af, True)]
    if dev == "cuda":
        variants += [("efficient_masked_kv_expanded", efficient_masked, True),
                     ("flash_causal_kv_expanded", flash_causal, False), ("flash_causal_gqa", flash_causal_gqa, False)]
    for j, (name, fn, masked) in enumerate(variants):
        calls = [tensors(base + 8 * (7 * j + i) + 1, masked) for i in range(7)]
        try:
            res[name] = _first_and_again(torch, dev, fn, calls[:6], calls[6])
        except Exception as exc:  # a candidate op that refuses these inputs: say so, go on
            res[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return res


def _gemma_decode(torch: Any, dev: str, dt: Any, small: bool) -> Any:
    """Gemma-2-9B's decode calls for :func:`gemma_calls` and :func:`fa4_varlen_decode`: ``q [4, 16, 1, 256]``,
    64 ``(k, v, bool mask)`` inputs with ``k/v [4, 8, Sk, 256]`` and Sk growing (:func:`_step_inputs`), softcap 50;
    ``eager(k, v, m)``: transformers' ``eager_attention_forward`` (K/V repeated, the mask additive with the dtype's
    lowest value, its output ``[B, Sq, H, D]``), ``exact(k, v, m)``: attnforge's exact math called directly."""
    from types import SimpleNamespace

    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    from attnforge.backends.exact import exact_attention

    b, hq, hkv, d, s0 = (4, 4, 2, 16, 64) if small else (4, 16, 8, 256, 1024)
    torch.manual_seed(0)
    q = torch.randn(b, hq, 1, d, device=dev, dtype=dt)
    kv = torch.randn(2, b, hkv, s0 + 80, d, device=dev, dtype=dt)
    inputs = _step_inputs(torch, kv, s0, 64, True)
    additive = {id(m): torch.zeros(m.shape, dtype=dt, device=dev).masked_fill_(~m, torch.finfo(dt).min)
                for _, _, m in inputs}
    module = SimpleNamespace(num_key_value_groups=hq // hkv, training=False)
    scale = d ** -0.5

    def eager(k: Any, v: Any, m: Any) -> Any:
        return eager_attention_forward(module, q, k, v, additive[id(m)], scaling=scale, softcap=50.0)[0]

    def exact(k: Any, v: Any, m: Any) -> Any:
        return exact_attention(q, k, v, attn_mask=m, scale=scale, softcap=50.0)

    return SimpleNamespace(b=b, hq=hq, hkv=hkv, d=d, q=q, inputs=inputs, scale=scale, eager=eager, exact=exact)


def gemma_calls(torch: Any, dev: str, dt: Any, small: bool) -> dict[str, Any]:
    """Gemma-2-9B's decode call (``q [4, 16, 1, 256]``, ``k/v [4, 8, Sk, 256]``, softcap 50, a bool padding mask),
    which SDPA cannot serve (softcap): transformers' default for Gemma-2 (``eager_attention_forward``, K/V
    repeated, an additive mask) against ``attention()`` (the exact math on a class whose lengths vary), 64 calls
    back to back with Sk growing, wall µs per call (best of 5 rounds), host µs per call (the device kept busy:
    :func:`_host_us_per_call`), outputs compared, and each one's kernels; ``exact``: the exact math called
    directly (what ``attention()`` adds is the difference)."""
    import attnforge

    g = _gemma_decode(torch, dev, dt, small)
    q, inputs, scale, eager, exact = g.q, g.inputs, g.scale, g.eager, g.exact

    def af(k: Any, v: Any, m: Any) -> Any:
        return attnforge.attention(q, k, v, attn_mask=m, scale=scale, softcap=50.0)

    res: dict[str, Any] = {}
    outs = {}
    for name, fn in (("eager", eager), ("attention", af), ("exact", exact)):
        for k, v, m in inputs[:4]:
            fn(k, v, m)
        res[f"{name}_us"], outs[name] = _best_us_per_call(torch, fn, [inputs] * 5)
        res[f"{name}_host_us"] = _host_us_per_call(torch, fn, inputs)
        res[f"{name}_profile"] = _profile(torch, dev, lambda fn=fn, xs=inputs[:8]: [fn(*x) for x in xs])
    # eager returns [B, Sq, H, D] (transposed for the output projection)
    res["max_abs_diff"] = float((outs["attention"].transpose(1, 2).float() - outs["eager"].float()).abs().max())
    res["speedup"] = res["eager_us"] / res["attention_us"]
    return res


def fa4_varlen_decode(torch: Any, dev: str, dt: Any, small: bool) -> dict[str, Any]:
    """Can FlashAttention-4 serve Gemma-2's padded decode call in one kernel (the next run's item 1)? Its varlen
    forward over the padding runs as :mod:`attnforge.backends._padded_decode` gives FA2's and FA4's ops: each (batch
    row, K/V head) one sequence of one query row with its ``g`` query heads (``q [B x Hkv, g, D]``), K/V viewed
    ``[N, 1, D]`` on the cache's storage, ``cu_seqlens_k`` the runs' starts and ``seqused_k`` their lengths, with
    softcap 50. Per call shape as ``gemma_calls``: the error against the exact math, wall and host µs per call
    against eager's and the exact math's, for

    - ``fa4_varlen``: ``flash_attn.cute.interface._flash_attn_fwd`` (its Python included), the runs read per call
      (a step's first layer: one host sync);
    - ``fa4_kept``: the same, the runs read once per mask beforehand (a step's later layers);
    - ``fa4_replay``: the route's own ``attnforge.backends._fa4_direct.Replayer`` (the one compiled call
      ``_flash_attn_fwd`` makes, recorded once, then called with each call's q/K/V views, a fresh output and the
      kept runs in their slots); ``replay_equal``: bit for bit against ``fa4_kept`` on 8 calls; ``replay_slots``:
      the per-call tensors' slots;
    - ``fa4_replay_new_runs``: the replay with the runs read per call.

    ``compiles``: compile-cache entries added over the 64 lengths (0 after the first: no compile per length).
    Skipped where FA4 does not import."""
    try:
        from flash_attn.cute import interface as fa4_interface
        from flash_attn.cute.interface import _flash_attn_fwd
    except Exception as exc:  # not installed here (the CPU machine's dry run; a call before carry d2)
        return {"skipped": f"flash_attn.cute does not import: {type(exc).__name__}: {exc}"[:300]}

    from attnforge.backends import _padded_decode as padded_decode

    gd = _gemma_decode(torch, dev, dt, small)
    b, hq, hkv, d, q, inputs, scale, eager, exact = (gd.b, gd.hq, gd.hkv, gd.d, gd.q, gd.inputs, gd.scale, gd.eager,
                                                     gd.exact)
    kept = {id(m): padded_decode.padding_runs(m, b=b, hkv=hkv, k=k) for k, _, m in inputs}
    cu_q = padded_decode.query_starts(b * hkv, q.device)

    class Counting:  # the compile cache, counting the entries added
        def __init__(self, cache: Any) -> None:
            self.cache, self.added = cache, 0

        def __contains__(self, key: Any) -> bool:
            return key in self.cache

        def __getitem__(self, key: Any) -> Any:
            return self.cache[key]

        def __setitem__(self, key: Any, fn: Any) -> None:
            self.added += 1
            self.cache[key] = fn

    def views(k: Any, v: Any) -> tuple[Any, Any, Any]:  # the route's own views (_padded_decode.varlen_views)
        return padded_decode.varlen_views(q, k, v, padded_decode.key_rows(k))

    def fa4_runs(k: Any, v: Any, runs: tuple[Any, ...]) -> Any:
        starts, used = runs
        qv, kf, vf = views(k, v)
        out = _flash_attn_fwd(qv, kf, vf, cu_seqlens_q=cu_q, cu_seqlens_k=starts, seqused_k=used, max_seqlen_q=1,
                              max_seqlen_k=k.shape[2], softmax_scale=scale, softcap=50.0)[0]
        return out.view(b, hq, 1, d)

    def fa4(k: Any, v: Any, m: Any) -> Any:
        return fa4_runs(k, v, padded_decode.padding_runs(m, b=b, hkv=hkv, k=k))

    def fa4_kept(k: Any, v: Any, m: Any) -> Any:
        return fa4_runs(k, v, kept[id(m)])


    res: dict[str, Any] = {}
    counting = Counting(_flash_attn_fwd.compile_cache)
    _flash_attn_fwd.compile_cache = counting
    try:
        k, v, m = inputs[-1]
        t0 = time.perf_counter()
        got = fa4(k, v, m)
        models_e2e._sync(torch)
        res["first_call_s"] = round(time.perf_counter() - t0, 2)  # its CuTe DSL compile, once per variant
        res["compiles_first_call"] = counting.added
        want = exact(k, v, m)
        res["max_abs_diff_vs_exact"] = float((got.float() - want.float()).abs().max())
        res["rel_l2_vs_exact"] = float((got.float() - want.float()).norm() / want.float().norm())
        want_eager = eager(k, v, m).transpose(1, 2)
        res["max_abs_diff_eager_vs_exact"] = float((want_eager.float() - want.float()).abs().max())
        for x in inputs:
            fa4(*x)
        models_e2e._sync(torch)
        res["compiles_over_64_lengths"] = counting.added - res["compiles_first_call"]

        # the replay: attnforge's own Replayer (the route's), recording on the last input, the kept runs per call
        from attnforge.backends import _fa4_direct

        run = _fa4_direct.Replayer(_flash_attn_fwd, _fa4_direct.varlen_keywords(scale=scale, softcap=50.0))

        def replay_runs(k: Any, v: Any, runs: tuple[Any, ...]) -> Any:
            qv, kf, vf = views(k, v)
            return run(qv, kf, vf, cu_seqlens_q=cu_q, cu_seqlens_k=runs[0], seqused_k=runs[1],
                       max_seqlen_k=k.shape[2]).view(b, hq, 1, d)

        def fa4_replay(k: Any, v: Any, m: Any) -> Any:
            return replay_runs(k, v, kept[id(m)])

        def fa4_replay_new_runs(k: Any, v: Any, m: Any) -> Any:
            return replay_runs(k, v, padded_decode.padding_runs(m, b=b, hkv=hkv, k=k))

        fa4_replay(k, v, m)  # records, and checks the replay once
        replay = (fa4_replay, fa4_replay_new_runs) if run.replay is not None else None
        if run.replay is not None:
            res["replay_slots"] = {str(i): n for i, n in run.replay.named}
            res["replay_args_repr"] = [repr(a)[:60] for a in run.replay.args]
            res["replay_equal"] = all(bool(torch.equal(fa4_replay(*x), fa4_kept(*x))) for x in inputs[::8])
        variants: list[tuple[str, Callable[..., Any]]] = [("eager", eager), ("exact", exact), ("fa4_varlen", fa4),
                                                          ("fa4_kept", fa4_kept)]
        if replay is not None:
            variants += [("fa4_replay", replay[0]), ("fa4_replay_new_runs", replay[1])]
        for name, fn in variants:
            for x in inputs[:4]:
                fn(*x)
            res[f"{name}_us"], _ = _best_us_per_call(torch, fn, [inputs] * 5)
            res[f"{name}_host_us"] = _host_us_per_call(torch, fn, inputs)
        res["fa4_profile"] = _profile(torch, dev, lambda xs=inputs[:8]: [fa4_kept(*x) for x in xs])
        res["compiles_total"] = counting.added
        res["fa4_version"] = getattr(fa4_interface, "__version__", None)
    finally:
        _flash_attn_fwd.compile_cache = counting.cache
    return res


def gqa_decode_cell(torch: Any, dev: str, dt: Any, small: bool) -> dict[str, Any]:
    """The grid's decode GQA cell (``q [8, 32, 1, 128]``, ``k/v [8, 8, 4096, 128]`` bf16, no mask, not causal; the
    2026-11-28 eighth run: plain SDPA 40.1 µs, ``attention()`` 49.3 with SDPA chosen): where the 9 µs go. Each
    variant timed three ways: as the grid times it (``_timing.measure_ms``: CUDA events, the L2 flushed before each
    call), back to back (wall µs per call, best of 5 rounds of 200), and host µs alone (the device kept busy),
    with its kernels (torch.profiler): plain SDPA (``enable_gqa``), ``attention()``, the SDPA adapter called
    directly, FlashAttention-2's split-KV op as the adapter's unsettled path calls it (``_flash_decode``), and
    the adapter's shape count (``_MET.unsettled``)."""
    import torch.nn.functional as F  # noqa: N812
    from _timing import measure_ms

    import attnforge
    from attnforge.backends import registry
    from attnforge.backends import sdpa as sdpa_module

    b, hq, hkv, sk, d = (2, 8, 2, 256, 16) if small else (8, 32, 8, 4096, 128)
    torch.manual_seed(0)
    q = torch.randn(b, hq, 1, d, device=dev, dtype=dt)
    k, v = (torch.randn(b, hkv, sk, d, device=dev, dtype=dt) for _ in range(2))
    adapter = registry.fallback()
    qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # the bshd variants' tensors
    variants: dict[str, Callable[[], Any]] = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        "attention": lambda: attnforge.attention(q, k, v),
        "adapter": lambda: adapter(q, k, v, causal=False, scale=None),
        "flash_decode": lambda: sdpa_module._flash_decode(q, k, v, None),
        "met_unsettled": lambda: sdpa_module._MET.unsettled(q, k, v, None),
        # the FlashAttention routes forced (their direct entries: split-KV with the query heads of a K/V head
        # packed), on the caller's [B, H, S, D] tensors and on [B, S, H, D] ones: is any route's host + device time
        # under SDPA's on this host-paced call (the 2026-11-30 grid: SDPA chosen, 0.947x SDPA)?
        "attention_fa3": lambda: attnforge.attention(q, k, v, backend="flash-attn-3"),
        "attention_fa3_bshd": lambda: attnforge.attention(qs, ks, vs, backend="flash-attn-3", layout="bshd"),
        "attention_fa4": lambda: attnforge.attention(q, k, v, backend="flash-attn-4"),
        "attention_fa4_bshd": lambda: attnforge.attention(qs, ks, vs, backend="flash-attn-4", layout="bshd"),
    }
    res: dict[str, Any] = {"q": list(q.shape), "k": list(k.shape)}
    want = variants["sdpa"]().float()
    for name, fn in variants.items():
        try:
            # attention()'s route settles the decode shape after _MetShapes.SETTLED meetings (then SDPA's own choice):
            # timed settled, as a model's repeated step runs
            for _ in range(sdpa_module._MetShapes.SETTLED + 2 if name == "attention" else 1):
                got = fn()
        except Exception as exc:  # a backend this machine lacks (forced): reported, the other variants go on
            res[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        if name == "attention":  # the route's bound call (and a direct op where one was bound, the 2026-12-01 try)
            from attnforge.dispatch import runtime

            steps = [route[0][0][1] for route in runtime.get_dispatcher().routes.values()]
            res["attention_route"] = [f"{type(fn_).__name__} direct={getattr(fn_, '_direct', '-')!r}"[:200]
                                      for fn_ in steps]
        if name.endswith("_bshd") and isinstance(got, torch.Tensor):
            got = got.transpose(1, 2)
        if isinstance(got, torch.Tensor):
            res[f"{name}_max_abs_diff"] = float((got.float() - want).abs().max())
        res[f"{name}_grid_ms"] = measure_ms(torch, fn, set_bytes=2 * k.numel() * k.element_size())["median_ms"]
        res[f"{name}_us"] = round(_best_loop_us(torch, fn, warm=20, n=200), 2)
        res[f"{name}_host_us"] = _host_us_per_call(torch, lambda _k, _v, _m, fn=fn: fn(), [(k, v, None)] * 200)
        res[f"{name}_profile"] = _profile(torch, dev, lambda fn=fn: [fn() for _ in range(8)])
    try:
        res["explain"] = str(attnforge.explain(q, k, v))[:2000]
    except Exception as exc:  # explain's signature or availability: reported, not fatal
        res["explain"] = f"{type(exc).__name__}: {exc}"[:300]
    res["hot_path"] = _hot_path_layers(torch, q, k, v)
    return res


def sdpa_direct(torch: Any, dev: str, dt: Any, small: bool) -> dict[str, Any]:
    """SDPA's public function against the kernel op it picks, called directly (what a route could call once the
    class's choice is known): ``torch._fused_sdp_choice`` (SDPBackend: 1 flash, 2 memory-efficient, 3 cuDNN), then
    ``torch._scaled_dot_product_{cudnn,flash,efficient}_attention`` with SDPA's arguments (torch 2.11's
    ``scaled_dot_product_attention`` in aten/src/ATen/native/transformers/attention.cpp validates, chooses and calls
    that op with ``compute_log_sumexp`` = grad recorded). Per case: the outputs (and gradients) compared bit for bit,
    host µs a call (device kept busy), back-to-back wall µs, the grid's timing (L2 flushed), each interleaved over
    rounds; and the choice, ``torch.compiler.is_compiling()`` and the grad check alone. ``attention()`` beside them
    (no FlashAttention installed on that call: it serves SDPA). The grid's decode GQA cell lost 0.895x SDPA with
    SDPA chosen on 2026-11-30 (attention() 43.2 host µs against SDPA's 37.3)."""
    import torch.nn.functional as F  # noqa: N812
    from _timing import measure_many_ms

    import attnforge

    cases = {  # name: (b, hq, hkv, sq, sk, d, causal, grad)
        "decode_gqa": (8, 32, 8, 1, 4096, 128, False, False),
        "mha_1k_causal": (8, 16, 16, 1024, 1024, 128, True, False),
        "llama_prefill_2k": (1, 32, 8, 2048, 2048, 128, True, False),
        "llama_train_2k": (1, 32, 8, 2048, 2048, 128, True, True),
        "mha_1k_causal_train": (8, 16, 16, 1024, 1024, 128, True, True),
        "flux_4608": (1, 24, 24, 4608, 4608, 128, False, False),
    }
    if small:
        cases = {n: (1, 4, 2 if c[1] != c[2] else 4, min(c[3], 16), min(c[4], 64), 16, c[6], c[7])
                 for n, c in cases.items()}
    names = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn"}
    res: dict[str, Any] = {}
    for case, (b, hq, hkv, sq, sk, d, causal, grad) in cases.items():
        torch.manual_seed(0)
        q = torch.randn(b, hq, sq, d, device=dev, dtype=dt, requires_grad=grad)
        k, v = (torch.randn(b, hkv, sk, d, device=dev, dtype=dt, requires_grad=grad) for _ in range(2))
        gqa = hq != hkv
        row: dict[str, Any] = {"shape": [b, hq, hkv, sq, sk, d], "causal": causal, "grad": grad}
        choice = int(torch._fused_sdp_choice(q, k, v, None, 0.0, causal, scale=None, enable_gqa=gqa))
        row["choice"] = names.get(choice, choice)

        def direct(choice: int = choice, q: Any = q, k: Any = k, v: Any = v, causal: bool = causal) -> Any:
            lse = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
            if choice == 3:
                return torch._scaled_dot_product_cudnn_attention(q, k, v, None, lse, 0.0, causal, False,
                                                                 scale=None)[0]
            if choice == 1:
                return torch._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=None)[0]
            if choice == 2:
                return torch._scaled_dot_product_efficient_attention(q, k, v, None, lse, 0.0, causal,
                                                                     scale=None)[0]
            raise RuntimeError(f"no direct op for choice {choice}")

        variants: dict[str, Callable[[], Any]] = {
            "sdpa": lambda q=q, k=k, v=v, causal=causal, gqa=gqa: F.scaled_dot_product_attention(
                q, k, v, is_causal=causal, enable_gqa=gqa),
            "direct": direct,
            "attention": lambda q=q, k=k, v=v, causal=causal: attnforge.attention(q, k, v, causal=causal),
        }
        try:
            want = variants["sdpa"]()
            got = direct()
            row["direct_equal"] = bool(torch.equal(want, got))
            row["direct_max_abs_diff"] = float((want.float() - got.float()).abs().max())
            if grad:
                go = torch.randn_like(want)
                gw = torch.autograd.grad(want, (q, k, v), go)
                gd = torch.autograd.grad(got, (q, k, v), go)
                row["direct_grads_equal"] = all(bool(torch.equal(a, c)) for a, c in zip(gw, gd, strict=True))
                row["direct_grads_max_abs_diff"] = max(float((a.float() - c.float()).abs().max())
                                                       for a, c in zip(gw, gd, strict=True))
        except Exception as exc:  # a choice this op refuses: reported, the case goes on with SDPA alone
            row["direct_error"] = f"{type(exc).__name__}: {exc}"[:300]
            del variants["direct"]
        extras: dict[str, Callable[[], Any]] = {
            "choice_alone": lambda q=q, k=k, v=v, causal=causal, gqa=gqa: torch._fused_sdp_choice(
                q, k, v, None, 0.0, causal, scale=None, enable_gqa=gqa),
            "is_compiling": torch.compiler.is_compiling,
            "grad_check": lambda q=q, k=k, v=v: torch.is_grad_enabled() and (
                q.requires_grad or k.requires_grad or v.requires_grad),
        }
        host = dict.fromkeys(list(variants) + list(extras), float("inf"))
        wall = dict.fromkeys(variants, float("inf"))
        calls = [(k, v, None)] * (200 if sq <= 16 else 50)
        for fn in variants.values():
            for _ in range(3):
                fn()
        for _ in range(5):  # interleaved rounds: the host's pace drifts
            for name, fn in {**variants, **extras}.items():
                got_us = _host_us_per_call(torch, lambda _k, _v, _m, fn=fn: fn(), calls)
                if got_us is not None:
                    host[name] = min(host[name], got_us)
                if name in wall:
                    wall[name] = min(wall[name], _best_loop_us(torch, fn, warm=2, n=len(calls), rounds=1))
        row.update({f"{n}_host_us": (round(x, 2) if x < float("inf") else None) for n, x in host.items()})
        row.update({f"{n}_us": round(x, 2) for n, x in wall.items()})
        row.update(_route_layers(torch, q, k, v, causal=causal, grad=grad, calls=calls))
        if not grad:
            grid = measure_many_ms(torch, variants, set_bytes=2 * k.numel() * k.element_size())
            row.update({f"{n}_grid_ms": g.get("median_ms") for n, g in grid.items()})
            if "direct" in grid and grid["direct"].get("median_ms"):
                row["sdpa_over_direct_grid"] = round(grid["sdpa"]["median_ms"] / grid["direct"]["median_ms"], 4)
        res[case] = row
        print(case, json.dumps(row), flush=True)
    return res


def _route_layers(torch: Any, q: Any, k: Any, v: Any, *, causal: bool, grad: bool,
                  calls: list[Any]) -> dict[str, Any]:
    """The route ``attention(q, k, v, causal=causal)`` keeps for its signature (found or not, its steps), and the host
    µs of the lookup, of :meth:`Dispatcher.serve` and of the route's first step called alone (best of 5 rounds):
    where ``attention()``'s cost over SDPA's goes (the GQA train call cost 13 µs more than SDPA's, 2026-11-30)."""
    from attnforge.dispatch import runtime

    dispatcher = runtime.get_dispatcher()
    sig = _signature(torch, q, k, v, causal=causal)
    route = dispatcher.routes.get(sig)
    out: dict[str, Any] = {"route_found": route is not None, "routes_kept": len(dispatcher.routes)}
    if route is None:
        return out
    out["route_steps"] = [f"{a.name}: {type(fn).__name__} {fn!r}"[:200] for a, fn in route[0]]
    step = route[0][0][1]
    fns = {"routes_get": lambda: dispatcher.routes.get(sig), "serve": lambda: dispatcher.serve(route, q, k, v, None),
           "first_step": lambda: step(q, k, v)}
    out.update(_interleaved_host_us(torch, fns, calls, rounds=5))
    return out


def _signature(torch: Any, q: Any, k: Any, v: Any, *, causal: bool) -> tuple[Any, ...]:
    """The exact signature :func:`attnforge.dispatch.runtime.attention` keys a plain bhsd call's route by (no scale,
    exact precision, nothing forced), transcribed from its hot path."""
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, causal, None,
            "bhsd", "exact", None, grad)


def _interleaved_host_us(torch: Any, fns: dict[str, Callable[[], Any]], calls: list[Any], *,
                         rounds: int) -> dict[str, float | None]:
    """``{"<name>_host_us": ...}``: host µs a call of each of ``fns`` (:func:`_host_us_per_call` over ``calls``), the
    best of ``rounds`` rounds that each time every entry once (interleaved: the host's pace drifts); None where no
    round could tell (off CUDA, or the device caught up)."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            got = _host_us_per_call(torch, lambda _k, _v, _m, fn=fn: fn(), calls)
            if got is not None:
                best[name] = min(best[name], got)
    return {f"{n}_host_us": (round(x, 2) if x < float("inf") else None) for n, x in best.items()}


def _hot_path_layers(torch: Any, q: Any, k: Any, v: Any) -> dict[str, Any]:
    """Host µs per call of each layer of ``attention()``'s hot path for a call served before (the ninth session:
    attention() ~50 µs against plain SDPA's ~24 on the decode GQA cell, not in the adapter): the signature tuple
    :func:`attnforge.dispatch.runtime.attention` builds, the route lookup, :meth:`Dispatcher.serve`, the route's
    bound call, SDPA with the keywords the adapter passes, and plain SDPA before and after (drift), rounds
    interleaved (each variant once per round, best of 7 rounds of 200 calls, the device kept busy)."""
    import torch.nn.functional as F  # noqa: N812

    import attnforge
    from attnforge.backends import registry
    from attnforge.backends.sdpa_original import original_sdpa
    from attnforge.dispatch import runtime

    attnforge.attention(q, k, v)
    dispatcher = runtime.get_dispatcher()

    def signature() -> Any:
        return _signature(torch, q, k, v, causal=False)

    route = dispatcher.routes.get(signature())
    if route is None:
        return {"error": "no route kept for the call's signature"}
    bound = route[0][0][1]
    adapter_partial = functools.partial(registry.fallback(), causal=False, scale=None)
    sdpa = original_sdpa()
    variants: dict[str, Callable[[], Any]] = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        "signature": signature,
        "routes_get": lambda: dispatcher.routes.get(signature()),
        "serve": lambda: dispatcher.serve(route, q, k, v, None),
        "bound_call": lambda: bound(q, k, v),
        # the route before the decode path was bound (43ce1d9): the adapter as a partial, timed in the same rounds
        # as bound_call
        "adapter_partial": lambda: adapter_partial(q, k, v),
        "sdpa_adapter_keywords": lambda: sdpa(q, k, v, enable_gqa=True, scale=None),
        "attention": lambda: attnforge.attention(q, k, v),
        "sdpa_again": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
    }
    out: dict[str, Any] = _interleaved_host_us(torch, variants, [(k, v, None)] * 200, rounds=7)
    out["bound_call_type"] = type(bound).__name__
    return out


def efficient_breakdown(torch: Any, dev: str, dt: Any, small: bool) -> dict[str, Any]:
    """Where ``attention()``'s decode path spends its time at lengths met before (SDPA's cuDNN graphs cached):
    Llama-3-8B's padded decode call, four calls sharing each mask object (a model's layers), ``Sk`` growing over 16
    steps, the rounds repeating those lengths. Variants: SDPA (``enable_gqa``, bool mask: cuDNN), the
    memory-efficient op called directly on the folded query with the bias prepared beforehand (``op_bias``), the
    same without a bias (``op_no_bias``), and ``attention()``. Wall µs per call (best of 5 rounds) and the device
    µs per call of their kernels (torch.profiler), so host cost = what the wall adds to the device time when the
    host is the bottleneck."""
    import torch.nn.functional as F  # noqa: N812

    import attnforge
    from attnforge.backends import sdpa as sdpa_module

    q, kv, s0 = _tensors(torch, dev, dt, small)
    b, hq, _, d = q.shape
    hkv = kv.shape[2]
    steps = _step_inputs(torch, kv, s0, 16, True)
    layered = [x for x in steps for _ in range(4)]
    bias = {}
    for _, _, m in steps:
        add = torch.zeros(m.shape, dtype=dt, device=m.device).masked_fill_(~m, float("-inf"))
        bias[id(m)] = sdpa_module._efficient_bias(add, q.reshape(b, hkv, hq // hkv, d), kv[0, :, :, : m.shape[-1]])
    qf = q.reshape(b, hkv, hq // hkv, d)
    op = torch.ops.aten._scaled_dot_product_efficient_attention

    variants: dict[str, Callable[..., Any]] = {
        "sdpa": lambda k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True),
        "op_bias": lambda k, v, m: op(qf, k, v, bias[id(m)], False, 0.0, False)[0],
        "op_no_bias": lambda k, v, m: op(qf, k, v, None, False, 0.0, False)[0],
        "attention": lambda k, v, m: attnforge.attention(q, k, v, attn_mask=m),
    }
    res: dict[str, Any] = {}
    for name, fn in variants.items():
        if dev != "cuda" and name.startswith("op_"):
            continue
        for x in layered:
            fn(*x)  # every length met once: SDPA's graphs built
        res[f"{name}_us"], res[f"{name}_device_us"], kernels, rows = _wall_and_device(torch, dev, fn, layered)
        res[f"{name}_kernels"] = kernels[:6]
        res[f"{name}_host_ops"] = [r for r in rows if r["name"].startswith(("aten::", "cuda"))][:12]
    return res


def _wall_and_device(torch: Any, dev: str, fn: Callable[..., Any],
                     calls: list[tuple[Any, Any, Any]]) -> tuple[float, float, list[dict[str, Any]], list[Any]]:
    """``fn(k, v, mask)`` over ``calls`` back to back: wall µs per call (best of 5 rounds), device µs per call of
    its kernels over the first 16 calls (torch.profiler), those kernels' rows, and every profiler row."""
    wall = _best_us_per_call(torch, fn, [calls] * 5)[0]
    rows = _profile(torch, dev, lambda: [fn(*x) for x in calls[:16]])
    kernels = [r for r in rows if r["device_us"] > 0 and not r["name"].startswith(("aten::", "Activity"))]
    return wall, round(sum(r["device_us"] for r in kernels) / 16, 1), kernels, rows


def decode_kernels(torch: Any, dev: str, dt: Any, small: bool, *, batch: int = 4,
                   keys: int = 1024) -> dict[str, Any]:
    """Kernels for a decode step at lengths met before, against SDPA on cuDNN's cached graph (2026-11-28, H200:
    48.6 µs a call, 16.8 device; the memory-efficient op on the folded query 47.6, 45.7 device: 8 K/V heads x 4
    batch rows are 32 thread blocks, each walking every key). Llama-3-8B's padded decode call, four calls sharing
    each mask object, ``Sk`` growing over 16 steps, the rounds repeating those lengths (as ``efficient_breakdown``).

    Candidates that build no graph per length, each with the mask's per-step preparation done once per mask object
    (as the adapter keeps it):
    - ``fa2_varlen_bh``: SDPA's FlashAttention-2 op (``aten::_flash_attention_forward``) in its varlen form, each
      (batch row, K/V head) one sequence of ``g`` query heads over one K/V head (``q`` viewed ``[B*Hkv, g, D]``,
      ``k`` ``[B*Hkv*Sk, 1, D]``: views of the bhsd tensors, no copy); the left padding becomes each sequence's
      start (``cu_seqlens_k``) and length (``seqused_k``): a padding mask whose visible keys are one run per row.
    - ``fa2_dense_unmasked``: the dense op on bshd views (GQA native), for an unpadded batch's step (no mask).
    - ``fa2_varlen_bh_unmasked``: the varlen form without padding.
    Wall µs per call (best of 5 rounds), device µs per call (torch.profiler), and the largest difference from
    the float32 reference. ``batch`` and ``keys`` (the first step's ``Sk - 1``) change the shape:
    ``decode_kernels_long`` is one sequence at 4096 keys (8 thread blocks of the memory-efficient kernel, each
    walking every key)."""
    import torch.nn.functional as F  # noqa: N812

    import attnforge
    from attnforge.backends import _padded_decode as padded_decode
    from attnforge.backends import sdpa as sdpa_module

    q, kv, s0 = _tensors(torch, dev, dt, small, batch=batch, keys=keys)
    b, hq, _, d = q.shape
    hkv = kv.shape[2]
    g = hq // hkv
    steps = _step_inputs(torch, kv, s0, 16, True)
    layered = [x for x in steps for _ in range(4)]
    qf = q.reshape(b, hkv, g, d)
    i32 = torch.int32
    prep: dict[int, Any] = {}
    for k, _, m in steps:
        sk = k.shape[2]
        add = torch.zeros(m.shape, dtype=dt, device=m.device).masked_fill_(~m, float("-inf"))
        starts, used = padded_decode.padding_runs(m, b=b, hkv=hkv, k=k)  # the adapter's own runs (one sync each)
        prep[id(m)] = {"bias": sdpa_module._efficient_bias(add, qf, k), "used": used, "starts": starts,
                       "plain_starts": torch.arange(b * hkv + 1, device=m.device, dtype=i32) * sk}
    cu_q = torch.arange(b * hkv + 1, device=q.device, dtype=i32)
    scale = d ** -0.5
    eff = torch.ops.aten._scaled_dot_product_efficient_attention
    flash = getattr(torch.ops.aten, "_flash_attention_forward", None)

    def varlen(k: Any, v: Any, m: Any, masked: bool) -> Any:
        p = prep[id(m)]
        sk = k.shape[2]
        out = flash(q.reshape(b * hkv, g, d), k.reshape(-1, 1, d), v.reshape(-1, 1, d), cu_q,
                    p["starts"] if masked else p["plain_starts"], 1, sk, 0.0, False, False, scale=scale,
                    seqused_k=p["used"] if masked else None)[0]
        return out.reshape(b, hq, 1, d)

    variants: dict[str, tuple[Callable[..., Any], bool]] = {
        "sdpa": (lambda k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True), True),
        "sdpa_unmasked": (lambda k, v, m: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), False),
        "attention": (lambda k, v, m: attnforge.attention(q, k, v, attn_mask=m), True),
        "attention_unmasked": (lambda k, v, m: attnforge.attention(q, k, v), False),
    }
    if dev == "cuda":
        variants.update({
            "op_folded": (lambda k, v, m: eff(qf, k, v, prep[id(m)]["bias"], False, 0.0, False)[0].reshape(q.shape),
                          True),
            "fa2_varlen_bh": (lambda k, v, m: varlen(k, v, m, True), True),
            "fa2_varlen_bh_unmasked": (lambda k, v, m: varlen(k, v, m, False), False),
            "fa2_dense_unmasked": (lambda k, v, m: flash(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                         None, None, 1, k.shape[2], 0.0, False, False,
                                                         scale=scale)[0].transpose(1, 2), False),
        })
    k_last, v_last, m_last = steps[-1]
    refs = {masked: F.scaled_dot_product_attention(
        q.float(), k_last.float(), v_last.float(), attn_mask=m_last if masked else None, enable_gqa=True)
        for masked in (True, False)}
    res: dict[str, Any] = {"q": list(q.shape), "k_first": list(steps[0][0].shape), "steps": len(steps)}
    for name, (fn, masked) in variants.items():
        try:
            for x in layered:
                fn(*x)  # every length met once: SDPA's graphs built
            res[f"{name}_max_abs_diff"] = float((fn(k_last, v_last, m_last).float() - refs[masked]).abs().max())
            res[f"{name}_us"], res[f"{name}_device_us"], kernels, _ = _wall_and_device(torch, dev, fn, layered)
            res[f"{name}_kernels"] = kernels[:4]
        except Exception as exc:  # a candidate the op refuses: say so, go on
            res[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:400]
    try:  # does the memory-efficient kernel return zeros for a row whose bias hides every key?
        bias = prep[id(m_last)]["bias"].clone()
        bias[0] = float("-inf")
        row = eff(qf, k_last, v_last, bias, False, 0.0, False)[0][0]
        res["op_folded_all_hidden_row"] = {"max_abs": float(row.float().abs().nan_to_num(nan=-1.0).max()),
                                           "nan": bool(row.isnan().any())}
    except Exception as exc:
        res["op_folded_all_hidden_row"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    return res


def _best_loop_us(torch: Any, fn: Callable[[], Any], *, warm: int, n: int, rounds: int = 5) -> float:
    """µs per call of ``fn()`` called ``n`` times back to back between two synchronizes, after ``warm`` calls: the
    best of ``rounds`` rounds."""
    for _ in range(warm):
        fn()
    best = float("inf")
    for _ in range(rounds):
        models_e2e._sync(torch)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        models_e2e._sync(torch)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def _unsettled_decode_path(torch: Any, dev: str) -> Callable[[], None]:
    """Keep every decode shape unsettled (``_MetShapes.SETTLED`` raised), and off CUDA open the decode path to the
    CPU with a stand-in memory-efficient op that returns an empty output in the op's layout (the path's own host
    cost, nothing computed); returns what undoes it."""
    from attnforge.backends import sdpa as sdpa_module

    real = torch._scaled_dot_product_efficient_attention
    saved = (sdpa_module._MetShapes.SETTLED, sdpa_module._EFFICIENT_DEVICES, sdpa_module._safe_softmax_on_cpu)
    sdpa_module._MetShapes.SETTLED = 10 ** 9
    if dev != "cuda":
        def empty(q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
            return (torch.empty(q.shape[0], q.shape[2], q.shape[1], v.shape[-1], dtype=q.dtype).transpose(1, 2),)

        torch._scaled_dot_product_efficient_attention = empty
        sdpa_module._EFFICIENT_DEVICES = frozenset({"cuda", "cpu"})
        sdpa_module._safe_softmax_on_cpu = lambda: False

    def restore() -> None:
        torch._scaled_dot_product_efficient_attention = real
        (sdpa_module._MetShapes.SETTLED, sdpa_module._EFFICIENT_DEVICES, sdpa_module._safe_softmax_on_cpu) = saved

    return restore


def adapter_steps(torch: Any, dev: str, dt: Any, small: bool) -> dict[str, Any]:
    """Host cost of the SDPA adapter's masked decode path per step: Llama-3-8B's padded call, two layers sharing a
    new bool mask each step, the same length every step, the shape kept unsettled (``_MetShapes.SETTLED`` raised).
    On CUDA the real kernels (wall µs per step, best of 5 rounds of 50 steps); on CPU the decode path runs against a
    stand-in op that returns an empty output (``--device cpu``: the path's own host cost, its launches and Python,
    without a kernel; the CPU machine measured 64-67 µs a step before `0af2025`, 49 after, 2026-11-28)."""
    from attnforge.backends import registry

    q, kv, s0 = _tensors(torch, dev, torch.bfloat16, False)  # the real shapes: on CPU the op computes nothing
    k, v = (t[:, :, : s0 + 1] for t in kv)
    restore = _unsettled_decode_path(torch, dev)
    adapter = registry.fallback()

    def step() -> None:
        mask = torch.ones(k.shape[0], 1, 1, k.shape[2], dtype=torch.bool, device=k.device)
        mask[1, ..., : s0 // 5] = False
        for _layer in range(2):
            adapter(q, k, v, causal=False, scale=None, attn_mask=mask)

    try:
        best = _best_loop_us(torch, step, warm=20, n=50)
    finally:
        restore()
    return {"us_per_step_2_layers": round(best, 1), "q": list(q.shape), "k": list(k.shape),
            "op": "real" if dev == "cuda" else "stand-in (empty output)"}


def host_costs(torch: Any, dev: str, dt: Any, small: bool) -> dict[str, Any]:
    """Host µs per call of each layer of ``attention()``'s masked decode path, and of the pieces it calls, against
    transformers' own SDPA call: Llama-3-8B's padded decode call (``q [4, 32, 1, 128]``, ``k/v [4, 8, Sk, 128]``, a
    bool ``[4, 1, 1, Sk]`` mask) at ``Sk = 65``, where every kernel is shorter than its launch, so wall time per
    call back to back is host time. One mask object for every call (a model's later layers: the bias is kept), the
    shape kept unsettled (``_MetShapes.SETTLED`` raised); best of 5 rounds of 300 calls. ``integration_step_2_layers``:
    a decode step of two layers, a new mask each step (its making included); ``*_new_mask``: one layer, a mask
    object no keeper holds each call (made beforehand), each piece of the path that a step's first layer pays. On
    CPU (``--device cpu``) the memory-efficient op is a stand-in that returns an empty output (the path's Python
    alone)."""
    import torch.nn.functional as F  # noqa: N812

    import attnforge
    from attnforge.backends import _base, registry, sdpa_original
    from attnforge.backends import sdpa as sdpa_module
    from attnforge.integrations.transformers import attention_forward

    b, hq, hkv, d, sk = 4, 32, 8, 128, 65
    torch.manual_seed(0)
    # as transformers makes them: q a bhsd view of the projection's bshd output, K/V the cache's bhsd tensors
    q = torch.randn(b, 1, hq, d, device=dev, dtype=dt).transpose(1, 2)
    k, v = (torch.randn(b, hkv, sk, d, device=dev, dtype=dt) for _ in range(2))
    mask = torch.ones(b, 1, 1, sk, dtype=torch.bool, device=dev)
    mask[1, ..., : sk // 5] = False
    restore = _unsettled_decode_path(torch, dev)

    class Module:  # what transformers' attention functions read off the layer
        is_causal = True
        layer_idx = 0

    adapter = registry.fallback()

    def two_layers(step_mask: Any, *, sdpa: bool = False) -> None:
        for _layer in range(2):
            if sdpa:  # transformers' own SDPA call, as "sdpa_bool_mask"
                F.scaled_dot_product_attention(q, k, v, attn_mask=step_mask, scale=scale,
                                               enable_gqa=True).transpose(1, 2).contiguous()
            else:
                attention_forward(Module(), q, k, v, step_mask, scaling=scale)

    folded = sdpa_module._batch_folded(q, k, v)
    bias = sdpa_module._decode_bias(mask, None, b=b, hkv=hkv, g=hq // hkv, sq=1, sk=sk, dtype=dt, batch_folded=True,
                                    capturing=False)
    op = torch._scaled_dot_product_efficient_attention
    scale = d ** -0.5
    # a step's first layer alone: 64 mask objects in turn, more than any keeper holds (lanes, kept biases), each
    # made before the timing (the mask's own making is the model's, as SDPA pays it too)
    pool = itertools.cycle([mask.clone() for _ in range(64)])
    variants: dict[str, Callable[[], Any]] = {
        "integration_new_mask": lambda: attention_forward(Module(), q, k, v, next(pool), scaling=scale),
        "sdpa_new_mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=next(pool), scale=scale,
                                                                enable_gqa=True).transpose(1, 2).contiguous(),
        "adapter_new_mask": lambda: adapter(q, k, v, causal=False, scale=scale, attn_mask=next(pool)),
        "efficient_decode_new_mask": lambda: sdpa_module._efficient_decode(q, k, v, next(pool), seen=None,
                                                                           scale=scale),
        "decode_bias_new_mask": lambda: sdpa_module._decode_bias(next(pool), None, b=b, hkv=hkv, g=hq // hkv, sq=1,
                                                                 sk=sk, dtype=dt, batch_folded=True,
                                                                 capturing=False),
        "sdpa_bool_mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                                                 enable_gqa=True).transpose(1, 2).contiguous(),
        "integration": lambda: attention_forward(Module(), q, k, v, mask, scaling=scale),
        # a step's first layer: a new mask object each call (its bias made, the lane made), then its second layer
        "integration_step_2_layers": lambda: two_layers(torch.ones(b, 1, 1, sk, dtype=torch.bool, device=dev)),
        "sdpa_step_2_layers": lambda: two_layers(torch.ones(b, 1, 1, sk, dtype=torch.bool, device=dev), sdpa=True),
        "attention": lambda: attnforge.attention(q, k, v, attn_mask=mask, scale=scale),
        "adapter": lambda: adapter(q, k, v, causal=False, scale=scale, attn_mask=mask),
        "efficient_decode": lambda: sdpa_module._efficient_decode(q, k, v, mask, seen=None, scale=scale),
        "op_batch_folded": lambda: op(*folded, bias, False, 0.0, False, scale=scale),
        "op_heads_folded_and_copy": lambda: op(q.reshape(b, hkv, hq // hkv, d), k, v,
                                               bias.view(b, hkv, hq // hkv, sk), False, 0.0, False,
                                               scale=scale)[0].reshape(b, hq, 1, d),
        "batch_folded_views": lambda: sdpa_module._batch_folded(q, k, v),
        "graph_capturing": _base.graph_capturing,
        "kernels_restricted": sdpa_original.kernels_restricted,
        "met_unsettled": lambda: sdpa_module._MET.unsettled(q, k, v, mask),
        "records_grad": lambda: _base.records_grad(q, k, v, mask),
        "empty_like_output": lambda: torch.empty(b, 1, hq, d, device=dev, dtype=dt),
    }
    out: dict[str, Any] = {"q": list(q.shape), "k": list(k.shape), "op": "real" if dev == "cuda" else "stand-in"}
    try:
        for name, fn in variants.items():
            out[f"{name}_us"] = round(_best_loop_us(torch, fn, warm=30, n=300), 2)
    finally:
        restore()
    return out


def _best_us_per_call(torch: Any, fn: Callable[..., Any],
                      rounds: list[list[tuple[Any, Any, Any]]]) -> tuple[float, Any]:
    """µs per call of ``fn(k, v, mask)`` over each round's calls back to back between two synchronizes, the best
    round; and the last call's output."""
    best, out = float("inf"), None
    for calls in rounds:
        models_e2e._sync(torch)
        t0 = time.perf_counter()
        for k, v, m in calls:
            out = fn(k, v, m)
        models_e2e._sync(torch)
        best = min(best, (time.perf_counter() - t0) / len(calls) * 1e6)
    return round(best, 2), out


def _host_us_per_call(torch: Any, fn: Callable[..., Any], calls: list[tuple[Any, Any, Any]]) -> float | None:
    """Host µs per call of ``fn(k, v, mask)``, the device kept busy meanwhile (a ~50 ms ``torch.cuda._sleep``
    queued first), so no call waits for a kernel: what a call costs the host alone; the best of 5 rounds, None
    off CUDA or where the device finished before the host (the sleep too short to hide it)."""
    if not torch.cuda.is_available() or calls[0][0].device.type != "cuda":
        return None
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        torch.cuda._sleep(100_000_000)  # cycles: ~50 ms at the H200's ~2 GHz
        t0 = time.perf_counter()
        for k, v, m in calls:
            fn(k, v, m)
        t1 = time.perf_counter()
        busy = not torch.cuda.current_stream().query()
        torch.cuda.synchronize()
        if busy:
            best = min(best, (t1 - t0) / len(calls) * 1e6)
    return round(best, 2) if best < float("inf") else None


def _profile(torch: Any, dev: str, fn: Callable[[], Any]) -> list[dict[str, Any]]:
    """Every profiler row of 8 calls: kernels (device µs) and CUDA API calls (count, self CPU µs)."""
    if dev != "cuda":
        return []
    from torch.profiler import ProfilerActivity, profile

    fn()
    models_e2e._sync(torch)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        models_e2e._sync(torch)
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total + e.device_time_total, reverse=True)
    return [{"name": e.key[:110], "calls": e.count, "device_us": round(e.device_time_total, 1),
             "self_cpu_us": round(e.self_cpu_time_total, 1)} for e in rows[:25]]


def generate(torch: Any) -> dict[str, Any]:
    """The padded ``generate`` of the 2-layer Llama-3-8B-shaped decoder: SDPA and attnforge, interleaved."""
    import transformers

    from attnforge.integrations.transformers import register

    register()
    spec = models_e2e.DECODERS["llama3-8b"]
    cfg_kw = dict(spec["cfg"])
    if models_e2e.SMALL:
        cfg_kw.update(hidden_size=128, head_dim=16, intermediate_size=64)
    cfg = transformers.LlamaConfig(vocab_size=2048, num_hidden_layers=models_e2e.LAYERS,
                                   max_position_embeddings=8192, **cfg_kw)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(models_e2e.DEV, getattr(torch, models_e2e.DT))
    use = {impl: (lambda impl=impl: model.set_attn_implementation(impl)) for impl in ("sdpa", "attnforge")}
    res: dict[str, Any] = models_e2e._generate_paired(torch, model, 4, use)
    res["speedup_decode"] = (res["attnforge_generate"]["decode_tokens_per_s"]
                             / res["sdpa_generate"]["decode_tokens_per_s"])
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", default="", help="comma-separated sections (efficient_breakdown, "
                                                "decode_kernels[_long], adapter_steps, host_costs, calls, "
                                                "gemma_calls, fa4_varlen_decode, gqa_decode_cell, sdpa_direct, "
                                                "prefill_first_calls, generate); default all")
    args = ap.parse_args()
    import torch

    small = args.device != "cuda"
    models_e2e.DEV, models_e2e.DT, models_e2e.SMALL = args.device, ("float32" if small else "bfloat16"), small
    dt = getattr(torch, models_e2e.DT)
    results: dict[str, Any] = {"device": torch.cuda.get_device_name() if not small else "cpu",
                               "torch": torch.__version__}
    only = set(args.only.split(",")) if args.only else None
    for name, fn in (("efficient_breakdown", lambda: efficient_breakdown(torch, args.device, dt, small)),
                     ("decode_kernels", lambda: decode_kernels(torch, args.device, dt, small)),
                     ("adapter_steps", lambda: adapter_steps(torch, args.device, dt, small)),
                     ("host_costs", lambda: host_costs(torch, args.device, dt, small)),
                     ("decode_kernels_long", lambda: decode_kernels(torch, args.device, dt, small, batch=1,
                                                                    keys=4096)),
                     ("calls", lambda: calls(torch, args.device, dt, small)),
                     ("gemma_calls", lambda: gemma_calls(torch, args.device, dt, small)),
                     ("fa4_varlen_decode", lambda: fa4_varlen_decode(torch, args.device, dt, small)),
                     ("gqa_decode_cell", lambda: gqa_decode_cell(torch, args.device, dt, small)),
                     ("sdpa_direct", lambda: sdpa_direct(torch, args.device, dt, small)),
                     ("prefill_first_calls", lambda: prefill_first_calls(torch, args.device, dt, small)),
                     ("generate", lambda: generate(torch))):
        if only is not None and name not in only:
            continue
        t0 = time.perf_counter()
        try:
            results[name] = fn()
        except Exception as exc:
            import traceback

            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:800]}
        results[name]["wall_s"] = round(time.perf_counter() - t0, 1)
        print(name, json.dumps({k: v for k, v in results[name].items() if not k.endswith("_profile")}, indent=1),
              flush=True)
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
