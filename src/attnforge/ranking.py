"""The one rule for "which backend is fastest": used by the dispatcher, bench's "best" column and doctor.

Per backend, a *measurement* is its median TFLOP/s over repeated interleaved rounds, the slowest and fastest
round, and its *noise*: the median absolute deviation (MAD) of the rounds' medians relative to their median
(:attr:`attnforge.bench.timing.Timing.mad_ms`; measure-on-first-use and the in-situ check take out the drift common
to a round's candidates first: :func:`attnforge.bench.timing.without_common_drift`). The rule (:func:`rank`,
docs/dispatch-policy.md):

1. The *top* is the backend with the highest median.
2. ``a`` *beats* ``b`` (:func:`beats`) when ``a``'s median is faster than ``b``'s by more than the margin
   ``max(MIN_MARGIN, K * sqrt(noise_a**2 + noise_b**2))`` (:func:`tie_margin`; each noise weighed by
   :func:`rounds_factor` of its round count, 1 up to three rounds, so that more rounds can settle a tie), or by more
   than ``MIN_MARGIN`` with their rounds apart (:func:`apart`: ``a``'s slowest round faster than ``b``'s fastest
   by more than ``max(MIN_MARGIN, K * the smaller noise)``), so that one candidate's wandering rounds cannot hide
   another's steady lead. Every backend the top does not beat is *tied* with it: the measurements cannot tell them
   apart.
3. Among the tied ones the lowest-overhead path wins (:func:`overhead_tier`): plain SDPA (``"sdpa"``, no kernel
   forced) before a forced SDPA kernel (``"sdpa-*"``), before everything else (external kernels, FlexAttention);
   then the higher median. So on a CPU, or wherever measurements are noise, plain SDPA stays unless a candidate
   is faster beyond the noise (issues 16, 17 and 22).

The MAD, unlike the slowest-to-fastest range the rule used before, is not moved by one slow round of three: on an
H100 (issue 22, 16k causal fwd+bwd) FA3/FA4 medians were 12-13 % faster than SDPA's, yet one slow round made
the ranges overlap and SDPA was chosen; the margin keeps the 12 % and still sends a 1 % lead to SDPA.

Matching is by exact shape class (:class:`attnforge.types.shapes.ShapeClass`). A class that was never measured
has no ranking of its own; evidence transfers to it only by interpolation (:func:`bracketing`): the nearest
measured classes of the same family (all but the length buckets equal, the same ``Sk``/``Sq`` ratio, or both
decode) on either side of its length. The caller (:func:`attnforge.dispatch.policy.decide`) lets a backend lead
an unmeasured class only when it beat plain SDPA in both of them; otherwise plain SDPA leads (issue 16: "never
slower than doing nothing"). Lengths outside the measured range are never extrapolated: the winner at 4k says
nothing about 1k (on the H200, FlashAttention-4 wins causal 4k and runs at 0.45x the best at causal 1k).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from attnforge.records import SUPERSEDED_WITHIN, BenchRecord
from attnforge.types.shapes import ShapeClass

#: the SDPA fallback's id: torch's own dispatch, no kernel forced
PLAIN_SDPA = "sdpa"
#: the smallest lead (relative, of the medians) that beats: a tie or a kernel < 2 % faster stays on the
#: lower-overhead path, whose per-call overhead a microbenchmark of the kernel alone does not see (issue 22)
MIN_MARGIN = 0.02
#: how many combined noise figures (MADs) a lead must exceed: three, so one slow round of three never decides
K = 3.0
#: a median's standard error over ``n`` rounds is about ``SE_PER_MAD / sqrt(n)`` times the rounds' MAD: for normal
#: noise the MAD is ``sigma / 1.4826`` (its consistency factor) and the median of ``n`` draws has the asymptotic
#: standard error ``sqrt(pi / 2) * sigma / sqrt(n)`` = ``1.2533 * sigma / sqrt(n)`` (standard results of robust
#: statistics, e.g. Huber and Ronchetti, *Robust Statistics*, 2nd ed., 2009)
SE_PER_MAD = 1.4826 * 1.2533


def overhead_tier(backend: str) -> int:
    """0 for plain SDPA, 1 for a forced SDPA kernel (``sdpa-*``), 2 for any other backend."""
    if backend == PLAIN_SDPA:
        return 0
    return 1 if backend.startswith(PLAIN_SDPA + "-") else 2


@dataclass(frozen=True, slots=True)
class OutputError:
    """A quantized backend's output error against the float32 reference (:func:`attnforge.bench.accuracy.output_error`),
    measured as a pair or not at all.

    Attributes:
        rel_l1: ``sum|out - ref| / sum|ref|`` over the compared (batch, head) slices.
        cosine: cosine similarity of the same slices, flattened.
    """

    rel_l1: float
    cosine: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """One backend on one shape class.

    Attributes:
        tflops: the median (mean over the class's measured shapes).
        tflops_lo, tflops_hi: the slowest and fastest round (equal to ``tflops`` without rounds).
        noise: the rounds' MAD relative to their median (0.01 = 1 %); for records without a stored MAD, half their
            relative spread ``(hi - lo) / (2 * median)`` (:func:`class_measurements`).
        error: the output error where it was measured (quantized backends), else None.
        rounds: how many interleaved rounds the median and the noise were taken over (the fewest of the class's
            records), None where that was not recorded (records from before it was stored): the margin then reads
            the noise as it did before (:func:`rounds_factor`).
    """

    backend: str
    tflops: float
    tflops_lo: float
    tflops_hi: float
    noise: float
    error: OutputError | None = None
    rounds: int | None = None


def contested(ranking: Ranking) -> bool:
    """Whether the tie rule (step 3) handed the win to a lower-overhead path whose median trails the top's by more
    than :data:`MIN_MARGIN`: the measurements could not tell a lead of that size from their noise, and more rounds
    may (the warm-up times such a class again: :attr:`attnforge.dispatch.autotune.AutotuneConfig.contested_rounds`).
    On an H200 (2026-11-30, docs/benchmarks.md "thirtieth session") five rounds of the warm-up tied plain SDPA
    (rounds 551-647 TFLOP/s, noise 6.1 %) with FlashAttention-3 (648, noise 0.8 %) on the 8k-bucket forward of
    Flux's attention, and the grid then timed SDPA at 0.93x FA3; fifteen rounds chose FA3 (0.99x the best)."""
    if ranking.winner is None:
        return False
    winner = ranking.measurements[ranking.winner]
    top = max(ranking.measurements.values(), key=lambda m: m.tflops)
    return top.tflops > winner.tflops * (1.0 + MIN_MARGIN)


def tie_margin(a: Measurement, b: Measurement) -> float:
    """The relative lead of one median over the other that the noise of both can explain:
    ``max(MIN_MARGIN, K * sqrt((a.noise * f_a)**2 + (b.noise * f_b)**2))`` (0.02 <= result), ``f`` the
    :func:`rounds_factor` of each one's rounds: 1 up to three rounds (the rule as it was tuned), narrower as rounds
    accumulate, so that the further rounds of a contested class can settle it."""
    return max(MIN_MARGIN, K * math.hypot(a.noise * rounds_factor(a.rounds), b.noise * rounds_factor(b.rounds)))


def rounds_factor(rounds: int | None) -> float:
    """What a noise figure (the rounds' MAD) counts for in :func:`tie_margin` when the median was taken over
    ``rounds`` rounds: ``min(1, SE_PER_MAD / sqrt(rounds))``, the median's standard error per MAD, never above 1 (so
    three rounds or fewer, and records that did not store their rounds, weigh the MAD as the rule always did): 0.83
    at five rounds (measure-on-first-use), 0.48 at fifteen (a contested class after its ten further rounds).

    Without it more rounds could not settle a tie, since the MAD does not shrink with them: on an H200 (2026-12-02,
    docs/benchmarks.md "thirty-eighth session") the warm-up timed the 16k forward's ``[B, S, H, D]`` class with
    FlashAttention-3 at 682.9 TFLOP/s against plain SDPA's 643.4 (+6.1 %, noise 1.6 % each), a margin of 6.8 %
    after fifteen rounds as after five; the class went to SDPA and the grid timed it at 0.934x FA3."""
    if rounds is None or rounds < 1:
        return 1.0
    return min(1.0, SE_PER_MAD / math.sqrt(rounds))


def beats(a: Measurement, b: Measurement) -> bool:
    """Whether ``a`` is faster than ``b`` beyond the noise: its median TFLOP/s exceeds ``b``'s by more than
    :func:`tie_margin`, or by more than :data:`MIN_MARGIN` with every round of ``a`` faster than every round of
    ``b`` (:func:`apart`). Never true both ways, and never true of a measurement against itself."""
    if a.tflops <= b.tflops * (1.0 + MIN_MARGIN):
        return False
    return a.tflops > b.tflops * (1.0 + tie_margin(a, b)) or apart(a, b)


def apart(a: Measurement, b: Measurement) -> bool:
    """Whether ``a``'s slowest round is faster than ``b``'s fastest by more than ``max(MIN_MARGIN, K * the
    steadier one's noise)``: the rounds do not overlap, so no pairing of them puts ``b`` ahead.

    The MAD margin of :func:`tie_margin` weighs both candidates' noise, so one backend whose rounds wander hides
    another's steady lead: on an H200 (2026-11-30, docs/benchmarks.md "twenty-eighth session") the warm-up timed
    the 16k causal forward's class on ``[B, H, S, D]`` tensors with plain SDPA at 594 TFLOP/s (rounds 524-635,
    noise 7.1 %: a 21 % margin) and FlashAttention-3 steady near 700 (708 on ``[B, S, H, D]``, rounds 702-737); the
    tie sent the class to SDPA, which the grid then timed at 0.855x FA3. Records with no rounds (``tflops_lo ==
    tflops_hi == tflops``) are apart exactly when the medians are, so the rule adds nothing for them."""
    gap = max(MIN_MARGIN, K * min(a.noise, b.noise))
    return a.tflops_lo > b.tflops_hi * (1.0 + gap)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ranking:
    """The outcome of :func:`rank`.

    Attributes:
        order: every measured backend, the winner first, then by median TFLOP/s.
        tied: the backends the top does not beat (:func:`beats`; the top and the winner among them), empty when
            nothing was measured.
        margin: the winner's median over the best other median, minus 1 (negative when a tie went to a
            lower-overhead path); None with a single candidate.
        measurements: per backend.
    """

    order: tuple[str, ...]
    tied: tuple[str, ...]
    margin: float | None
    measurements: Mapping[str, Measurement]

    @property
    def winner(self) -> str | None:
        return self.order[0] if self.order else None

    def basis(self, backend: str) -> str:
        """Why ``backend`` stands where it does, for people."""
        m = self.measurements[backend]
        text = f"{m.tflops:.4g} TFLOP/s measured for this shape class ({_spread(m)})"
        if backend == self.winner and len(self.tied) > 1:
            # each tied one's own figures: a tie names what the margin swallowed (a steady lead or wandering rounds)
            others = ", ".join(f"{n} ({self.measurements[n].tflops:.4g} TFLOP/s, {_spread(self.measurements[n])})"
                               for n in self.tied if n != backend)
            text += f"; tied with {others}: no lead beyond the noise margin, the lower-overhead path wins"
        return text


def _spread(m: Measurement) -> str:
    """A measurement's slowest and fastest round and its noise, as :meth:`Ranking.basis` words them, with the round
    count where it is known (the margin narrows as rounds accumulate: :func:`rounds_factor`)."""
    count = f"{m.rounds} " if m.rounds is not None else ""
    return f"{count}rounds {m.tflops_lo:.4g}-{m.tflops_hi:.4g}, noise {m.noise:.1%}"


def rank(measurements: Iterable[Measurement]) -> Ranking:
    """Apply the rule of the module docstring."""
    by_name = {m.backend: m for m in measurements if m.tflops > 0}
    if not by_name:
        return Ranking(order=(), tied=(), margin=None, measurements={})
    top = max(by_name.values(), key=lambda m: (m.tflops, -overhead_tier(m.backend), m.backend))
    tied = [m for m in by_name.values() if not beats(top, m)]
    winner = min(tied, key=lambda m: (overhead_tier(m.backend), -m.tflops, m.backend))
    rest = sorted((m for m in by_name.values() if m is not winner),
                  key=lambda m: (-m.tflops, overhead_tier(m.backend), m.backend))
    margin = winner.tflops / rest[0].tflops - 1.0 if rest and rest[0].tflops > 0 else None
    tied_names = sorted((m.backend for m in tied), key=lambda n: (n != winner.backend, n))
    return Ranking(order=(winner.backend, *(m.backend for m in rest)), tied=tuple(tied_names), margin=margin,
                   measurements=by_name)


#: the ``run_id`` prefix of the in-situ check's records (:mod:`attnforge.dispatch.insitu`): timings of the route and
#: of SDPA on a live call, which supersede everything measured of the class before them (:func:`class_measurements`)
LIVE_RUN_PREFIX = "insitu-"


def latest(records: Iterable[BenchRecord]) -> list[BenchRecord]:
    """The newest record per (backend, exact shape): records come oldest first, later runs override."""
    newest: dict[tuple[object, ...], BenchRecord] = {}
    for r in records:
        key = (r.backend, *_shape_key(r))
        newest.pop(key, None)
        newest[key] = r
    return list(newest.values())


#: a record's exact shape and memory layout as a plain tuple (cheap to build and hash, unlike its
#: :attr:`BenchRecord.shape`): the two layouts of one shape are two measurements, neither supersedes the other
_shape_key: Callable[[BenchRecord], tuple[object, ...]] = operator.attrgetter(*SUPERSEDED_WITHIN)


def class_measurements(records: Iterable[BenchRecord], shape_class: ShapeClass,
                       among: Collection[str] | None = None, quantized: Collection[str] = ()) -> dict[str, Measurement]:
    """Per backend, the mean over the newest records of ``shape_class`` (TFLOP/s, so batch and heads compare).

    A live check's records (``run_id`` :data:`LIVE_RUN_PREFIX`) supersede the older records of the class, at whatever
    length they were taken, of the backends on the checked route's side: the exact backends when it timed an exact
    route against SDPA, the quantized ones (and SDPA) when it timed a quantized route. A backend of that side it did
    not time is unmeasured again, not compared across lengths. The other side's records stand: an exact route's
    revert says nothing about a quantized kernel, which only ``allow_quantized`` calls may take and whose own class
    key is checked apart. (Until 2026-12-02 a revert superseded every backend: on an H200, docs/benchmarks.md
    "thirty-ninth session", the 16k forward's FlashAttention-3 revert left SageAttention, timed 13 % faster than
    SDPA at first use, unmeasured, and the ``allow_quantized`` calls ran SDPA at 0.97x of it.)

    Args:
        records: as :meth:`attnforge.records.RecordStore.bench_records` returns them (oldest first).
        shape_class: the call's class.
        among: only these backends (e.g. the verified ones); None for all.
        quantized: the backends whose kernels quantize Q/K/V (:func:`attnforge.dispatch.policy.quantizes`).
    """
    pool = [r for r in latest(records)  # newest last
            if r.tflops > 0 and (among is None or r.backend in among) and r.shape.shape_class == shape_class]
    timed: dict[str, set[str]] = {}  # per live run, the backends it timed
    for r in pool:
        if r.run_id.startswith(LIVE_RUN_PREFIX):
            timed.setdefault(r.run_id, set()).add(r.backend)
    per: dict[str, list[BenchRecord]] = {}
    live = None
    for r in pool:
        if r.run_id.startswith(LIVE_RUN_PREFIX) and r.run_id != live:
            names = timed[r.run_id]
            side = any(n in quantized for n in names)
            for name in [n for n in per if n in names or (n in quantized) == side]:
                del per[name]
            live = r.run_id
        per.setdefault(r.backend, []).append(r)
    return {name: _mean(name, recs) for name, recs in per.items()}


def fastest(records: Iterable[BenchRecord], shape_class: ShapeClass,
            among: Collection[str] | None = None) -> Ranking:
    """:func:`rank` of :func:`class_measurements`: the one answer to "which backend is fastest here?"."""
    return rank(class_measurements(records, shape_class, among).values())


def wins_per_backend(records: Iterable[BenchRecord], among: Collection[str] | None = None,
                     mode: str | None = "fwd") -> dict[str, list[Ranking]]:
    """For every measured shape class (of ``mode``; None for all), the ranking, grouped by its winner."""
    pool = [r for r in latest(records) if mode is None or r.mode == mode]
    classes = {r.shape.shape_class for r in pool}
    out: dict[str, list[Ranking]] = {}
    for cls in sorted(classes, key=str):
        ranking = fastest(pool, cls, among)
        if ranking.winner is not None:
            out.setdefault(ranking.winner, []).append(ranking)
    return out


def family_of(shape_class: ShapeClass) -> tuple[ShapeClass, int]:
    """The classes one class interpolates between: equal but for the length buckets, with the same ``Sk/Sq``
    ratio (decode, ``Sq = 1``, is a family of its own whatever ``Sk``)."""
    sq, sk = shape_class.seqlen_q_bucket, shape_class.seqlen_k_bucket
    ratio = 0 if sq == 1 else (sk // sq if sk >= sq else -(sq // sk))
    return replace(shape_class, seqlen_q_bucket=1, seqlen_k_bucket=1), ratio


def by_family(records: Iterable[BenchRecord]) -> dict[tuple[ShapeClass, int], list[BenchRecord]]:
    """``records`` grouped by their class's family (:func:`family_of`), each group in the records' order. A class's
    group holds every record :func:`class_measurements` and :func:`bracketing` read for that class, so they give the
    same answers on it as on all the records, without turning each record into its class again: on a CPU host a
    decision over 4608 records took 47 ms that way, most of it in ``BenchRecord.shape.shape_class``."""
    out: dict[tuple[ShapeClass, int], list[BenchRecord]] = {}
    families: dict[tuple[object, ...], tuple[ShapeClass, int]] = {}  # per exact shape: runs and backends repeat it
    for r in records:
        shape = _shape_key(r)
        family = families.get(shape)
        if family is None:
            family = families[shape] = family_of(r.shape.shape_class)
        out.setdefault(family, []).append(r)
    return out


def bracketing(records: Iterable[BenchRecord], shape_class: ShapeClass) -> tuple[Bracket, Bracket] | None:
    """The nearest measured classes of ``shape_class``'s family below and above its key length, with their
    measurements; None when it lies outside the measured range (or was measured itself)."""
    family = family_of(shape_class)
    pool = [r for r in latest(records) if r.tflops > 0 and family_of(r.shape.shape_class) == family]
    measured = {r.shape.shape_class for r in pool} - {shape_class}
    target = shape_class.seqlen_k_bucket
    below = max((c for c in measured if c.seqlen_k_bucket < target), key=lambda c: c.seqlen_k_bucket, default=None)
    above = min((c for c in measured if c.seqlen_k_bucket > target), key=lambda c: c.seqlen_k_bucket, default=None)
    if below is None or above is None:
        return None
    return (Bracket(shape_class=below, measurements=class_measurements(pool, below)),
            Bracket(shape_class=above, measurements=class_measurements(pool, above)))


@dataclass(frozen=True, slots=True, kw_only=True)
class Bracket:
    """A measured class next to an unmeasured one (:func:`bracketing`), and its measurements per backend."""

    shape_class: ShapeClass
    measurements: Mapping[str, Measurement]


class Evidence(dict[str, Measurement]):
    """What the records say about one shape class: a measurement per backend, and, when the class itself was
    not measured, the measured classes that bracket it (:func:`bracketing`); ``layout``: the memory layout the
    measurements were taken in, when they were all taken in one (:func:`attnforge.dispatch.policy.measurements`)."""

    bracket: tuple[Bracket, Bracket] | None = None
    layout: str | None = None


def _mean(name: str, recs: list[BenchRecord]) -> Measurement:
    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    # TFLOP/s of a round = tflops * median_ms / round_ms: the slowest round (ms_hi) gives the low end
    lo = [r.tflops * r.ms / r.ms_hi if r.ms_hi else r.tflops for r in recs]
    hi = [r.tflops * r.ms / r.ms_lo if r.ms_lo else r.tflops for r in recs]
    # relative noise per record: its stored MAD, or (older records) half its relative TFLOP/s spread
    noise = [r.ms_mad / r.ms if r.ms_mad is not None and r.ms > 0 else (h - lo_) / (2 * r.tflops)
             for r, lo_, h in zip(recs, lo, hi, strict=True)]
    errors = [OutputError(r.rel_l1, r.cosine) for r in recs if r.rel_l1 is not None and r.cosine is not None]
    # the worst of the class's shapes: the largest relative L1, the smallest cosine
    error = OutputError(max(e.rel_l1 for e in errors), min(e.cosine for e in errors)) if errors else None
    # the fewest rounds of the class's shapes, or None where a record did not store them: the wider margin
    counts = [r.rounds for r in recs if r.rounds is not None]
    rounds = min(counts) if len(counts) == len(recs) else None
    return Measurement(backend=name, tflops=mean([r.tflops for r in recs]), tflops_lo=mean(lo), tflops_hi=mean(hi),
                       noise=mean(noise), error=error, rounds=rounds)
