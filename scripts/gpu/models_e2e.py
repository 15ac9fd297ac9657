#!/usr/bin/env python3
"""Models as the acceptance test (issue 30 item 5): real layer shapes, random weights, attnforge against each
framework's default attention, outputs compared.

No weights are downloaded: every model is built from a config with the published model's layer geometry
(hidden size, heads, KV heads, head dim, MLP width, softcap, sliding window) but only a few layers and a small
vocabulary, random weights (seed 0), bf16 on CUDA. Configs follow the models' public ``config.json`` files:

- Llama-3-8B: hidden 4096, 32 heads, 8 KV heads (GQA 4), D128, MLP 14336, rope theta 500000;
- Qwen2.5-7B: hidden 3584, 28 heads, 4 KV heads (GQA 7), D128, MLP 18944, qkv bias;
- Gemma-2-9B: hidden 3584, 16 heads, 8 KV heads, D256, MLP 14336, attention softcap 50, final softcap 30,
  sliding window 4096 on every other layer, query_pre_attn_scalar 256 (transformers' default for it: eager);
- Flux-dev transformer: 24 heads x D128 (hidden 3072), joint attention dim 4096, 1 double + 1 single block,
  a 1024x1024 image (4096 tokens) + 512 text tokens;
- Wan-2.1 (1.3B) transformer: 12 heads x D128 (hidden 1536), MLP 8960, 1 block, an 81-frame 480x832 video
  (21 x 30 x 52 = 32760 latent tokens) + 512 text tokens.

Per decoder: forward of a left-padded batch (logits compared on the valid positions), one training step
(forward + backward), and ``generate`` with a KV cache (prefill, then decode tokens/s over a padded batch).
Per diffusion block: one forward (a denoising step), output compared.

Usage: ``python scripts/gpu/models_e2e.py --out models_e2e.json [--only llama3,flux] [--layers 2] [--device cpu]``;
``--device cpu`` is a float32 dry run at tiny sizes. Prints each result and writes JSON after every model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from _timing import interleaved, median, paired_ms, ratio_spread, round_ratios

DEV, DT, SMALL, WARMUP, DIAGNOSE, FRESH_LENGTHS, DECODE_ONLY = "cuda", "bfloat16", False, False, False, False, False
#: --read-every-mask (main: a variant timed beside attnforge's rule)
MASK_VARIANT: dict[str, bool] = {"read_every_mask": False}
#: timed decode rounds per implementation (``--decode-rounds``), after one untimed warm-up round
DECODE_ROUNDS = 5
#: interleaved rounds of the forward, train-step, prefill and block figures (``--rounds``): with 5, two runs of a
#: train step with SDPA on both sides read 0.984x and 1.007x (H200, docs/benchmarks.md "twentieth session"); a
#: figure whose attention is a few % of the step needs more to tell a 1 % lead from the host's drift
ROUNDS = {"rounds": 5}
LAYERS = 2
#: --inference-mode: the forwards and generate under ``torch.inference_mode`` (a way servers run), not ``no_grad``
GRAD_MODE: dict[str, bool] = {"inference_mode": False}


def _no_grad(torch: Any) -> Any:
    """The context the forwards and ``generate`` run in: ``torch.no_grad()``, or ``torch.inference_mode()``."""
    return torch.inference_mode() if GRAD_MODE["inference_mode"] else torch.no_grad()


def _warmup_decoder(cfg_kw: dict[str, Any], batch: int, seq: int) -> dict[str, Any]:
    """``attnforge warmup --model config.json --batch B --seqlen S`` of this decoder's geometry (the CLI's code:
    :func:`attnforge.bench.models.read_model_config` + :func:`attnforge.dispatch.warmup.warmup`), so no timed
    call compiles or measures; returns the seconds, classes and compiled files."""
    import tempfile
    from pathlib import Path

    from attnforge.bench.models import model_config_shapes, read_model_config
    from attnforge.types.shapes import Mode

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps({**cfg_kw, "max_position_embeddings": 8192}))
        model = read_model_config(path)
    shapes = model_config_shapes(model, dtype=DT, batch=batch, seqlens=(seq,), modes=(Mode.FWD, Mode.FWD_BWD),
                                 cpu=SMALL)
    from attnforge.integrations.transformers import PREFILL_VARLEN_MIN

    return _warm(shapes, window=model.sliding_window, softcap=model.softcap, padded_prefill_from=PREFILL_VARLEN_MIN)


def _warm(shapes: Any, **kw: Any) -> dict[str, Any]:
    from attnforge.dispatch.warmup import warmup

    t0 = time.perf_counter()
    report = warmup(shapes, device=DEV, **kw)
    return {"s": round(time.perf_counter() - t0, 2), "compiled_files": report.compiled_files,
            "classes": [f"{w.shape_class}: {w.chosen} {w.duration_s:.1f}s {w.error}" for w in report.classes]}


def _sync(torch: Any) -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def _compare(got: Any, ref: Any) -> dict[str, float]:
    got, ref = got.float(), ref.float()
    return {"max_abs_diff": float((got - ref).abs().max()), "ref_abs_max": float(ref.abs().max()),
            "rel_l2": float((got - ref).norm() / ref.norm().clamp_min(1e-30))}


DECODERS: dict[str, dict[str, Any]] = {
    "llama3-8b": {"cls": "Llama", "default": "sdpa",
                  "cfg": {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                          "intermediate_size": 14336, "rope_theta": 500000.0}},
    "qwen2.5-7b": {"cls": "Qwen2", "default": "sdpa",
                   "cfg": {"hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
                           "intermediate_size": 18944, "rope_theta": 1000000.0}},
    "gemma2-9b": {"cls": "Gemma2", "default": "eager",
                  "cfg": {"hidden_size": 3584, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
                          "intermediate_size": 14336, "attn_logit_softcapping": 50.0,
                          "final_logit_softcapping": 30.0, "sliding_window": 4096, "query_pre_attn_scalar": 256}},
}


def decoder_model(torch: Any, name: str) -> tuple[Any, dict[str, Any]]:
    """The :data:`DECODERS` entry ``name`` built at :data:`LAYERS` layers on :data:`DEV` (random weights, seed 0),
    and its config keywords; ``"attnforge"`` registered with transformers."""
    import transformers

    from attnforge.integrations.transformers import register

    register()
    spec = DECODERS[name]
    cfg_kw = dict(spec["cfg"])
    if SMALL:  # same structure, tiny widths
        heads, kv = cfg_kw["num_attention_heads"], cfg_kw["num_key_value_heads"]
        cfg_kw.update(hidden_size=heads * 16, head_dim=16, intermediate_size=64,
                      num_attention_heads=heads, num_key_value_heads=kv)
        if "sliding_window" in cfg_kw:
            cfg_kw["sliding_window"] = 16
    cfg = getattr(transformers, f"{spec['cls']}Config")(vocab_size=2048, num_hidden_layers=LAYERS,
                                                       max_position_embeddings=8192, **cfg_kw)
    model_cls = getattr(transformers, f"{spec['cls']}ForCausalLM")
    torch.manual_seed(0)
    with torch.device(DEV):  # built where it runs: a full-depth model (Gemma-2-9B's 42 layers: 8.3e9 parameters)
        model = model_cls(cfg).to(getattr(torch, DT))  # would take minutes to initialise on the host
    return model, cfg_kw


def decoder(torch: Any, name: str) -> dict[str, Any]:
    spec = DECODERS[name]
    model, cfg_kw = decoder_model(torch, name)
    batch, seq = (2, 48) if SMALL else (4, 2048)
    ids = torch.randint(0, 2048, (batch, seq), device=DEV)
    mask = torch.ones_like(ids)
    mask[1, : seq // 7] = 0  # left padding on one row
    default = spec["default"]
    res: dict[str, Any] = {"model": f"{name} shapes, {LAYERS} layers, random weights", "default": default,
                           "batch": batch, "seqlen": seq, "config": cfg_kw}
    if WARMUP:
        res["warmup"] = _warmup_decoder(cfg_kw, batch, seq)
    impls = (default, "attnforge")
    logits = {}
    for impl in impls:
        model.set_attn_implementation(impl)  # the same weights for both
        with torch.no_grad():
            logits[impl] = model(input_ids=ids, attention_mask=mask).logits
    use = {impl: (lambda impl=impl: _use(model, impl)) for impl in impls}
    if MASK_VARIANT["read_every_mask"]:  # a third implementation, in the same rounds: MaskSharing reads every mask
        use["attnforge-read-every-mask"] = lambda: _use(model, "attnforge", shared=1)
    if not DECODE_ONLY:
        _forward_and_train(torch, model, ids, mask, use=use, res=res)
    res.update(_generate_paired(torch, model, batch, use))
    for impl in impls:
        _use(model, impl)  # attnforge's own rule: the --read-every-mask rounds may have left SHARED at 1
        if DIAGNOSE:
            res[f"{impl}_generate"].update(_generate_diagnosis(torch, model, batch))
        if name == "llama3-8b" and not DECODE_ONLY:  # where a padded forward's time goes (issue 30 item 4)
            res[f"{impl}_fwd_kernels"] = _kernels(torch, lambda: model(input_ids=ids, attention_mask=mask))
    if DIAGNOSE:
        res["caller_pace"] = _caller_pace()
    valid = mask.bool()
    res["logits"] = _compare(logits["attnforge"][valid], logits[default][valid])
    res["attnforge_explain_padded"] = _explain_padded(torch, model, ids, mask)
    for key in () if DECODE_ONLY else ("fwd_ms", "fwd_padded_ms", "train_step_ms"):
        res[f"speedup_{key}"] = res[f"{default}_{key}"] / res[f"attnforge_{key}"]
    for key in ("prefill_ms", "decode_tokens_per_s"):
        a, d = res["attnforge_generate"][key], res[f"{default}_generate"][key]
        res[f"speedup_{key}"] = (d / a) if key.endswith("_ms") else (a / d)
    # the decode step's spread as the other figures': the default's median step over attnforge's per interleaved
    # round (Gemma's decode on 2026-11-30 read 0.762x from two bimodal series whose slow rounds fell unevenly)
    steps = {impl: res[f"{impl}_generate"].get("decode_step_ms_per_round", []) for impl in (default, "attnforge")}
    _round_spread(res, "decode_tokens_per_s", steps, default=default, reps=1)
    if MASK_VARIANT["read_every_mask"]:  # not a speedup_ key: it is a variant, not what attnforge ships
        res["read_every_mask_decode_ratio"] = (res["attnforge-read-every-mask_generate"]["decode_tokens_per_s"]
                                               / res[f"{default}_generate"]["decode_tokens_per_s"])
        _use(model, "attnforge", shared=1)
        if DIAGNOSE:
            res["attnforge-read-every-mask_generate"].update(_generate_diagnosis(torch, model, batch))
        _use(model, "attnforge")
    return res


def _caller_pace() -> dict[str, list[int]]:
    """Per class a non-SDPA route served so far in this process: of its counted calls, how many issued their
    kernels while the device was still busy with the model's earlier work (their host time hidden), of how many
    (:class:`attnforge.dispatch.insitu.CallerPace`)."""
    from attnforge.dispatch import insitu
    from attnforge.dispatch.runtime import get_dispatcher

    return {k: [x.busy, x.seen] for k, x in insitu.caller_pace(get_dispatcher()).items()}


def _use(model: Any, impl: str, *, shared: int = 2) -> None:
    """Switch ``model`` to ``impl``; ``shared``: the calls a mask must serve before masks of its kind are read at
    their first call (``MaskSharing.SHARED``: 2 is attnforge's rule; 1 reads every mask, a measured variant)."""
    from attnforge.backends._padded_decode import MaskSharing

    MaskSharing.SHARED = shared
    model.set_attn_implementation(impl)


def _forward_and_train(torch: Any, model: Any, ids: Any, mask: Any, *, use: dict[str, Any],
                       res: dict[str, Any]) -> None:
    """The forward (unpadded and padded) and train-step figures of :func:`decoder`, the implementations paired."""
    with _no_grad(torch):
        # an unpadded batch (packed or equal-length training data: no mask, plain causal attention) and the
        # left-padded one (a bool mask on every call); both implementations interleaved (paired_ms)
        for key, fn in (("fwd_ms", lambda: model(input_ids=ids)),
                        ("fwd_padded_ms", lambda: model(input_ids=ids, attention_mask=mask))):
            samples: dict[str, list[float]] = {}
            for impl, ms in paired_ms(torch, fn, use, reps=3, rounds=ROUNDS["rounds"], samples=samples).items():
                res[f"{impl}_{key}"] = ms
            _round_spread(res, key, samples, default=next(iter(use)), reps=3)

    step = _train_step(model, ids)
    samples = {}
    for impl, ms in paired_ms(torch, step, use, reps=2, rounds=ROUNDS["rounds"], samples=samples).items():
        res[f"{impl}_train_step_ms"] = ms
    _round_spread(res, "train_step_ms", samples, default=next(iter(use)), reps=2)
    res["train_step_samples_ms"] = samples  # every timed step, per implementation (a figure near 1.00 needs its spread)
    if DIAGNOSE:  # where a train step's time goes: its host syncs (a sync makes host time add to device time) and
        # its kernels, per implementation (the 2026-11-30 H200 run: attention()'s train step 0.7-0.9 ms slower than
        # the session before with FA3 chosen in both, the default's unchanged)
        for impl, switch in use.items():
            switch()
            res[f"{impl}_train_syncs"] = _syncs(torch, step)
            res[f"{impl}_train_kernels"] = _kernels(torch, step, grad=True)


def _round_spread(res: dict[str, Any], key: str, samples: dict[str, list[float]], *, default: str,
                  reps: int) -> None:
    """``res["round_speedups"][key]``: the default's time over attnforge's per interleaved round (their least, median
    and most), beside the ratio of the two medians that ``speedup_<key>`` reports: where the rounds' ratios straddle
    1.00 the figure cannot be told from it."""
    spread = ratio_spread(round_ratios(samples, base=default, new="attnforge", reps=reps))
    if spread:
        res.setdefault("round_speedups", {})[key] = spread


def _train_step(model: Any, ids: Any) -> Any:
    """One train step of ``model`` on ``ids`` (labels = inputs): forward, loss, backward, gradients cleared."""
    def step() -> None:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        model.zero_grad(set_to_none=True)

    return step


def _kernels(torch: Any, fn: Any, top: int = 15, *, grad: bool = False) -> list[dict[str, Any]]:
    """The GPU kernels of one ``fn()`` call (after a warm-up call) by total device time, under ``torch.no_grad()``
    unless ``grad`` (a train step). Empty off CUDA."""
    if DEV != "cuda":
        return []
    import contextlib

    from torch.profiler import ProfilerActivity, profile

    with contextlib.nullcontext() if grad else torch.no_grad():
        fn()
        _sync(torch)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            _sync(torch)
    rows = sorted(prof.key_averages(), key=lambda e: e.device_time_total, reverse=True)
    out = [{"name": e.key[:120], "calls": e.count, "device_ms": round(e.device_time_total / 1e3, 4),
            "cpu_ms": round(e.cpu_time_total / 1e3, 4)} for e in rows[:top] if e.device_time_total > 0]
    cpu = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    out += [{"cpu_self": e.key[:120], "calls": e.count, "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 4)}
            for e in cpu]
    return out


def _explain_padded(torch: Any, model: Any, ids: Any, mask: Any) -> dict[str, Any]:
    """What attention() chose for the model's own padded calls: the q/k/v/mask it receives, captured from the
    first layer through a forward pre-hook-free spy on ``attnforge.attention``."""
    import attnforge
    from attnforge.dispatch import runtime

    seen: dict[str, Any] = {}
    original = runtime.attention

    def spy(q: Any, k: Any, v: Any, **kw: Any) -> Any:
        if not seen:
            m = kw.get("attn_mask")
            seen.update(q=[list(q.shape), list(q.stride())], k=[list(k.shape), list(k.stride())],
                        mask=None if m is None else [list(m.shape), str(m.dtype), list(m.stride())],
                        kwargs=sorted(k2 for k2, v2 in kw.items() if v2 is not None))
            try:
                why = attnforge.explain(q, k, v, **kw)
                seen["chosen"], seen["order"] = why.chosen, list(why.order)
                seen["explain"] = str(why)[:2000]
            except Exception as exc:
                seen["explain_error"] = f"{type(exc).__name__}: {exc}"[:400]
        return original(q, k, v, **kw)

    runtime.attention = spy  # the integration calls runtime.attention
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
    finally:
        runtime.attention = original
    return seen


def _generate_inputs(torch: Any, batch: int) -> tuple[dict[str, Any], int, int]:
    prompt, new = (24, 8) if SMALL else (1024, 64)
    torch.manual_seed(1)
    ids = torch.randint(3, 2048, (batch, prompt), device=DEV)
    mask = torch.ones_like(ids)
    mask[1, : prompt // 5] = 0
    return ({"input_ids": ids, "attention_mask": mask, "do_sample": False, "pad_token_id": 0, "eos_token_id": None},
            prompt, new)


def _generate_paired(torch: Any, model: Any, batch: int, use: dict[str, Any]) -> dict[str, Any]:
    """Per implementation (``use``: name -> switch the model to it), ``{name}_generate``: prefill time
    (``max_new_tokens=1``) and decode tokens/s (``(t(1 + N) - t(1)) / N`` per sequence, KV cache) of greedy
    ``generate`` over a left-padded batch of ``batch`` prompts, the implementations interleaved round by round
    (:func:`_timing.paired_ms`)."""
    kw, prompt, new = _generate_inputs(torch, batch)
    t1 = paired_ms(torch, lambda: _generate_run(torch, model, kw, 1), use, reps=3, rounds=ROUNDS["rounds"])
    per_round: dict[str, list[float]] = {}
    step, first = _decode_step_ms(torch, model, kw, new=new, use=use, per_round=per_round)
    return {f"{name}_generate": {"prefill_ms": t1[name], "prompt": prompt, "new_tokens": new,
                                 "decode_step_ms": step[name], "decode_tokens_per_s": batch / (step[name] / 1e3),
                                 "first_round_decode_step_ms": first[name],
                                 "decode_step_ms_per_round": per_round.get(name, [])}
            for name in use}


def _decode_step_ms(torch: Any, model: Any, kw: dict[str, Any], *, new: int, use: dict[str, Any],
                    rounds: int | None = None,
                    per_round: dict[str, list[float]] | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """Median ms of one decode step of ``generate`` (KV cache) per implementation, from a clock read between
    steps (a logits processor that synchronises and stamps), the implementations interleaved round by round:
    ``rounds x (new - 1)`` steps each. The difference of two generate runs (``t(1 + N) - t(1)``) moved one model's
    figure between 0.84x and 1.09x on an H100 host (2026-11-28, docs/benchmarks.md); per-step medians do not
    carry the run-to-run drift. With ``--fresh-lengths`` every round and implementation generates from a prompt
    cut to a length no other had, as a server's requests do: the prompt grows by ``new + 1`` tokens per round and
    implementation (1024 to ~1800 tokens), and each cut is one decode's span apart, so no K/V length repeats (a
    kernel that builds a graph per sequence length, cuDNN's attention, pays for it in every step then; with
    repeated lengths only in the warm-up round). Until 2026-11-28 the cuts were 8 tokens apart, so 7 of 8 lengths
    had been met in an earlier round. Second, the same median of the untimed warm-up round: a first request at
    those lengths (it holds, without ``--fresh-lengths``, the graph builds the timed rounds no longer pay).
    ``per_round``: filled with each timed round's median step per implementation."""
    import time

    from transformers import LogitsProcessor, LogitsProcessorList

    class Clock(LogitsProcessor):
        def __init__(self) -> None:
            self.stamps: list[float] = []

        def __call__(self, input_ids: Any, scores: Any) -> Any:
            _sync(torch)
            self.stamps.append(time.perf_counter())
            return scores

    rounds = DECODE_ROUNDS + 1 if rounds is None else rounds
    steps: dict[str, list[float]] = {name: [] for name in use}
    warm: dict[str, list[float]] = {name: [] for name in use}
    order = list(use)
    if FRESH_LENGTHS:  # the prompt grown by one decode's span per round and implementation, cut back per round
        span = new + 1
        extra = torch.randint(3, 2048, (kw["input_ids"].shape[0], rounds * len(order) * span),
                              device=kw["input_ids"].device)
        kw = dict(kw, input_ids=torch.cat([kw["input_ids"], extra], dim=1),
                  attention_mask=torch.cat([kw["attention_mask"], torch.ones_like(extra)], dim=1))
    for r, name in interleaved(use, rounds):
        clock = Clock()
        run_kw = kw
        if FRESH_LENGTHS:  # K/V lengths no round had: the spans of two rounds' decodes never overlap
            cut = span * (len(order) * r + order.index(name)) + 1
            run_kw = dict(kw, input_ids=kw["input_ids"][:, :-cut], attention_mask=kw["attention_mask"][:, :-cut])
        _generate_run(torch, model, run_kw, 1 + new, logits_processor=LogitsProcessorList([clock]))
        # the first round warms both up
        timed = [(b - a) * 1e3 for a, b in zip(clock.stamps[1:], clock.stamps[2:], strict=False)]
        (steps if r else warm)[name] += timed
        if r and per_round is not None and timed:  # each timed round's median step: the figure's spread
            per_round.setdefault(name, []).append(median(timed))
    return {name: median(t) for name, t in steps.items()}, {name: median(t) for name, t in warm.items()}


def _generate_diagnosis(torch: Any, model: Any, batch: int) -> dict[str, Any]:
    """What a decode step's attention calls chose, the host syncs of a 3-token generate, and the GPU kernels of
    8 decode steps, for the implementation the model is set to."""
    kw, _, _ = _generate_inputs(torch, batch)

    def run(n: int) -> Any:
        return _generate_run(torch, model, kw, n)

    return {"decode_calls": _spy_calls(torch, lambda: run(3)), "decode_paths": _paths(lambda: run(9)),
            "decode_syncs": _syncs(torch, lambda: run(3)),
            "decode_kernels": _kernels(torch, lambda: run(9), top=40),
            "decode_host": _host_profile(torch, lambda: run(9)),
            "threads": _threads()}


def _threads() -> list[str]:
    """The names of the process's live Python threads (sorted): a busy background thread (a first-use measurement,
    a compile) takes the GIL from a host-paced decode loop, which would slow every op of it alike; Gemma's decode on
    the 2026-11-30 H200 host read every op's own time 1.3-1.6x longer under attention() than under eager."""
    import threading

    return sorted(t.name for t in threading.enumerate())


def _host_profile(torch: Any, fn: Any, top: int = 30) -> dict[str, list[dict[str, Any]]]:
    """Where ``fn``'s host time goes (cProfile, after one unprofiled run): the ``top`` functions by own time, and
    by cumulative time among attnforge's and transformers' attention and masking functions (ms, calls)."""
    import cProfile
    import pstats

    fn()
    _sync(torch)
    prof = cProfile.Profile()
    prof.enable()
    fn()
    _sync(torch)
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = [{"fn": f"{path.rsplit('/', 2)[-1]}:{line}({name})", "calls": nc, "own_ms": round(tt * 1e3, 3),
             "cum_ms": round(ct * 1e3, 3), "path": path}
            for (path, line, name), (_, nc, tt, ct, _) in stats.items()]
    ours = [r for r in rows if "attnforge" in r["path"] or "masking_utils" in r["path"] or "attention" in r["fn"]]
    for r in rows:
        del r["path"]
    return {"by_own": sorted(rows, key=lambda r: -r["own_ms"])[:top],
            "attention_by_cum": sorted(ours, key=lambda r: -r["cum_ms"])[:top]}


def _generate_run(torch: Any, model: Any, kw: dict[str, Any], n: int, **extra: Any) -> Any:
    """Greedy ``generate`` of exactly ``n`` new tokens on ``kw`` (:func:`_generate_inputs`), without autograd."""
    with _no_grad(torch):
        return model.generate(**kw, max_new_tokens=n, min_new_tokens=n, **extra)


def _syncs(torch: Any, fn: Any) -> dict[str, int]:
    """The host syncs ``fn`` makes, by the source line that asked (``torch.cuda.set_sync_debug_mode("warn")``:
    a sync per attention call would serialize host and GPU in decode). Empty off CUDA."""
    if DEV != "cuda":
        return {}
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    where: dict[str, int] = {}
    for w in seen:
        if "synchroniz" in str(w.message):
            line = f"{w.filename}:{w.lineno}"
            where[line] = where.get(line, 0) + 1
    return where


def _paths(fn: Any) -> dict[str, int]:
    """What ran the attention calls of ``fn`` (a 9-token generate), counted: FlashAttention-4's padded decode lane
    (``Fa4DecodeLane``), its replayed varlen kernel (the lane's and the route's, ``Replayer``), the exact math
    (``exact_attention``: inside FA4's route where it declines, or chosen), the model's eager function (the
    integration's hand-off), and every call of attention() itself."""
    from attnforge.backends import _fa4_direct, exact, flash
    from attnforge.dispatch import runtime
    from attnforge.integrations import transformers as tfi

    counts: dict[str, int] = {}
    patched: list[tuple[Any, str, Any]] = []

    def count(owner: Any, attr: str, label: str) -> None:
        real = getattr(owner, attr)

        def spy(*a: Any, **kw: Any) -> Any:
            counts[label] = counts.get(label, 0) + 1
            return real(*a, **kw)

        patched.append((owner, attr, real))
        setattr(owner, attr, spy)

    count(runtime, "attention", "attention()")
    count(flash.Fa4DecodeLane, "__call__", "fa4_lane")
    count(_fa4_direct.Replayer, "__call__", "fa4_replay")
    count(exact, "exact_attention", "exact_math")
    count(tfi, "_eager", "model_eager")
    try:
        fn()
    finally:
        for owner, attr, real in reversed(patched):
            setattr(owner, attr, real)
    return counts


def _spy_calls(torch: Any, fn: Any) -> list[dict[str, Any]]:
    """The first attention calls ``fn`` makes through the integration (shapes, mask, what attention() chose)."""
    import attnforge
    from attnforge.dispatch import runtime

    seen: list[dict[str, Any]] = []
    original = runtime.attention

    def spy(q: Any, k: Any, v: Any, **kw: Any) -> Any:
        if len(seen) < 6:
            m = kw.get("attn_mask")
            row: dict[str, Any] = {"q": list(q.shape), "dtype": str(q.dtype), "k": list(k.shape),
                                   "k_stride": list(k.stride()),
                                   "mask": None if m is None else [list(m.shape), str(m.dtype)],
                                   "kwargs": sorted(k2 for k2, v2 in kw.items() if v2 is not None)}
            try:
                why = attnforge.explain(q, k, v, **kw)
                row["chosen"], row["order"], row["basis"] = why.chosen, list(why.order), list(why.basis)[:4]
            except Exception as exc:
                row["explain_error"] = f"{type(exc).__name__}: {exc}"[:300]
            seen.append(row)
        return original(q, k, v, **kw)

    runtime.attention = spy
    try:
        fn()
    finally:
        runtime.attention = original
    return seen


def flux(torch: Any) -> dict[str, Any]:
    import diffusers

    heads, dim = (4, 16) if SMALL else (24, 128)
    n_img, side, n_txt = (64, 8, 16) if SMALL else (4096, 64, 512)
    joint = 64 if SMALL else 4096
    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=LAYERS // 2, num_single_layers=LAYERS // 2,
        attention_head_dim=dim, num_attention_heads=heads, joint_attention_dim=joint, pooled_projection_dim=768,
        guidance_embeds=True, axes_dims_rope=(4, 6, 6) if SMALL else (16, 56, 56),
    ).to(DEV, getattr(torch, DT)).eval()
    img_ids = torch.zeros(n_img, 3, device=DEV)
    img_ids[:, 1], img_ids[:, 2] = torch.arange(n_img) // side, torch.arange(n_img) % side
    dt = getattr(torch, DT)
    inputs = {"hidden_states": torch.randn(1, n_img, 64, device=DEV, dtype=dt),
              "encoder_hidden_states": torch.randn(1, n_txt, joint, device=DEV, dtype=dt),
              "pooled_projections": torch.randn(1, 768, device=DEV, dtype=dt),
              "timestep": torch.tensor([0.5], device=DEV, dtype=dt), "guidance": torch.tensor([3.5], device=DEV),
              "img_ids": img_ids, "txt_ids": torch.zeros(n_txt, 3, device=DEV)}
    return _diffusion(torch, model, inputs, f"flux-dev shapes ({heads}x{dim}, {n_img}+{n_txt} tokens)",
                      heads=heads, dim=dim, tokens=n_img + n_txt)


def wan_block(torch: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The Wan-2.1 (1.3B) block, its inputs, and the keywords :func:`_diffusion` takes (heads, dim, tokens, cross)."""
    import diffusers

    heads, dim, ffn = (2, 16, 64) if SMALL else (12, 128, 8960)
    frames, h, w = (3, 8, 8) if SMALL else (21, 60, 104)  # latent of an 81-frame 480x832 video
    n_txt = 16 if SMALL else 512
    torch.manual_seed(0)
    model = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=dim, in_channels=16, out_channels=16,
        text_dim=4096 if not SMALL else 32, freq_dim=256 if not SMALL else 32, ffn_dim=ffn, num_layers=1,
    ).to(DEV, getattr(torch, DT)).eval()
    dt = getattr(torch, DT)
    inputs = {"hidden_states": torch.randn(1, 16, frames, h, w, device=DEV, dtype=dt),
              "timestep": torch.tensor([500], device=DEV),
              "encoder_hidden_states": torch.randn(1, n_txt, 4096 if not SMALL else 32, device=DEV, dtype=dt)}
    tokens = frames * (h // 2) * (w // 2)
    return model, inputs, {"heads": heads, "dim": dim, "tokens": tokens, "cross": n_txt}


def wan(torch: Any) -> dict[str, Any]:
    model, inputs, kw = wan_block(torch)
    return _diffusion(torch, model, inputs, f"wan2.1-1.3b shapes ({kw['heads']}x{kw['dim']}, {kw['tokens']}+"
                      f"{kw['cross']} tokens)", **kw)


def warm_diffusion(*, heads: int, dim: int, tokens: int, cross: int | None = None) -> dict[str, Any]:
    """``attnforge warmup`` of what diffusers calls: ``[B, S, H, D]`` (bshd) self-attention, and the
    cross-attention's own class."""
    from attnforge.types.shapes import AttentionShape, Layout, Mode

    return _warm([AttentionShape(batch=1, heads_q=heads, heads_kv=heads, seqlen_q=tokens, seqlen_k=sk, head_dim=dim,
                                 causal=False, mode=Mode.FWD, dtype=DT, layout=Layout.BSHD)
                  for sk in (tokens, *((cross,) if cross else ()))])


def _diffusion(torch: Any, model: Any, inputs: dict[str, Any], label: str, *, heads: int, dim: int,
               tokens: int, cross: int | None = None) -> dict[str, Any]:
    """One denoising step, default against ``"attnforge"``; ``cross``: the text tokens of a cross-attention
    (Wan; Flux's text is joined into its self-attention). The warm-up warms what diffusers calls: ``[B, S, H, D]``
    (bshd) self-attention, and the cross-attention's own class. ``--diagnose`` records what served each call."""
    from attnforge.integrations.diffusers import register

    res: dict[str, Any] = {"model": label}
    if WARMUP:
        res["warmup"] = warm_diffusion(heads=heads, dim=dim, tokens=tokens, cross=cross)
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    # diffusers' own default (``DIFFUSERS_ATTN_BACKEND``, "native"). Not ``reset_attention_backend()``: that clears
    # the processors' backend only, while ``set_attention_backend`` also made its backend the active one that a
    # cleared processor falls back to (diffusers 0.42), so "default" would run attnforge again.
    default = str(_AttentionBackendRegistry.get_active_backend()[0].value)
    register()
    use = {"default": lambda: model.set_attention_backend(default),
           "attnforge": lambda: model.set_attention_backend("attnforge")}
    with torch.no_grad():
        ref = model(**inputs).sample
        use["attnforge"]()
        got = model(**inputs).sample
        if DIAGNOSE:
            res["calls"] = _spy_calls(torch, lambda: model(**inputs))
        samples: dict[str, list[float]] = {}
        for impl, ms in paired_ms(torch, lambda: model(**inputs), use, reps=2, rounds=ROUNDS["rounds"],
                                  samples=samples).items():
            res[f"{impl}_step_ms"] = ms
            res[f"{impl}_step_ms_samples"] = [round(x, 4) for x in samples.get(impl, [])]
        _round_spread(res, "step_ms", samples, default="default", reps=2)
        if DIAGNOSE:  # where a step's time goes on each side (Flux's step 0.952x on an H200 with FA3 chosen,
            for impl, switch in use.items():  # 2026-11-30, while its attention calls were 2 x 0.43 ms of 9.3 ms)
                switch()
                res[f"{impl}_step_kernels"] = _kernels(torch, lambda: model(**inputs))
        use["default"]()
    if DIAGNOSE:
        res["caller_pace"] = _caller_pace()
    res.update(_compare(got, ref))
    res["speedup_step_ms"] = res["default_step_ms"] / res["attnforge_step_ms"]
    return res


MODELS = {**{name: (lambda torch, n=name: decoder(torch, n)) for name in DECODERS}, "flux-dev": flux,
          "wan2.1": wan}


def configure(torch: Any, device: str) -> dict[str, Any]:
    """Run on ``device`` ("cuda"; "cpu": a float32 dry run at tiny sizes), for this script and the ones that build
    its models (insitu_long.py, train_profile.py); returns the results' header (device name, torch version)."""
    global DEV, DT, SMALL
    DEV, DT, SMALL = device, ("bfloat16" if device == "cuda" else "float32"), device != "cuda"
    return {"device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu", "torch": torch.__version__}


def main() -> int:
    global WARMUP, DIAGNOSE, LAYERS, FRESH_LENGTHS, DECODE_ROUNDS, DECODE_ONLY
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", help="cpu: a float32 dry run at tiny sizes")
    ap.add_argument("--only", default="", help="comma-separated subset of " + ",".join(MODELS))
    ap.add_argument("--warmup", action="store_true",
                    help="`attnforge warmup` each model's shape classes before timing it (a deploy step)")
    ap.add_argument("--diagnose", action="store_true",
                    help="also record a decode step's attention calls (explain) and the kernels of 8 decode steps")
    ap.add_argument("--layers", type=int, default=LAYERS,
                    help="decoder layers, and Flux's blocks (half double, half single); the published models have"
                         " 26-42: what a forward pays once (a mask's preparation) is shared by all of them")
    ap.add_argument("--fresh-lengths", action="store_true",
                    help="decode from prompts of a length no earlier round had (a server's requests): every step"
                         " meets K/V lengths never seen before")
    ap.add_argument("--read-every-mask", action="store_true",
                    help="decoders: time a third implementation in the same rounds, attnforge with MaskSharing "
                         "reading every mask's runs at its first call (SHARED=1), against its rule (SHARED=2)")
    ap.add_argument("--decode-only", action="store_true",
                    help="decoders: only generate (prefill and decode), no forward or train step (a short call)")
    ap.add_argument("--inference-mode", action="store_true",
                    help="decoders: the forwards and generate under torch.inference_mode, as servers run them, not "
                         "no_grad (the train step keeps autograd)")
    ap.add_argument("--rounds", type=int, default=ROUNDS["rounds"],
                    help="interleaved rounds of the forward, train-step, prefill and block figures (9 reads a 1 %% "
                         "lead; each round costs a few seconds a model)")
    ap.add_argument("--decode-rounds", type=int, default=DECODE_ROUNDS,
                    help="timed decode rounds per implementation, interleaved (the host's pace drifts between "
                         "rounds: 5 rounds moved a ratio by up to ~10%% between two H200 machines, 2026-11-28)")
    args = ap.parse_args()
    import torch

    FRESH_LENGTHS, DECODE_ROUNDS, DECODE_ONLY = args.fresh_lengths, max(1, args.decode_rounds), args.decode_only
    ROUNDS["rounds"] = max(1, args.rounds)
    GRAD_MODE["inference_mode"] = args.inference_mode
    results = configure(torch, args.device)
    WARMUP, DIAGNOSE, LAYERS = args.warmup, args.diagnose, max(2, args.layers)
    MASK_VARIANT["read_every_mask"] = args.read_every_mask
    wanted = [m for m in args.only.split(",") if m] or list(MODELS)
    for name in wanted:
        t0 = time.perf_counter()
        try:
            results[name] = MODELS[name](torch)
        except Exception as exc:
            import traceback

            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:800]}
        results[name]["wall_s"] = round(time.perf_counter() - t0, 1)
        print(name, json.dumps(results[name], indent=1), flush=True)
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
    speedups = [v for r in results.values() if isinstance(r, dict) for k, v in r.items() if k.startswith("speedup_")]
    if speedups:
        import math

        results["geomean_speedup"] = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
        results["min_speedup"] = min(speedups)
        print(f"geomean speedup over the defaults {results['geomean_speedup']:.3f}x, min {min(speedups):.3f}x")
        for name, r in results.items():  # where a figure sits in its rounds' spread (least, median, most)
            for key, (lo, mid, hi) in (r.get("round_speedups", {}).items() if isinstance(r, dict) else ()):
                print(f"  {name} {key}: {r.get('speedup_' + key, float('nan')):.3f} (rounds {lo:.3f} / {mid:.3f} / "
                      f"{hi:.3f}){'  straddles 1.00' if lo < 1.0 < hi else ''}")
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
