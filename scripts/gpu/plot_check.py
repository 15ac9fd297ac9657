#!/usr/bin/env python3
"""Plot the dispatch check (``grid_check.py``'s JSON): per cell and mode, ``attention()`` over the best backend
called directly and over plain SDPA, bhsd and bshd inputs, with the 0.97x target line.

Usage (development machine; matplotlib)::

    python3 scripts/gpu/plot_check.py docs/data/h100_2026-11-25-rerun/check-no-bench.json \\
        docs/data/h100_2026-11-25-rerun/check-no-bench-16k-wan.json --out docs/data/h100_2026-11-25-rerun/check.png

A cell measured in more than one file keeps its first measurement.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def rows_of(paths: list[Path]) -> list[dict[str, Any]]:
    seen: set[tuple[str, str]] = set()
    rows = []
    for path in paths:
        for row in json.loads(path.read_text())["rows"]:
            key = (row["cell"], row["mode"])
            if key not in seen and row.get("ratio_to_best") is not None:
                seen.add(key)
                rows.append(row)
    return rows


def plot(rows: list[dict[str, Any]], out: Path, title: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels = [f"{r['cell']} {r['mode']}" for r in rows]
    series = (("attnforge / best (bhsd)", "ratio_to_best"), ("attnforge / best (bshd)", "ratio_bshd_to_best"),
              ("attnforge / SDPA", "ratio_to_sdpa"))
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    width = 0.27
    for i, (name, key) in enumerate(series):
        xs = [j + (i - 1) * width for j in range(len(rows))]
        ax.bar(xs, [r.get(key) or 0.0 for r in rows], width, label=name)
    ax.axhline(0.97, color="red", linewidth=1, linestyle="--", label="0.97x of the best")
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylim(0.6, 1.3)
    ax.set_ylabel("ratio of times (higher is faster)")
    ax.set_title(title)
    ax.legend(fontsize=8, ncols=4, loc="upper left")
    fig.savefig(out, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("check", type=Path, nargs="+", help="grid_check.py JSON files")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--title", default="attention() without bench vs backends called directly (H100, bf16)")
    args = ap.parse_args()
    plot(rows_of(args.check), args.out, args.title)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
