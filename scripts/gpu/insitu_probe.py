#!/usr/bin/env python3
"""Why the in-situ check and every other timing disagree about FlashAttention-3's fwd+bwd route at 1k keys.

On the H200 (2026-11-30, docs/benchmarks.md "twenty-fifth session") the in-situ check timed FA3's route on bhsd
fwd+bwd at 0.764 ms against SDPA 0.553 (MHA 1k causal; 0.667 against 0.511 on MHA 1k the session before) and
reverted it, while warm-up timed the same route 0.332 against 0.374 and the grid timed FA3's public function on the
same bhsd views 8 % faster than SDPA. This script times each route of a cell's fwd+bwd class four ways, on the same
tensors, back to back in one process:

- ``paired_2ms`` / ``paired_8ms``: :func:`attnforge.bench.timing.paired` exactly as the in-situ check calls it
  (``autotune.step_of`` on detached copies, forward + ``autograd.grad``), with bench's 2 ms batches and the check's
  8 ms ones (``insitu.CHECK_BATCH_MS``); every round's per-call ms and the batch size;
- ``warmup_harness``: :func:`attnforge.bench.timing.measure` with the warm-up's configuration (1 s a class over the
  candidates, 5 interleaved rounds), every round's median;
- ``grid_loop``: the grid's timing (``out.backward(ones_like(out))`` on leaves, 20 calls between two syncs);
- ``host_only_us`` / ``device_only_ms``: 20 fwd+bwd calls issued with the device kept busy by a long sleep kernel
  first (CUDA events around them give the device's own time a call, the host never behind it), so the wall
  time is the host's alone: a route whose host time per call exceeds its device time is host-bound, and a check of
  two or three calls per batch times its host.

Routes: SDPA, FA3 and FA4 (each bound as the dispatcher binds it, :func:`attnforge.backends.bound.bound_call`), on
bhsd and bshd tensors. ``--device cpu`` is a dry run of the flow at tiny sizes (SDPA only).

    python scripts/gpu/insitu_probe.py --out insitu_probe.json [--cells mha-1k,mha-1k-causal] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import grid_check as grid


def _bound(torch: Any, name: str, tensors: tuple[Any, Any, Any], *, causal: bool, bshd: bool) -> Callable[..., Any]:
    from attnforge.backends import registry
    from attnforge.backends.bound import bound_call
    from attnforge.dispatch.runtime import get_dispatcher

    adapter = get_dispatcher().fallback if name == "sdpa" else registry.adapters()[name]
    if name != "sdpa" and adapter.load_error():
        raise RuntimeError(adapter.load_error().splitlines()[0])
    q, k, _ = tensors
    qb, kb = (q.transpose(1, 2), k.transpose(1, 2)) if bshd else (q, k)
    call = get_dispatcher().describe(qb, kb, causal=causal, precision="exact", needs_grad=True)
    return bound_call(adapter, call, causal=causal, scale=None, bshd=bshd)


def _behind_sleep(torch: Any, step: Callable[[int], object], calls: int, dev: str) -> tuple[float | None, float | None]:
    """Wall µs per call of ``calls`` steps issued while the device runs a long sleep kernel queued before them, and
    the device's own ms per call for them (CUDA events around the queued steps: the device never waits for the
    host inside them)."""
    if dev != "cuda":
        return None, None
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))  # ~1 s of device time at ~2 GHz: the steps queue behind it
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for i in range(calls):
        step(i)
    host = (time.perf_counter() - t0) / calls * 1e6
    end.record()
    torch.cuda.synchronize()
    return round(host, 1), start.elapsed_time(end) / calls


def probe_cell(torch: Any, cell: Any, *, dev: str, dtype: Any) -> dict[str, Any]:
    from attnforge.bench.timing import BATCH_MS, batch_size, hold_for, marks_for, measure, paired
    from attnforge.dispatch import autotune, insitu

    qb, kb, vb, qs, ks, vs = grid.inputs(torch, cell, grad=True, dtype=dtype, dev=dev)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    clock = time.perf_counter
    out: dict[str, Any] = {"cell": cell.name, "layouts": {}}
    for layout, tensors in (("bhsd", (qb, kb, vb)), ("bshd", (qs, ks, vs))):
        bshd = layout == "bshd"
        routes: dict[str, Callable[..., Any]] = {}
        errors: dict[str, str] = {}
        for name in ("sdpa", "flash-attn-3", "flash-attn-4"):
            try:
                fn = _bound(torch, name, tensors, causal=cell.causal, bshd=bshd)
                autotune.step_of(fn, tensors, grad=True)(0)  # first call: FA4's compile, outside every timing
                sync()
                routes[name] = fn
            except Exception as exc:  # a backend this machine lacks, or one that cannot run the cell
                errors[name] = f"{type(exc).__name__}: {exc}"[:200]
        res: dict[str, Any] = {"errors": errors, "routes": {}}
        steps = {n: autotune.step_of(fn, tensors, grad=True) for n, fn in routes.items()}
        marks = marks_for(tensors[0].device, clock)
        for name in [n for n in routes if n != "sdpa"]:
            pair = {name: steps[name], "sdpa": steps["sdpa"]}
            for label, batch_ms in (("paired_2ms", BATCH_MS), ("paired_8ms", insitu.CHECK_BATCH_MS)):
                timings = paired(pair, pairs=insitu.PAIRS, sync=sync, clock=clock, max_call_ms=1e9, marks=marks,
                                 batch_ms=batch_ms)
                res["routes"].setdefault(name, {})[label] = None if timings is None else {
                    n: {"median_ms": t.median_ms, "rounds_ms": list(t.rounds_ms)} for n, t in timings.items()}
        config = autotune.round_timing(autotune.DEFAULT, len(routes))  # the warm-up's own rounds
        rounds: dict[str, list[float]] = {n: [] for n in routes}
        names = list(routes)
        for r in range(autotune.DEFAULT.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                rounds[name].append(measure(steps[name], sets=1, config=config, sync=sync, clock=clock,
                                            marks=marks, hold=hold_for(tensors[0].device)).median_ms)
        for name, fn in routes.items():
            row = res["routes"].setdefault(name, {})
            row["warmup_harness_rounds_ms"] = rounds[name]
            grid_step = grid.as_timed(torch, lambda fn=fn, a=tensors: fn(*a), True)  # the grid's own fwd+bwd call
            for _ in range(3):
                grid_step()
            sync()
            t0 = time.perf_counter()
            for _ in range(20):
                grid_step()
            sync()
            row["grid_loop_ms"] = (time.perf_counter() - t0) / 20 * 1e3
            for t in tensors:
                t.grad = None
            row["host_only_us"], row["device_only_ms"] = _behind_sleep(torch, steps[name], 20, dev)
            est = min(row.get("warmup_harness_rounds_ms") or [1.0])
            row["batch_2ms"], row["batch_8ms"] = batch_size(est), batch_size(est, target_ms=insitu.CHECK_BATCH_MS)
        out["layouts"][layout] = res
        print(f"{cell.name} {layout}: " + json.dumps({n: {k: (round(v, 4) if isinstance(v, float) else v)
                                                          for k, v in r.items() if not isinstance(v, (list, dict))}
                                                      for n, r in res["routes"].items()}), flush=True)
    return out


def live_cell(torch: Any, cell: Any, *, dev: str, dtype: Any) -> dict[str, Any]:
    """The in-situ check as the grid meets it: ``attention()`` on the grid's leaves, forward +
    ``backward(ones_like(out))``, 100 calls of a class (the check runs at its 64th), in this process's dispatcher.
    The tie margin is set to 0 for this part alone (``ranking.K``, ``ranking.MIN_MARGIN``), so first use picks the
    fastest candidate even by a hair and the check runs on it: what is measured is how the check times the route
    inside a live call, not which route wins. ``bench.timing.paired`` is wrapped to keep, for each check, every
    step's host µs per call (the Python wall time of issuing it), the rounds it timed and the grad mode it ran in."""
    import attnforge
    from attnforge import ranking
    from attnforge.bench import timing

    qb, kb, vb, qs, ks, vs = grid.inputs(torch, cell, grad=True, dtype=dtype, dev=dev)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    seen: list[dict[str, Any]] = []
    real_paired = timing.paired

    def spy(steps: dict[str, Any], **kw: Any) -> Any:
        host: dict[str, list[float]] = {n: [] for n in steps}

        def timed_host(name: str, step: Any) -> Any:
            def run(i: int) -> object:
                t0 = time.perf_counter()
                out = step(i)
                host[name].append((time.perf_counter() - t0) * 1e6)
                return out
            return run
        res = real_paired({n: timed_host(n, s) for n, s in steps.items()}, **kw)
        seen.append({"grad_enabled": torch.is_grad_enabled(), "batch_ms": kw.get("batch_ms"),
                     "calls": {n: len(h) for n, h in host.items()},
                     "host_us_median": {n: sorted(h)[len(h) // 2] if h else None for n, h in host.items()},
                     "timings": None if res is None else {n: {"median_ms": t.median_ms, "rounds_ms": list(t.rounds_ms)}
                                                          for n, t in res.items()}})
        return res

    saved = (ranking.K, ranking.MIN_MARGIN)
    ranking.K, ranking.MIN_MARGIN = 0.0, 0.0
    timing.paired = spy
    out: dict[str, Any] = {"cell": cell.name, "layouts": {}}
    try:
        for layout, (q, k, v) in (("bhsd", (qb, kb, vb)), ("bshd", (qs, ks, vs))):
            seen.clear()
            step = grid.as_timed(torch, lambda q=q, k=k, v=v, lay=layout: attnforge.attention(
                q, k, v, causal=cell.causal, layout=lay), True)
            step()  # first use: measures the class (in-call), then serves
            sync()
            blocks = []
            for n in (60, 10, 30):  # calls 2-61 (before the check), 62-71 (the check), 72-101 (after)
                t0 = time.perf_counter()
                for _ in range(n):
                    step()
                sync()
                blocks.append((time.perf_counter() - t0) / n * 1e3)
            for t in (q, k, v):
                t.grad = None
            ex = attnforge.explain(q, k, v, causal=cell.causal, layout=layout)
            from attnforge.dispatch import insitu
            from attnforge.dispatch.runtime import get_dispatcher

            pace = {k: [x.busy, x.seen] for k, x in insitu.caller_pace(get_dispatcher()).items()}
            out["layouts"][layout] = {"ms_per_call_before_check_during_after": blocks, "checks": list(seen),
                                      "caller_pace": pace,
                                      "explain": str(ex)[:1500] if ex is not None else None}
            print(f"{cell.name} {layout} live: " + json.dumps({"blocks": [round(b, 4) for b in blocks], "pace": pace,
                  "checks": [{"host": c["host_us_median"], "med": {n: round(t["median_ms"], 4) for n, t in
                              (c["timings"] or {}).items()}} for c in seen]}), flush=True)
    finally:
        ranking.K, ranking.MIN_MARGIN = saved
        timing.paired = real_paired
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default="mha-1k,mha-1k-causal,d64-2k-causal")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the flow at tiny sizes")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--live", action="store_true", help="also the check inside attention()'s live calls (live_cell)")
    args = ap.parse_args()

    import torch

    dtype = getattr(torch, args.dtype) if args.device == "cuda" else torch.float32
    by_name = {c.name: c for c in grid.grid()}
    cells = [by_name[n] if args.device == "cuda" else grid.shrink(by_name[n]) for n in args.cells.split(",") if n]
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    rows: list[dict[str, Any]] = []
    live: list[dict[str, Any]] = []
    for cell in cells:  # the live part first: the dispatcher's first use meets each class fresh
        if args.live:
            live.append(live_cell(torch, cell, dev=args.device, dtype=dtype))
        rows.append(probe_cell(torch, cell, dev=args.device, dtype=dtype))
        with open(args.out, "w") as fh:
            json.dump({"device": device, "torch": torch.__version__, "rows": rows, "live": live}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
