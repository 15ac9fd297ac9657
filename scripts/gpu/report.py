#!/usr/bin/env python3
"""Turn the outputs of a GPU run (the unpacked ``afrun.tar.gz``) into a draft of ``docs/benchmarks.md``.

Usage (on the development machine, after the last device call)::

    mkdir -p /tmp/gpu-run && tar xzf <files_at>/afrun.tar.gz -C /tmp/gpu-run
    python3 scripts/gpu/report.py /tmp/gpu-run/afrun --out /tmp/benchmarks-draft.md --data docs/data/h100_2026-11-25

Every section is filled from a file the scripts wrote; a file that is missing or has an unexpected shape
becomes a visible "not available" line with the file name, never a silent gap. The draft states facts only:
the lead adds the narrative (what was fixed, what the numbers mean) by hand. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any


def read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def load_json(path: Path) -> Any:
    text = read(path)
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def strip_header(log: str) -> str:
    return "\n".join(ln for ln in log.splitlines() if not ln.startswith(("# started", "# rc=", "# ")))


def block(text: str | None, missing: str, limit: int = 12000) -> str:
    if text is None or not text.strip():
        return f"_not available: {missing}_\n"
    text = text.strip()
    if len(text) > limit:
        text = text[:limit] + "\n... (cut; the full file is in the run archive)"
    return f"```\n{text}\n```\n"


def find_key(obj: Any, key: str) -> Any:
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            r = find_key(v, key)
            if r is not None:
                return r
    elif isinstance(obj, list):
        for v in obj:
            r = find_key(v, key)
            if r is not None:
                return r
    return None


def rows_of(doc: Any) -> list[dict[str, Any]]:
    """The list of row dicts in a JSON document, whatever the key (rows, results, records, backends)."""
    if isinstance(doc, list):
        return [r for r in doc if isinstance(r, dict)]
    if not isinstance(doc, dict):
        return []
    for key in ("rows", "results", "records", "backends", "measurements"):
        val = doc.get(key)
        if isinstance(val, list):
            return [r for r in val if isinstance(r, dict)]
        if isinstance(val, dict):
            return [
                dict(v, backend=k) if isinstance(v, dict) else {"backend": k, "value": v}
                for k, v in val.items()
            ]
    return []


def pick(row: dict[str, Any], *names: str) -> Any:
    for n in names:
        if n in row and row[n] is not None:
            return row[n]
        for sub in ("shape", "case", "config"):
            if isinstance(row.get(sub), dict) and row[sub].get(n) is not None:
                return row[sub][n]
    return None


def md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def steps_table(run: Path) -> str:
    text = read(run / "steps.tsv")
    if not text:
        return "_not available: steps.tsv_\n"
    rows = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) >= 5:
            rows.append([parts[1], parts[2], parts[3], parts[4], parts[5] if len(parts) > 5 else ""])
    return md_table(["script", "step", "rc", "duration (s)", "note"], rows)


def verify_section(*docs: tuple[str, Any]) -> str:
    out = []
    for name, doc in docs:
        rows = rows_of(doc)
        if not rows:
            out.append(f"_not available or unexpected shape: {name}_\n")
            continue
        table = [
            [
                str(pick(r, "backend", "name", "id")),
                str(pick(r, "ok", "passed", "status")),
                str(pick(r, "version", "backend_version") or ""),
                str(pick(r, "summary", "reason", "detail") or "")[:160],
            ]
            for r in rows
        ]
        out.append(f"From `{name}`:\n\n" + md_table(["backend", "ok", "version", "summary"], table))
    return "\n".join(out)


def bench_section(doc: Any) -> str:
    rows = rows_of(doc)
    if not rows:
        return "_not available: bench/bench-grid.json (missing or unexpected shape)_\n"
    cells: dict[tuple[Any, ...], dict[str, float]] = {}
    backends: list[str] = []
    for r in rows:
        backend = str(pick(r, "backend", "name"))
        tflops = pick(r, "tflops", "TFLOPs", "tflops_per_s")
        key = (
            pick(r, "mode"),
            pick(r, "causal"),
            pick(r, "head_dim", "D"),
            pick(r, "batch", "B"),
            pick(r, "seqlen_q", "seqlen", "S"),
        )
        if not isinstance(tflops, (int, float)):
            continue
        cells.setdefault(key, {})[backend] = float(tflops)
        if backend not in backends:
            backends.append(backend)
    table = []
    for key in sorted(cells, key=lambda k: (*(str(x) for x in k[:3]), k[4] or 0)):
        row = cells[key]
        best = max(row, key=lambda b: row[b])
        table.append(
            [
                str(key[0]),
                "yes" if key[1] else "no",
                str(key[2]),
                str(key[3]),
                str(key[4]),
                *[
                    (f"**{row[b]:.0f}**" if b == best else f"{row[b]:.0f}") if b in row else "-"
                    for b in backends
                ],
            ]
        )
    return "TFLOP/s (best per row in bold):\n\n" + md_table(
        ["mode", "causal", "head dim", "batch", "seqlen", *backends], table
    )


def grid_section(doc: Any, name: str) -> str:
    """The table grid_check.py prints, from its JSON: per cell the choice, the ratios and the first-use cost."""
    if not isinstance(doc, dict) or not doc.get("rows"):
        return f"_not available: {name}_\n"

    def fmt(x: Any) -> str:
        return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)

    def choices(r: dict[str, Any], before: str, after: str) -> str:
        """The class's choice before the timed calls, and after them where it changed (an in-situ revert)."""
        first, last = r.get(before), r.get(after)
        return fmt(first) if last in (None, first) else f"{fmt(first)} -> {last}"

    rows = [[r["cell"], r["mode"], choices(r, "chosen", "chosen_after"), choices(r, "chosen_bshd", "chosen_bshd_after"),
             fmt(r.get("best_exact")), fmt(r.get("ratio_to_best")), fmt(r.get("ratio_to_best_on_bhsd")),
             fmt(r.get("ratio_bshd_to_best")), fmt(r.get("ratio_to_sdpa")), fmt(r.get("chosen_quantized")),
             fmt(r.get("ratio_quantized_to_sdpa")), fmt((r.get("first_use_s") or {}).get("attnforge"))]
            for r in doc["rows"]]
    table = md_table(["cell", "mode", "chosen", "chosen bshd", "best exact", "attnforge/best",
                      "attnforge/best on its bhsd tensors", "bshd/best", "vs SDPA",
                      "chosen (quantized)", "quantized vs SDPA", "first call (s)"], rows)
    return table + f"\nSummary (`{name}`): `{json.dumps(doc.get('summary'), default=str)[:3000]}`\n"


def warmup_records(db: Path) -> list[dict[str, Any]]:
    """The measurements of a check's home (``check-home/records.db``, the ``bench`` table the warm-up wrote), as
    dicts; none when the file is missing or not a records database."""
    import sqlite3

    if not db.exists():
        return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            con.row_factory = sqlite3.Row
            return [dict(r) for r in con.execute("SELECT * FROM bench")]
    except sqlite3.Error:
        return []


def records_vs_grid_section(doc: Any, records: list[dict[str, Any]]) -> str:
    """Per grid row, each route's warm-up record (ms, timed back to back as a model issues it) over the grid's
    CUDA-event time of the same backend's public function (SDPA on bhsd, FA3/FA4 on bshd), and attention()'s grid
    time over the record of the route its warm-up chose in each layout. A record far above its kernel holds host
    time (the twenty-first session's Flux fwd+bwd: +2.4 / +6.4 / +9.3 %); attention() far above its own route's
    record is a gap the grid sees and the warm-up did not (the twenty-second session's bshd D256 fwd+bwd, x1.17)."""
    if not isinstance(doc, dict) or not doc.get("rows") or not records:
        return "_not available: check/check.json with check-home/records.db_\n"

    def key(*dims: Any) -> tuple[Any, ...]:
        """(B, Hq, Hkv, Sq, Sk, D, causal, mode) with causal as a bool (the database holds 0/1)."""
        return (*dims[:6], bool(dims[6]), dims[7])

    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in sorted(records, key=lambda r: r.get("id", 0)):
        latest[(key(r["batch"], r["heads"], r["kv_heads"], r["seqlen_q"], r["seqlen_k"], r["head_dim"], r["causal"],
                    r["mode"]), r["backend"], r.get("layout") or "bhsd")] = r
    rows: list[list[str]] = []
    ratios: dict[str, list[float]] = {"sdpa": [], "flash-attn-3": [], "flash-attn-4": []}
    for row in doc["rows"]:
        s, ms = row["shape"], row.get("ms", {})
        k = key(s["b"], s["hq"], s["hkv"], s["sq"], s["sk"], s["d"], s["causal"],
                "fwd" if row["mode"] == "fwd" else "fwd+bwd")
        cells = []
        for backend, layout in (("sdpa", "bhsd"), ("flash-attn-3", "bshd"), ("flash-attn-4", "bshd")):
            rec = latest.get((k, backend, layout))
            if rec and ms.get(backend):
                ratios[backend].append(rec["ms"] / ms[backend])
                cells.append(f"{rec['ms'] / ms[backend]:.3f}")
            else:
                cells.append("-")
        for layout, name in (("bhsd", "attnforge"), ("bshd", "attnforge-bshd")):
            chosen = [r for (kk, _b, lay), r in latest.items() if kk == k and lay == layout]
            best = min(chosen, key=lambda r: r["ms"]) if chosen else None
            cells.append(f"{ms[name] / best['ms']:.3f} ({best['backend']})" if best and ms.get(name) else "-")
        rows.append([row["cell"], row["mode"], *cells])
    table = md_table(["cell", "mode", "SDPA record/kernel", "FA3 record/kernel", "FA4 record/kernel",
                      "attention()/fastest record bhsd", "attention()/fastest record bshd"], rows)
    medians = ", ".join(f"{b} {sorted(v)[len(v) // 2]:.3f} ({len(v)} rows)" for b, v in ratios.items() if v)
    return table + f"\nMedian record/kernel: {medians}\n"


def overhead_section(doc: Any) -> str:
    if not isinstance(doc, dict) or not doc.get("rows"):
        return "_not available: overhead/overhead.json_\n"
    table = []
    for r in doc["rows"]:
        var = r.get("variants", {})

        def us(v: str, var: dict[str, Any] = var) -> str:
            return f"{var[v]['host_us_median']:.1f}" if v in var else "-"

        ov = r.get("overhead_vs_raw_us")
        table.append(
            [
                str(r.get("shape_bhsd")),
                str(r.get("causal")),
                str(r.get("chosen")),
                us("raw"),
                us("adapter"),
                us("dispatch"),
                us("dispatch_native"),
                f"{ov:+.1f}" if isinstance(ov, float) else "-",
                str(r.get("dispatch_output_bit_identical_to_raw", "-")),
                r.get("error", ""),
            ]
        )
    return (
        f"N = {doc.get('calls_per_loop')} calls per loop, {doc.get('rounds')} interleaved rounds, "
        "medians of the host time per call (us):\n\n"
        + md_table(
            [
                "[B, H, S, D]",
                "causal",
                "chosen",
                "raw",
                "adapter",
                "attention()",
                "attention() native layout",
                "overhead vs raw",
                "same output",
                "error",
            ],
            table,
        )
        + f"\nSummary: `{json.dumps(doc.get('summary', {}))}`\n"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="the unpacked afrun folder")
    ap.add_argument("--out", type=Path, default=None, help="write the draft here (default: stdout)")
    ap.add_argument("--data", type=Path, default=None,
                    help="copy the raw JSON here, e.g. docs/data/h100_2026-11-25 (files under 1 MB each)")
    args = ap.parse_args()
    run: Path = args.run
    raw = {
        "verify-all.json": run / "verify/verify-all.json", "check.json": run / "check/check.json",
        "check-after.json": run / "check-after/check-after.json", "bench-grid.json": run / "bench/bench-grid.json",
        "bench-diffusion.json": run / "bench/bench-diffusion.json", "features.json": run / "features/features.json",
        "models.json": run / "models/models.json", "overhead.json": run / "overhead/overhead.json",
        "route.json": run / "route/route.json", "probe.json": run / "setup/probe.log",
    }
    if args.data:
        args.data.mkdir(parents=True, exist_ok=True)
        for dest, src in raw.items():
            if src.exists() and src.stat().st_size < 1_000_000:
                shutil.copyfile(src, args.data / dest)
    times = "".join(read(run / d / "times.tsv") or "" for d in ("install", "cachehit"))
    feats = load_json(run / "features/features.json") or {}
    route = load_json(run / "route/route.json") or {}
    parts = [
        "# attnforge on a real GPU (issue 25): install, verify, dispatch without bench, features, models\n",
        "DRAFT generated by `scripts/gpu/report.py` from the run's `afrun` folder: facts only, narrative to add. "
        "Reproduce with `scripts/gpu/run.sh` (see `scripts/gpu/README.md`).\n",
        "## The machine\n",
        block(strip_header(read(run / "setup/venv-sees-torch.log") or ""), "setup/venv-sees-torch.log", 2000),
        "## Install times (step, rc, seconds)\n",
        block(times, "install/times.tsv, cachehit/times.tsv", 4000),
        "## Verify\n",
        verify_section(("verify/verify-all.json", load_json(raw["verify-all.json"]))),
        "\n## Dispatch check without bench (fresh records: verify only)\n",
        grid_section(load_json(raw["check.json"]), "check/check.json"),
        "\n## The warm-up's records against the grid's kernels\n",
        records_vs_grid_section(load_json(raw["check.json"]), warmup_records(run / "check-home/records.db")),
        "\n## Bench: `attnforge bench --shapes grid`\n",
        bench_section(load_json(raw["bench-grid.json"])),
        "\n## Dispatch check after bench\n",
        grid_section(load_json(raw["check-after.json"]), "check-after/check-after.json"),
        "\n## The Gemma-2-style call vs FlexAttention called directly\n",
        block(json.dumps(feats, indent=1) if feats else "", "features/features.json", 4000),
        "\n## Tiny models through the integrations\n",
        block(read(raw["models.json"]) or "", "models/models.json", 6000),
        "\n## Dispatch overhead per call\n",
        overhead_section(load_json(raw["overhead.json"])),
        "\n## Prebuilt-wheel route\n",
        f"- {route.get('arch_check', 'arch check: not available')}\n- plan chose: `{route.get('plan_chosen')}` "
        f"(kind {route.get('plan_kind')}); install rc {route.get('install_rc')} in {route.get('install_seconds')} s; "
        f"tampered refused: {route.get('tampered_refused')}\n",
        "\n## Every step of the run\n",
        steps_table(run),
    ]
    text = "\n".join(parts)
    if args.out:
        args.out.write_text(text)
        print(f"wrote {args.out} ({len(text):,} characters)")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
