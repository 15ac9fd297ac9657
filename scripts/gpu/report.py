#!/usr/bin/env python3
"""Turn the outputs of a GPU run (the unpacked ``afrun.tar.gz``) into a draft of ``docs/benchmarks.md``.

Usage (on the development machine, after the last device call)::

    mkdir -p /tmp/gpu-run && tar xzf <files_at>/afrun.tar.gz -C /tmp/gpu-run
    python3 scripts/gpu/report.py /tmp/gpu-run/afrun --out docs/benchmarks.md --plot-to docs/bench-h100.png

Every section is filled from a file the scripts wrote; a file that is missing or has an unexpected shape
becomes a visible "not available" line with the file name, never a silent gap. The draft states facts only:
the lead adds the narrative (what was fixed, what the numbers mean) by hand. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import re
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
        return "_not available: 06-bench/bench.json (missing or unexpected shape)_\n"
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


def dispatch_section(doc: Any) -> str:
    if not isinstance(doc, dict) or not doc.get("rows"):
        return "_not available: 06-bench/dispatch.json_\n"
    table = []
    for r in doc["rows"]:
        rel = r.get("numerics", {}).get("rel_err")
        rt = r.get("retime", {})
        rt_s = (
            f"{rt['dispatch_ms']:.3f} / {rt.get('best_forced_ms', float('nan')):.3f}"
            if isinstance(rt.get("dispatch_ms"), float)
            else ""
        )
        table.append(
            [
                r.get("label", ""),
                str(r.get("shape", {}).get("mode", "")),
                r.get("precision", ""),
                str(r.get("chosen")),
                str(r.get("best")),
                r.get("verdict", ""),
                f"{rel:.1e}" if isinstance(rel, float) else "-",
                "yes" if r.get("correct") else "NO",
                rt_s,
            ]
        )
    summary = json.dumps(doc.get("summary", {}))
    return (
        md_table(
            [
                "shape",
                "mode",
                "precision",
                "chosen",
                "measured best",
                "verdict",
                "rel err",
                "correct",
                "re-timed ms (dispatch / best forced)",
            ],
            table,
        )
        + f"\nSummary: `{summary}`\n"
    )


def overhead_section(doc: Any) -> str:
    if not isinstance(doc, dict) or not doc.get("rows"):
        return "_not available: 08-overhead/overhead.json_\n"
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
    ap.add_argument("--plot-to", type=Path, default=None, help="copy bench.png here (must stay under 1 MB)")
    args = ap.parse_args()
    run: Path = args.run
    d02, d04, d05, d06, d07, d08 = (
        run / n
        for n in ("02-doctor-plan", "04-watch", "05-fa4-sage-xformers", "06-bench", "07-cache", "08-overhead")
    )
    env = read(d02 / "env.txt")
    date = re.search(r"^date_utc: (\d\S+)", env or "", re.MULTILINE)
    plan = load_json(d02 / "plan-flash-attn.json")
    build = dict(ln.split("\t", 1) for ln in (read(d04 / "fa2-build.tsv") or "").splitlines() if "\t" in ln)
    cache = dict(ln.split("\t", 1) for ln in (read(d07 / "cache-hit.tsv") or "").splitlines() if "\t" in ln)
    wheels = read(d04 / "fa2-wheels.txt") or ""
    fa2_log = read(d04 / "fa2-install-output.log") or ""
    steps = re.findall(r"\[(\d+)/(\d+)\]", fa2_log)

    plot_line = "_no plot: 06-bench/bench.png missing_"
    png = d06 / "bench.png"
    if png.exists():
        size = png.stat().st_size
        if args.plot_to:
            shutil.copyfile(png, args.plot_to)
            plot_line = f"![attention TFLOP/s by backend]({args.plot_to.name})"
        else:
            plot_line = "(bench.png: pass --plot-to docs/NAME.png)"
        if size > 1_000_000:
            plot_line += f"\n\n_bench.png is {size:,} bytes: over the 1 MB limit for docs/, re-plot smaller_"

    xf = load_json(d05 / "xformers-probe.json") or {}
    xf12 = load_json(d05 / "xformers-probe-cudart12.json") or {}
    overlap = (
        load_json(d05 / "flash-attn-overlap-after.json") or load_json(d07 / "flash-attn-overlap.json") or {}
    )

    parts = [
        "# attnforge on a real GPU: doctor, install, verify, bench, dispatch\n",
        f"Run date (UTC): {date.group(1) if date else 'unknown'}. Reproduce with `scripts/gpu/` "
        "(see `scripts/gpu/README.md`). DRAFT generated by `scripts/gpu/report.py`: facts only, "
        "narrative to add.\n",
        "## The machine\n",
        block(strip_header(env or ""), "02-doctor-plan/env.txt"),
        "## `attnforge doctor` (before any install)\n",
        block(strip_header(read(d02 / "doctor-text.log") or ""), "02-doctor-plan/doctor-text.log"),
        "## FlashAttention-2 from source: "
        "`attnforge install flash-attn --find-links <wheelhouse> --offline`\n",
        f"- plan: FLASH_ATTN_CUDA_ARCHS={find_key(plan, 'FLASH_ATTN_CUDA_ARCHS')}, "
        f"MAX_JOBS={find_key(plan, 'MAX_JOBS')}, NVCC_THREADS={find_key(plan, 'NVCC_THREADS')}\n"
        f"- cold build + install, wall time: {build.get('fa2_build_wall_s', '?')} s "
        f"(rc {build.get('fa2_build_rc', '?')}; "
        f"last ninja step seen {'/'.join(steps[-1]) if steps else '?'})\n"
        f"- wheel: {wheels.strip() or '?'}\n"
        f"- after `pip uninstall flash-attn`, install again: {cache.get('reinstall_wall_s', '?')} s, "
        f"{cache.get('verdict', '?')}\n",
        "### Cache export, then plain pip from the export\n",
        block(strip_header(read(d07 / "export-tree.log") or ""), "07-cache/export-tree.log", 4000),
        block(
            strip_header(read(d07 / "plain-import-and-run.log") or ""),
            "07-cache/plain-import-and-run.log",
            2000,
        ),
        "## Verify\n",
        verify_section(
            *[(f"05-fa4-sage-xformers/{p.name}", load_json(p)) for p in sorted(d05.glob("verify-*.json"))],
            ("07-cache/verify-flash-attn.json", load_json(d07 / "verify-flash-attn.json")),
        ),
        "\n## xFormers 0.0.35 from PyPI: why its extension does not load\n",
        f"- built for: `{xf.get('built_for')}`\n- dlopen of `_C.so`: `{xf.get('dlopen_C_so')}`\n"
        f"- ldd, not found: `{xf.get('ldd_not_found')}`\n- xformers' own load exception: "
        f"`{str(xf.get('xformers_load_exception'))[:300]}`\n- memory_efficient_attention: "
        f"`{xf.get('memory_efficient_attention')}`\n- with libcudart.so.12 on LD_LIBRARY_PATH: dlopen "
        f"`{xf12.get('dlopen_C_so')}`, attention `{xf12.get('memory_efficient_attention')}`\n",
        "\n## flash-attn and flash-attn-4 share files\n",
        f"Shared paths: {overlap.get('shared', '?')}; content on disk after the FA4 install: "
        f"`{overlap.get('content_on_disk_matches', '?')}`\n",
        "\n## Bench: `attnforge bench --json --plot`\n",
        bench_section(load_json(d06 / "bench.json")),
        "\n" + plot_line + "\n",
        "\n## What the dispatcher chose per shape, and whether it was the measured best\n",
        dispatch_section(load_json(d06 / "dispatch.json")),
        "\n## Dispatch overhead per call\n",
        overhead_section(load_json(d08 / "overhead.json")),
        "\n## `attnforge doctor` at the end\n",
        block(strip_header(read(d08 / "doctor-final-text.log") or ""), "08-overhead/doctor-final-text.log"),
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
