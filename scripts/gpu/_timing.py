"""One timing call for the GPU scripts: :func:`attnforge.bench.timing.measure` (CUDA events, the L2 flushed before
each repetition, interleaved rounds), the harness ``attnforge bench`` and measure-on-first-use use, so both sides
of every comparison are timed alike. On a CPU (dry runs) the same function with perf_counter and small budgets."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any


def measure_ms(torch: Any, fn: Callable[[], Any], *, set_bytes: int = 0,
               flush: int | None = None) -> dict[str, Any]:
    """``fn`` timed: ``{"median_ms", "lo_ms", "hi_ms", "first_call_s", "rounds_ms"}`` (lo/hi: the spread of the
    rounds; rounds_ms: each round's median).
    ``flush``: bytes to overwrite before each repetition instead of what ``set_bytes`` calls for (0: no flush)."""
    from attnforge.bench import timing as t

    config, sync, flush_b = _harness(torch, set_bytes, flush)
    rounds = []
    for _ in range(config.rounds):
        rounds.append(t.measure(lambda _i: fn(), sets=1, config=config, sync=sync, flush_bytes=flush_b))
    return _summary(t.combine_rounds(rounds))


def _harness(torch: Any, set_bytes: int, flush: int | None) -> tuple[Any, Callable[[], None], int]:
    """The timing configuration (CUDA events on a GPU, perf_counter on a CPU), the device sync, and the bytes to
    flush before each repetition (``flush`` as given, else what ``set_bytes`` calls for; none on a CPU)."""
    from attnforge.bench import timing as t

    cuda = torch.cuda.is_available()
    if not cuda:
        return t.CPU_PERF_COUNTER, (lambda: None), 0
    # AF_GRID_ROUNDS: more interleaved rounds for rows whose rounds spread wide (the 2026-11-29 run: 23-51 %)
    config = dataclasses.replace(t.GPU_EVENTS, rounds=int(os.environ.get("AF_GRID_ROUNDS", t.GPU_EVENTS.rounds)))
    return config, torch.cuda.synchronize, t.flush_bytes(set_bytes) if flush is None else flush


def _summary(timing: Any) -> dict[str, Any]:
    """A timing as the scripts' JSON holds it; ``rounds_ms``: each interleaved round's median, in round order (what
    :func:`round_ratios` pairs)."""
    return {"median_ms": timing.median_ms, "lo_ms": timing.lo_ms, "hi_ms": timing.hi_ms,
            "first_call_s": timing.first_call_s, "rounds_ms": list(timing.rounds_ms)}


def measure_many_ms(torch: Any, fns: dict[str, Callable[[], Any]], *, set_bytes: int = 0,
                    after: Callable[[str], None] = lambda _name: None) -> dict[str, dict[str, Any]]:
    """Every ``fns`` entry timed as :func:`measure_ms` times one, in interleaved rounds: each round times every
    entry once (one :func:`attnforge.bench.timing.measure` round), the order rotated round by round, as
    ``attnforge bench`` and first-use measurement order their candidates. Timing each entry's rounds back to back,
    always in one order, biases the later ones: on the H200 (2026-11-28, the tenth session) the grid put
    ``attention()`` last after every backend, and its fwd+bwd rows read 1-4 % under FA3 called directly in every
    run since 2026-11-22 while the profile showed the same kernels and launches. ``after(name)`` runs after each
    of ``name``'s rounds (the grid resets the leaves' ``.grad`` there). An entry that raises leaves the rounds:
    ``{"error": "..."}`` in its place."""
    from attnforge.bench import timing as t

    config, sync, flush = _harness(torch, set_bytes, None)
    names = list(fns)
    rounds: dict[str, list[Any]] = {n: [] for n in names}
    errors: dict[str, str] = {}
    for r in range(config.rounds):
        for name in t.round_order(names, r, config.rounds):
            if name in errors:
                continue
            try:
                rounds[name].append(t.measure(lambda _i, fn=fns[name]: fn(), sets=1, config=config, sync=sync,
                                              flush_bytes=flush))
            except Exception as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"[:300]
            finally:
                after(name)
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        if name in errors:
            out[name] = {"error": errors[name]}
            continue
        out[name] = _summary(t.combine_rounds(rounds[name]))
    return out


def first_call_s(torch: Any, fn: Callable[[], Any]) -> float:
    """Wall seconds of one call, synchronised (a first call: measure-on-first-use, compile, JIT)."""
    import time

    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def wall_ms(torch: Any, fn: Callable[[], Any], *, reps: int = 10, warmup: int = 3) -> float:
    """Median wall time of ``fn()`` in ms after ``warmup`` calls, CUDA synchronised after each call: a model step
    as its user waits for it (host, launches and kernels; no L2 flush), for the models scripts (:func:`paired_ms`
    with one setting and one round)."""
    return paired_ms(torch, fn, {"": lambda: None}, rounds=1, reps=reps, warmup=warmup)[""]


def paired_ms(torch: Any, fn: Callable[[], Any], use: dict[str, Callable[[], Any]], *, rounds: int = 5,
              reps: int = 3, warmup: int = 2, samples: dict[str, list[float]] | None = None) -> dict[str, float]:
    """Median wall ms of ``fn()`` under each setting of ``use`` (name -> a call that switches the model to it),
    the settings interleaved round by round (the order alternating), each call synchronised: a host whose pace
    drifts (an H100 host on 2026-11-28 moved one model's decode figure from 0.75x to 1.09x between two runs
    timed one implementation after the other) shifts both sides alike. ``samples``: filled with every timed
    call's ms per setting, in order (``reps`` a round), for a figure whose spread needs reading."""
    import time

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    times: dict[str, list[float]] = {name: [] for name in use}
    for r, name in interleaved(use, rounds):
        for _ in range(warmup if r == 0 else 1):
            fn()
        sync()
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            sync()
            times[name].append((time.perf_counter() - start) * 1e3)
    if samples is not None:
        samples.update(times)
    return {name: median(t) for name, t in times.items()}


def round_ratios(samples: dict[str, list[float]], *, base: str, new: str, reps: int) -> list[float]:
    """Per interleaved round of :func:`paired_ms` (``reps`` samples each, in order), ``base``'s median over
    ``new``'s: the two sides of a round ran next to each other, so what moved the round (the GPU's clock, the host's
    pace) divides out. Their spread says whether a figure near 1.00 is above or below it: on an H200 (2026-11-30,
    docs/benchmarks.md "twenty-seventh session") Qwen2.5-7B's train step read 0.991 and 1.013 in two runs whose
    steps spread 45-54 ms."""
    a, b = samples.get(base, []), samples.get(new, [])  # none where a side was not sampled
    rounds = min(len(a), len(b)) // max(1, reps)
    return [median(a[r * reps:(r + 1) * reps]) / median(b[r * reps:(r + 1) * reps]) for r in range(rounds)]


def ratio_spread(ratios: list[float]) -> list[float] | None:
    """``[least, median, most]`` of per-round ratios (:func:`round_ratios`), the form the scripts' JSON reports a
    figure's spread in; None without any."""
    return [min(ratios), median(ratios), max(ratios)] if ratios else None


def median(values: list[float]) -> float:
    """The median these scripts report: the upper middle of the sorted values (one of them, never an average)."""
    return sorted(values)[len(values) // 2]


def interleaved(use: dict[str, Callable[[], Any]], rounds: int) -> Iterator[tuple[int, str]]:
    """``(round, name)`` for each setting of ``use`` in each round, the order alternating round by round, with
    the model switched to that setting (``use[name]()``) before each is yielded: the schedule of
    :func:`paired_ms` for timings that read their own clock (a decode step's)."""
    names = list(use)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            use[name]()
            yield r, name


def waited_s(timeout_s: float) -> float:
    """Seconds until the first-use measurements queued so far finished (they may run off the calling thread,
    ``ATTNFORGE_AUTOTUNE=background``), so what is timed next is served by the measured choice; 0 for a tree
    whose measurement runs only in the call."""
    import time

    try:
        from attnforge.dispatch.autotune import background_wait
    except ImportError:
        return 0.0
    start = time.perf_counter()
    background_wait(timeout_s=timeout_s)
    return time.perf_counter() - start
