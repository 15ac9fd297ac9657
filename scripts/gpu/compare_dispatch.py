#!/usr/bin/env python3
"""Issue 17's measurement: ``attnforge.attention`` against every verified backend called directly, per cell.

Cells: ``--shapes grid`` (GQA prefill, chunked prefill, decode, D 64/128/256, 1k) and ``diffusion`` (Flux
S4608, Wan S32760, 16k), bf16 on a GPU (shrunk on a CPU, for a smoke run). Every cell is timed with bench's
harness in interleaved rounds: ``attnforge`` (the dispatcher, through ``attnforge.attention``), plain SDPA and
every backend ``attnforge verify`` passed on this device, forced. Per cell: attnforge's TFLOP/s over the best
direct backend's and over plain SDPA's; then the geometric means ("Done when": >= 0.97x the best in every cell,
geomean >= 1.12x over SDPA; with ``--precision allow_quantized`` >= 1.25x on >= 16k-token diffusion cells).

Run after ``attnforge verify`` and ``attnforge bench --shapes grid`` / ``--shapes diffusion`` (or with
``ATTNFORGE_AUTOTUNE=1``). Writes ``--out`` (JSON) and prints a table. Exit 0 when every cell is >= --floor.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any


class Dispatched:
    """``attnforge.attention`` behind the bench adapter convention."""

    name = "attnforge"

    def __init__(self, precision: str) -> None:
        self.precision = precision

    def load_error(self) -> str | None:
        return None

    def unsupported_reasons(self, call: Any) -> list[str]:
        return []

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
        import attnforge

        return attnforge.attention(q, k, v, causal=causal, scale=scale, precision=self.precision)


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default="grid,diffusion", help="comma-separated: grid, diffusion")
    ap.add_argument("--modes", default="fwd,fwd+bwd")
    ap.add_argument("--precision", choices=["exact", "allow_quantized"], default="exact")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--floor", type=float, default=0.97, help="attnforge / best direct, per cell")
    args = ap.parse_args()

    import dataclasses

    import attnforge.probe  # noqa: F401  (catalog <-> probe import order)
    from attnforge._system.paths import home_dir
    from attnforge.bench.grid import diffusion_grid, real_grid
    from attnforge.bench.run import run_bench
    from attnforge.bench.select import choose_timing
    from attnforge.catalog import load_catalog
    from attnforge.dispatch.registry import adapters, fallback
    from attnforge.records import RecordStore
    from attnforge.types.shapes import Mode
    from attnforge.verify.device import DeviceType, current_device

    dev = current_device(args.device)
    cpu = dev.type is DeviceType.CPU
    dtype = "float32" if cpu else "bfloat16"
    modes = tuple(Mode(m) for m in args.modes.split(","))
    shapes = []
    if "grid" in args.shapes:
        shapes += real_grid(dtype=dtype, modes=modes, cpu=cpu)
    if "diffusion" in args.shapes:
        shapes += diffusion_grid(dtype=dtype, modes=(Mode.FWD,), cpu=cpu)
    verified = {n for n, r in RecordStore(home_dir(os.environ)).latest_verify(dev.key).items() if r.ok}
    catalog = load_catalog()
    registry = adapters()
    direct = {n: registry[n] for n in sorted(verified) if n in registry
              and (args.precision == "allow_quantized" or not catalog.backends[n].quantized)}
    quantized = [n for n in direct if catalog.backends[n].quantized]
    timed = {"sdpa": fallback(), **direct, "attnforge": Dispatched(args.precision)}
    timing = dataclasses.replace(choose_timing(dev, "auto"), rounds=args.rounds)
    report = run_bench(shapes, adapters=timed, baseline="sdpa", device=dev, timing=timing,
                       verified=sorted(verified), quantized=quantized)
    rows, vs_best, vs_sdpa = [], [], []
    for row in report.rows:
        got = row.cell("attnforge")
        cells = {c.backend: c.tflops for c in row.cells if c.tflops and c.backend != "attnforge"}
        best = max(cells, key=lambda n: cells[n], default=None)
        entry: dict[str, Any] = {"shape": row.shape.label, "class": str(row.shape.shape_class),
                                 "tflops": {c.backend: c.tflops for c in row.cells}, "best_direct": best}
        if got is not None and got.tflops and best is not None:
            entry["vs_best"] = got.tflops / cells[best]
            vs_best.append(entry["vs_best"])
            if cells.get("sdpa"):
                entry["vs_sdpa"] = got.tflops / cells["sdpa"]
                vs_sdpa.append(entry["vs_sdpa"])
        rows.append(entry)
        print(f"{row.shape.label:<42} attnforge {got.tflops if got and got.tflops else float('nan'):8.3g}  "
              f"best {best or '-':<16} x{entry.get('vs_best', float('nan')):.3f}  vs sdpa "
              f"x{entry.get('vs_sdpa', float('nan')):.3f}")
    summary = {"device": dev.key, "precision": args.precision, "cells": len(rows),
               "geomean_vs_best": geomean(vs_best), "geomean_vs_sdpa": geomean(vs_sdpa),
               "cells_below_floor": sum(v < args.floor for v in vs_best), "floor": args.floor}
    print(json.dumps(summary))
    args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2), encoding="utf-8")
    return 0 if rows and summary["cells_below_floor"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
