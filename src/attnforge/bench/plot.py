"""``--plot PNG``: TFLOP/s against sequence length, one line per backend, one panel per shape family.

A panel holds one mode, mask, head dim, GQA ratio and kind (prefill, chunked prefill, decode). Error bars are the
spread of the interleaved rounds; a star marks each length's winner by the one "fastest" rule, labelled with its
margin over the next backend ("tie" when the winner was picked among backends the top does not beat beyond the
noise).

Drawn with matplotlib's object API on an Agg canvas, so the caller's pyplot backend and state are untouched.
"""

from __future__ import annotations

import math
from pathlib import Path

from attnforge.bench.run import BenchReport, BenchRow
from attnforge.errors import UsageError

PANEL_SIZE_IN = (4.2, 3.2)


def check_plot_path(path: Path) -> None:
    """Refuse, before any measurement, a ``--plot`` that :func:`write_plot` could not write: matplotlib missing, or a
    folder that does not exist or cannot be written. ``bench --plot /nonexistent/x.png`` measured for minutes and
    then failed, its table never printed (CLI fuzz, 2026-12-03).

    Raises:
        UsageError: what is wrong, with the fix.
    """
    import importlib.util
    import os

    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib", hint="pip install 'attnforge[plot]'")
    folder = Path(path).absolute().parent
    if not folder.is_dir():
        raise UsageError(f"cannot write the plot to {path}: {folder} is not a directory",
                         hint="give a path in an existing folder, e.g. --plot ./bench.png")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write the plot to {path}: {folder} is not writable",
                         hint="give a path in a folder you can write, e.g. --plot ./bench.png")


def write_plot(report: BenchReport, path: Path) -> Path:
    """Write the report's TFLOP/s curves to ``path`` as a PNG.

    Raises:
        UsageError: matplotlib is not installed, no cell was measured, or ``path`` cannot be written.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError("--plot needs matplotlib", hint="pip install 'attnforge[plot]'") from None
    panels = _panels(report)
    if not panels:
        raise UsageError("nothing to plot: no backend ran on any shape")
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(PANEL_SIZE_IN[0] * cols, PANEL_SIZE_IN[1] * rows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    backends = [b.name for b in report.backends]
    colours = {name: f"C{i % 10}" for i, name in enumerate(backends)}
    winners = _winners(report)
    for ax, (title, lines) in zip(axes.flat, panels.items(), strict=False):
        for name in backends:
            points = sorted(lines.get(name, []))
            if not points:
                continue
            style = "--" if name == report.baseline else "-"
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            yerr = [[p[1] - p[2] for p in points], [p[3] - p[1] for p in points]]
            ax.errorbar(xs, ys, yerr=yerr, fmt=style, marker="o", markersize=3, capsize=2, color=colours[name],
                        label=name)
        for x, (name, y, label) in winners.get(title, {}).items():
            ax.plot([x], [y], marker="*", markersize=11, color=colours.get(name, "k"), linestyle="none")
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=6)
        ax.set_xscale("log", base=2)
        ticks = sorted({p[0] for points in lines.values() for p in points})
        ax.set_xticks(ticks, [_seqlen_label(t) for t in ticks])
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s")
        ax.grid(visible=True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    dev = report.device
    fig.suptitle(f"attention TFLOP/s on {dev.name} (torch {dev.torch_version})", fontsize=10)
    try:
        fig.savefig(path, format="png", dpi=110)
    except OSError as exc:
        raise UsageError(f"cannot write the plot to {path}", cause=exc.strerror) from None
    return path


def _title(row: BenchRow) -> str:
    s, cls = row.shape, row.shape.shape_class
    gqa = f", GQA {cls.gqa_ratio}" if cls.gqa_ratio > 1 else ""
    return (f"{s.mode.value}, {'causal' if s.causal else 'non-causal'}, head dim {s.head_dim}{gqa}, {cls.kind}, "
            f"{s.dtype}")


def _panels(report: BenchReport) -> dict[str, dict[str, list[tuple[int, float, float, float]]]]:
    """title -> backend -> [(seqlen, TFLOP/s, slowest round, fastest round)], panels ordered as the rows are."""
    panels: dict[str, dict[str, list[tuple[int, float, float, float]]]] = {}
    for row in report.rows:
        s = row.shape
        for cell in row.cells:
            m = cell.measurement(row.flops)
            if m is not None:
                panels.setdefault(_title(row), {}).setdefault(cell.backend, []).append(
                    (max(s.seqlen_q, s.seqlen_k), m.tflops, m.tflops_lo, m.tflops_hi))
    return panels


def _winners(report: BenchReport) -> dict[str, dict[int, tuple[str, float, str]]]:
    """title -> seqlen -> (winner, its TFLOP/s, "+3.1%" or "tie")."""
    out: dict[str, dict[int, tuple[str, float, str]]] = {}
    for row in report.rows:
        ranking = row.ranking
        if ranking.winner is None:
            continue
        if len(ranking.tied) > 1:
            label = "tie"
        else:
            label = f"{ranking.margin:+.1%}" if ranking.margin is not None else ""
        x = max(row.shape.seqlen_q, row.shape.seqlen_k)
        out.setdefault(_title(row), {})[x] = (ranking.winner, ranking.measurements[ranking.winner].tflops, label)
    return out


def _seqlen_label(seqlen: int) -> str:
    """``512``, ``1k``, ``16k``."""
    return f"{seqlen // 1024}k" if seqlen >= 1024 and seqlen % 1024 == 0 else str(seqlen)
