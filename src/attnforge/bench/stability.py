"""Is a bench cell steady enough to store? The baseline as a load gauge, and the bounds on noise and drift.

Each backend is timed in its own child, one child after another (:mod:`attnforge.bench.isolated`), so the
interleaved rounds inside a child cannot see the load change between children: on a loaded CPU, sdpa-math was
stored "67x faster" than sdpa with 3.5 % noise where a quiet re-run measured sdpa 3x faster (issue 31, item 10).
Every backend's child therefore also times the baseline (SDPA, no kernel forced) in the same interleaved rounds:

* the cell's ratio to the baseline comes from that same-child pair, which one load hits alike;
* the pair's baseline against the baseline's own child (the reference stored first) gauges the load: beyond
  :data:`MAX_BASELINE_DRIFT` the machine changed between the children, and the backend is measured once more;
* a cell whose rounds spread beyond :data:`MAX_ROUND_NOISE`, or still drifted after the re-measure, is
  :attr:`~attnforge.bench.run.CellStatus.NOISY`: shown with the reason, never stored for the dispatcher.
"""

from __future__ import annotations

import dataclasses

from attnforge.bench.run import BenchCell, CellStatus
from attnforge.ranking import K

#: Largest noise (MAD of the rounds' medians over their median) of a stored cell. The "fastest" rule already ties
#: leads below 3x the combined noise (:func:`attnforge.ranking.beats`, which reads the stored noise too): past
#: 50 % a record could only ever tie, so it is shown and dropped rather than stored as clutter. (25 % refused
#: tiny CPU cells of a loaded 2-core test machine now and then; 50 % never did.)
MAX_ROUND_NOISE = 0.5
#: Largest change of the baseline's time between its own child and a backend's child (0.5: a factor of 1.5 either
#: way). Child-to-child spread on a quiet machine stays within a few percent; the loaded runs of issue 31 moved
#: it 3x to 20x. The bound is wide on purpose: a drift is measured again before a cell is refused.
MAX_BASELINE_DRIFT = 0.5
#: ``attnforge bench --max-noise``'s default: the one number that sets both bounds above.
DEFAULT_MAX_NOISE = 0.5


def noise(cell: BenchCell | None) -> float:
    """The cell's rounds' relative MAD (:attr:`BenchCell.noise`; 0.0 without a cell)."""
    return cell.noise if cell is not None else 0.0


def drift(paired: BenchCell | None, reference: BenchCell | None) -> float | None:
    """The baseline's time in a backend's child over its time in its own child (1.0: the same load); None when
    either did not run."""
    if paired is None or reference is None or paired.status is not CellStatus.OK or reference.status is not \
            CellStatus.OK or not paired.ms or not reference.ms:
        return None
    return paired.ms / reference.ms


def drifted(paired: BenchCell | None, reference: BenchCell | None, *, bound: float = MAX_BASELINE_DRIFT) -> bool:
    """The load changed between the two children beyond ``bound``, or beyond K (3) times the pair's combined
    noise (:mod:`attnforge.ranking`'s lead rule), whichever is wider."""
    moved = drift(paired, reference)
    if moved is None:
        return False
    allowed = 1.0 + max(bound, K * (noise(paired) + noise(reference)))
    return moved > allowed or moved < 1.0 / allowed


def judged(cell: BenchCell, *, paired: BenchCell | None, reference: BenchCell | None, baseline: str,
           max_noise: float = MAX_ROUND_NOISE, max_drift: float = MAX_BASELINE_DRIFT) -> BenchCell:
    """``cell`` with its ratio from the same-child baseline (``paired``; else ``reference``), or NOISY with the
    reason when its rounds spread beyond ``max_noise`` or the load moved beyond ``max_drift``."""
    if cell.status is not CellStatus.OK:
        return cell
    if noise(cell) > max_noise:
        return dataclasses.replace(cell, status=CellStatus.NOISY, detail=(
            f"not stored: its rounds spread ±{noise(cell):.0%}, beyond the {max_noise:.0%} bound; re-run "
            "`attnforge bench` on a quiet machine"))
    if drifted(paired, reference, bound=max_drift) and paired is not None and reference is not None:
        return dataclasses.replace(cell, status=CellStatus.NOISY, detail=(
            f"not stored: the load changed between children ({baseline} took {paired.ms:.3g} ms beside it and "
            f"{reference.ms:.3g} ms in its own child, {drift(paired, reference) or 0:.2f}x, beyond the "
            f"{1 + max_drift:g}x bound, also when measured again); re-run `attnforge bench` on a quiet machine"))
    base = paired if paired is not None and paired.status is CellStatus.OK else reference
    return cell.with_ratio(base.ms if base is not None and base.status is CellStatus.OK else None)
