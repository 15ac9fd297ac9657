"""The one rule for "which backend is fastest": used by the dispatcher, bench's "best" column and doctor.

Per backend, a *measurement* is its median TFLOP/s and the spread of repeated interleaved rounds (the TFLOP/s
of its slowest and of its fastest round). The rule (:func:`rank`):

1. The *top* is the backend with the highest median.
2. Every backend whose fastest round reaches the top's slowest round is *tied* with it: the measurements cannot
   tell them apart.
3. Among the tied ones the lowest-overhead path wins (:func:`overhead_tier`): plain SDPA (``"sdpa"``, no kernel
   forced) before a forced SDPA kernel (``"sdpa-*"``), before everything else (external kernels, FlexAttention);
   then the higher median. So on a CPU, or wherever measurements are noise, plain SDPA stays unless a candidate
   is faster beyond the spread (issues 16 and 17).

Matching is by exact shape class (:class:`attnforge.types.shapes.ShapeClass`): a class that was never measured
has no ranking, and the caller falls back to its own order (catalog priority, measure-on-first-use). One piece of
evidence does transfer, and only towards doing nothing: a backend that was measured next to plain SDPA and was
never faster beyond the spread there (:func:`never_beat_plain_sdpa`) is not preferred to SDPA where it is
unmeasured (issue 16: "never slower than doing nothing").
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from attnforge.records import BenchRecord
from attnforge.types.shapes import ShapeClass

#: the SDPA fallback's id: torch's own dispatch, no kernel forced
PLAIN_SDPA = "sdpa"


def overhead_tier(backend: str) -> int:
    """0 for plain SDPA, 1 for a forced SDPA kernel (``sdpa-*``), 2 for any other backend."""
    if backend == PLAIN_SDPA:
        return 0
    return 1 if backend.startswith(PLAIN_SDPA + "-") else 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """One backend on one shape class.

    Attributes:
        tflops: the median (mean over the class's measured shapes).
        tflops_lo, tflops_hi: the slowest and fastest round (equal to ``tflops`` without rounds).
        rel_l1, cosine: output error against the float32 reference, where it was measured (quantized backends).
    """

    backend: str
    tflops: float
    tflops_lo: float
    tflops_hi: float
    rel_l1: float | None = None
    cosine: float | None = None

    @property
    def spread(self) -> float:
        """``(hi - lo) / median``: the relative width of the rounds."""
        return (self.tflops_hi - self.tflops_lo) / self.tflops if self.tflops > 0 else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Ranking:
    """The outcome of :func:`rank`.

    Attributes:
        order: every measured backend, the winner first, then by median TFLOP/s.
        tied: the backends within the top's spread (the winner among them), empty when nothing was measured.
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
        text = f"{m.tflops:.4g} TFLOP/s measured for this shape class (rounds {m.tflops_lo:.4g}-{m.tflops_hi:.4g})"
        if backend == self.winner and len(self.tied) > 1:
            others = ", ".join(n for n in self.tied if n != backend)
            text += f"; tied with {others} within the spread, the lower-overhead path wins"
        return text


def rank(measurements: Iterable[Measurement]) -> Ranking:
    """Apply the rule of the module docstring."""
    by_name = {m.backend: m for m in measurements if m.tflops > 0}
    if not by_name:
        return Ranking(order=(), tied=(), margin=None, measurements={})
    top = max(by_name.values(), key=lambda m: (m.tflops, -overhead_tier(m.backend), m.backend))
    tied = [m for m in by_name.values() if m.tflops_hi >= top.tflops_lo]
    winner = min(tied, key=lambda m: (overhead_tier(m.backend), -m.tflops, m.backend))
    rest = sorted((m for m in by_name.values() if m is not winner),
                  key=lambda m: (-m.tflops, overhead_tier(m.backend), m.backend))
    margin = winner.tflops / rest[0].tflops - 1.0 if rest and rest[0].tflops > 0 else None
    tied_names = sorted((m.backend for m in tied), key=lambda n: (n != winner.backend, n))
    return Ranking(order=(winner.backend, *(m.backend for m in rest)), tied=tuple(tied_names), margin=margin,
                   measurements=by_name)


def latest(records: Iterable[BenchRecord]) -> list[BenchRecord]:
    """The newest record per (backend, exact shape): records come oldest first, later runs override."""
    newest: dict[tuple[object, ...], BenchRecord] = {}
    for r in records:
        key = (r.backend, r.dtype, r.mode, r.causal, r.batch, r.heads, r.kv_heads, r.head_dim, r.head_dim_v,
               r.seqlen_q, r.seqlen_k, r.features)
        newest.pop(key, None)
        newest[key] = r
    return list(newest.values())


def class_measurements(records: Iterable[BenchRecord], shape_class: ShapeClass,
                       among: Collection[str] | None = None) -> dict[str, Measurement]:
    """Per backend, the mean over the newest records of ``shape_class`` (TFLOP/s, so batch and heads compare).

    Args:
        records: as :meth:`attnforge.records.RecordStore.bench_records` returns them (oldest first).
        shape_class: the call's class.
        among: only these backends (e.g. the verified ones); None for all.
    """
    per: dict[str, list[BenchRecord]] = {}
    for r in latest(records):
        if r.tflops > 0 and (among is None or r.backend in among) and r.shape.shape_class == shape_class:
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


def never_beat_plain_sdpa(records: Iterable[BenchRecord]) -> frozenset[str]:
    """Backends measured in a shape class together with plain SDPA, and in none of those classes faster than it
    beyond the spread."""
    per_class: dict[ShapeClass, dict[str, list[BenchRecord]]] = {}
    for r in latest(records):
        if r.tflops > 0:
            per_class.setdefault(r.shape.shape_class, {}).setdefault(r.backend, []).append(r)
    seen: set[str] = set()
    won: set[str] = set()
    for backends in per_class.values():
        if PLAIN_SDPA not in backends:
            continue
        sdpa = _mean(PLAIN_SDPA, backends[PLAIN_SDPA])
        for name, recs in backends.items():
            if name != PLAIN_SDPA:
                seen.add(name)
                if _mean(name, recs).tflops_lo > sdpa.tflops_hi:
                    won.add(name)
    return frozenset(seen - won)


class Evidence(dict[str, Measurement]):
    """What the records say about one shape class: a measurement per backend, and the backends that never beat
    plain SDPA anywhere they were measured with it (``demoted``)."""

    demoted: frozenset[str] = frozenset()


def _mean(name: str, recs: list[BenchRecord]) -> Measurement:
    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    # TFLOP/s of a round = tflops * median_ms / round_ms: the slowest round (ms_hi) gives the low end
    lo = [r.tflops * r.ms / r.ms_hi if r.ms_hi else r.tflops for r in recs]
    hi = [r.tflops * r.ms / r.ms_lo if r.ms_lo else r.tflops for r in recs]
    errors = [r for r in recs if r.rel_l1 is not None and r.cosine is not None]
    return Measurement(backend=name, tflops=mean([r.tflops for r in recs]), tflops_lo=mean(lo), tflops_hi=mean(hi),
                       rel_l1=max((r.rel_l1 or 0.0) for r in errors) if errors else None,
                       cosine=min((r.cosine or 0.0) for r in errors) if errors else None)
