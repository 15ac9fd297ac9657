#!/usr/bin/env python3
"""Does ``attnforge.attention`` pick the measured-fastest verified backend on every bench shape, and is it
right?

Run on the GPU machine after ``attnforge verify`` and ``attnforge bench`` (06-bench.sh does). For every shape
the
bench recorded (read from the record store the dispatcher itself reads, ``$ATTNFORGE_HOME/records.db``):

1. ``attnforge.explain(q, k, v, ...)`` names the backend the dispatcher chooses; ``attnforge.attention`` runs
   it
   (with grad for ``fwd+bwd`` rows, then a backward pass that must give finite gradients).
2. The measured best is the fastest backend in the bench records for that shape and mode among the backends
   whose latest verify passed (plus the SDPA fallback); quantized backends count only for
   ``precision="allow_quantized"``. Verdict: ``best``; ``within_noise`` (chosen time <= best x (1 + --noise));
   ``not_best``; ``chosen_not_measured``.
3. The output is compared with the float64 reference (``attnforge.backends.adapter.reference_attention``) on a
   few single (batch, head) slices, so 16k-token shapes stay within memory: ``||out - ref|| / ||ref||`` must
   be
   under the bf16/fp16 tolerance (exact) or the quantized one; NaN or Inf fails.
4. ``--retime``: the chosen backend (through ``attention``) and the measured best (forced with
   ``attnforge.use_backend``) are timed again side by side with ``triton.testing.do_bench`` (median), so the
   verdict does not rest on the records alone.

Writes one JSON report (``--out``) and prints a table. Exit 0 when every row is correct and picks the best or
is
within noise, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sqlite3
import sys
import time
import traceback
import zlib
from collections.abc import Iterator
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from attnforge.types.shapes import AttentionShape as Shape
from attnforge.types.shapes import Mode

ALIASES = {"sdpa-default": "sdpa", "sdpa_default": "sdpa", "torch-sdpa": "sdpa"}
DTYPES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "torch.bfloat16": "bfloat16",
    "torch.float16": "float16",
}


def canon(name: str) -> str:
    """One spelling per backend: catalog ids use hyphens (``sdpa-cudnn``); the fallback is ``sdpa``."""
    n = str(name).strip().lower().replace("_", "-")
    return ALIASES.get(n, n)


def record_shape(dtype: str, mode: str, causal: bool, *, b: int, h: int, hkv: int, d: int, sq: int, sk: int) -> Shape:
    """A bench record's shape, as the one shared type (:class:`attnforge.types.shapes.AttentionShape`)."""
    return Shape(batch=b, heads=h, kv_heads=hkv, head_dim=d, seqlen_q=sq, seqlen_k=sk, causal=causal,
                 mode=Mode(mode), dtype=dtype)


def home_dir() -> Path:
    try:
        from attnforge._system.paths import home_dir as af_home

        return Path(af_home())
    except Exception:
        return Path(os.environ.get("ATTNFORGE_HOME", Path.home() / ".cache" / "attnforge"))


def pick_device_key(conn: sqlite3.Connection, device_name: str, torch_version: str) -> str | None:
    keys = [r[0] for r in conn.execute("SELECT DISTINCT device_key FROM bench")]
    keys += [r[0] for r in conn.execute("SELECT DISTINCT device_key FROM verify") if r[0] not in keys]
    matching = (
        [k for k in keys if device_name in k and torch_version in k]
        or [k for k in keys if torch_version in k]
        or keys
    )
    return matching[0] if matching else None


def load_records(
    db: Path, device_name: str, torch_version: str
) -> tuple[str | None, dict[str, dict[str, Any]], dict[Shape, dict[str, float]]]:
    """(device key, latest verify per backend, {shape: {backend: ms}} with later bench runs overriding)."""
    if not db.exists():
        return None, {}, {}
    conn = sqlite3.connect(db)
    try:
        key = pick_device_key(conn, device_name, torch_version)
        verified: dict[str, dict[str, Any]] = {}
        for backend, version, ok, summary in conn.execute(
            "SELECT backend, backend_version, ok, summary FROM verify WHERE device_key = ? ORDER BY id",
            (key,),
        ):
            verified[canon(backend)] = {"ok": bool(ok), "version": version, "summary": summary}
        bench: dict[Shape, dict[str, float]] = {}
        for row in conn.execute(
            "SELECT backend, dtype, mode, causal, batch, heads, kv_heads, head_dim, seqlen_q, seqlen_k, ms"
            " FROM bench WHERE device_key = ? ORDER BY id",
            (key,),
        ):
            backend, dtype, mode, causal, b, h, hkv, d, sq, sk, ms = row
            mode = (
                "fwd+bwd" if str(mode).replace(" ", "") in ("fwd+bwd", "fwdbwd", "fwd_bwd", "both") else "fwd"
            )
            key_shape = record_shape(DTYPES.get(str(dtype), str(dtype)), mode, bool(causal), b=b, h=h, hkv=hkv,
                                     d=d, sq=sq, sk=sk)
            bench.setdefault(key_shape, {})[canon(backend)] = float(ms)
    finally:
        conn.close()
    return key, verified, bench


def quantized_ids() -> set[str]:
    try:
        from attnforge.catalog import load_catalog

        return {canon(bid) for bid, b in load_catalog().backends.items() if getattr(b, "quantized", False)}
    except Exception:
        return {"sageattention-1", "sageattention-2"}


def chosen_name(expl: Any) -> str | None:
    """The chosen backend's id from an ``Explanation``, whatever its shape (object, dataclass or dict)."""
    for attr in ("chosen", "backend", "chosen_backend", "selected", "name"):
        val = expl.get(attr) if isinstance(expl, dict) else getattr(expl, attr, None)
        if val is None:
            continue
        if isinstance(val, str):
            return canon(val)
        inner = getattr(val, "name", None) or (val.get("name") if isinstance(val, dict) else None)
        if isinstance(inner, str):
            return canon(inner)
    return None


def jsonable(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(asdict(obj))
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def default_shapes() -> list[Shape]:
    """The bench issue's grid when no bench record exists: 16k tokens, H=16, D=128, bf16."""
    return [
        record_shape("bfloat16", mode, causal, b=16384 // s, h=16, hkv=16, d=128, sq=s, sk=s)
        for s in (1024, 4096, 16384)
        for causal in (False, True)
        for mode in ("fwd", "fwd+bwd")
    ]


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def slices(shape: Shape, n: int) -> list[tuple[int, int]]:
    picks = [(0, 0), (shape.batch - 1, shape.heads - 1), (shape.batch // 2, shape.heads // 2)]
    out: list[tuple[int, int]] = []
    for p in picks:
        if p not in out:
            out.append(p)
    return out[:n]


def compare(q: Any, k: Any, v: Any, out: Any, *, shape: Shape, n_slices: int) -> dict[str, Any]:
    import torch

    from attnforge.backends.adapter import reference_attention

    group = shape.heads // shape.kv_heads
    diff2 = ref2 = 0.0
    max_abs = 0.0
    finite = bool(torch.isfinite(out).all().item())
    for b, h in slices(shape, n_slices):
        hk = h // group
        ref = reference_attention(
            q[b : b + 1, h : h + 1],
            k[b : b + 1, hk : hk + 1],
            v[b : b + 1, hk : hk + 1],
            causal=shape.causal,
            scale=None,
        )
        o = out[b : b + 1, h : h + 1].double()
        diff2 += torch.sum((o - ref) ** 2).item()
        ref2 += torch.sum(ref**2).item()
        max_abs = max(max_abs, (o - ref).abs().max().item())
        del ref, o
    rel = math.sqrt(diff2 / ref2) if ref2 > 0 else float("nan")
    return {"finite": finite, "rel_err": rel, "max_abs_err": max_abs, "slices": slices(shape, n_slices)}


@contextlib.contextmanager
def forced(backend: str) -> Iterator[None]:
    import attnforge

    if backend == "sdpa":
        yield
        return
    with attnforge.use_backend(backend):
        yield


def retime(q: Any, k: Any, v: Any, *, shape: Shape, precision: str, best: str | None) -> dict[str, Any]:
    import triton.testing

    import attnforge

    def run_dispatch() -> Any:
        return attnforge.attention(q, k, v, causal=shape.causal, precision=precision)

    out: dict[str, Any] = {
        "dispatch_ms": triton.testing.do_bench(run_dispatch, warmup=25, rep=100, return_mode="median")
    }
    if best is not None:
        try:
            with forced(best):
                out["best_forced_ms"] = triton.testing.do_bench(
                    run_dispatch, warmup=25, rep=100, return_mode="median"
                )
        except Exception as exc:
            out["best_forced_error"] = f"{type(exc).__name__}: {exc}"[:400]
    return out


def check_one(
    shape: Shape,
    *,
    precision: str,
    measured: dict[str, float],
    verified: dict[str, dict[str, Any]],
    quantized: set[str],
    args: argparse.Namespace,
) -> dict[str, Any]:
    import torch

    import attnforge

    dtype = getattr(torch, shape.dtype)
    dev = args.device
    needs_grad = shape.mode == "fwd+bwd"
    gen = torch.Generator(device=dev).manual_seed(zlib.crc32(f"{shape}{precision}".encode()))
    q = torch.randn(
        shape.batch, shape.heads, shape.seqlen_q, shape.head_dim, device=dev, dtype=dtype, generator=gen
    ).requires_grad_(needs_grad)
    k, v = (
        torch.randn(
            shape.batch,
            shape.kv_heads,
            shape.seqlen_k,
            shape.head_dim,
            device=dev,
            dtype=dtype,
            generator=gen,
        ).requires_grad_(needs_grad)
        for _ in range(2)
    )
    row: dict[str, Any] = {"shape": asdict(shape), "label": shape.label, "precision": precision}

    expl = attnforge.explain(q, k, v, causal=shape.causal, precision=precision)
    row["chosen"] = chosen_name(expl)
    row["explain"] = jsonable(expl)
    out = attnforge.attention(q, k, v, causal=shape.causal, precision=precision)
    sync(dev)
    after = chosen_name(attnforge.explain(q, k, v, causal=shape.causal, precision=precision))
    if after != row["chosen"]:
        row["chosen_after_call"] = after  # the first choice raised and was marked broken
    if needs_grad:
        out.backward(torch.randn_like(out))
        sync(dev)
        row["grads_finite"] = all(bool(torch.isfinite(t.grad).all().item()) for t in (q, k, v))
    with torch.no_grad():
        row["numerics"] = compare(
            q.detach(), k.detach(), v.detach(), out.detach(), shape=shape, n_slices=args.slices
        )
    tol = (
        args.tol_quantized
        if row["chosen"] in quantized
        else (args.tol_bf16 if shape.dtype == "bfloat16" else args.tol_fp16)
    )
    row["numerics"]["tolerance"] = tol
    row["correct"] = bool(
        row["numerics"]["finite"] and row["numerics"]["rel_err"] <= tol and row.get("grads_finite", True)
    )

    eligible = {
        b: ms
        for b, ms in measured.items()
        if (b == "sdpa" or verified.get(b, {}).get("ok")) and (precision != "exact" or b not in quantized)
    }
    best = min(eligible, key=lambda b: eligible[b]) if eligible else None
    row["measured_ms"] = measured
    row["eligible_ms"] = eligible
    row["best"] = best
    chosen = row.get("chosen_after_call", row["chosen"])
    if best is None or chosen not in measured:
        row["verdict"] = "chosen_not_measured" if best is not None else "no_measurements"
    elif chosen == best:
        row["verdict"] = "best"
    elif measured[chosen] <= eligible[best] * (1 + args.noise):
        row["verdict"] = "within_noise"
    else:
        row["verdict"] = "not_best"
    if chosen in measured and best is not None:
        row["chosen_over_best"] = measured[chosen] / eligible[best]
    if args.retime and shape.mode == "fwd" and dev == "cuda":
        with torch.no_grad():
            row["retime"] = retime(
                q.detach(), k.detach(), v.detach(), shape=shape, precision=precision, best=best
            )
    del q, k, v, out
    if dev == "cuda":
        torch.cuda.empty_cache()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the JSON report")
    ap.add_argument("--home", type=Path, default=None, help="ATTNFORGE_HOME (default: attnforge's own)")
    ap.add_argument("--noise", type=float, default=0.05, help="relative time difference counted as a tie")
    ap.add_argument("--slices", type=int, default=2, help="(batch, head) slices compared with the reference")
    ap.add_argument("--tol-bf16", type=float, default=1e-2)
    ap.add_argument("--tol-fp16", type=float, default=5e-3)
    ap.add_argument("--tol-quantized", type=float, default=5e-2)
    ap.add_argument("--no-retime", dest="retime", action="store_false")
    ap.add_argument("--max-shapes", type=int, default=0, help="check only the first N shapes (0: all)")
    ap.add_argument("--modes", default="fwd,fwd+bwd", help="which bench modes to check")
    ap.add_argument("--device", default="cuda", help="cuda (the real check); cpu only to test this script")
    args = ap.parse_args()

    import torch

    import attnforge

    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    db = (args.home or home_dir()) / "records.db"
    key, verified, bench = load_records(db, device_name, torch.__version__)
    quantized = quantized_ids()
    shapes = (
        sorted(bench, key=lambda s: (s.mode, s.causal, s.head_dim, s.seqlen_q, s.batch)) or default_shapes()
    )
    shapes = [s for s in shapes if s.mode in args.modes.split(",")]
    if args.max_shapes:
        shapes = shapes[: args.max_shapes]
    precisions = ["exact"] + (
        ["allow_quantized"] if any(verified.get(b, {}).get("ok") for b in quantized) else []
    )

    report: dict[str, Any] = {
        "what": "attnforge dispatcher choice vs measured best per bench shape, and numerics vs float64",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": device_name,
        "torch": torch.__version__,
        "attnforge": attnforge.__version__,
        "records_db": str(db),
        "device_key": key,
        "verified": verified,
        "quantized": sorted(quantized),
        "noise": args.noise,
        "rows": [],
    }
    if not bench:
        report["warning"] = (
            "no bench records: shapes are the default grid and no verdict on speed is possible"
        )
    print(
        f"device {device_name} | key {key} | {len(shapes)} shapes | verified ok: "
        f"{sorted(b for b, r in verified.items() if r.get('ok'))}"
    )
    header = (
        f"{'shape':<40} {'mode':<8} {'precision':<15} {'chosen':<16} {'best':<16} {'verdict':<19} "
        f"{'rel_err':>8}  ok"
    )
    print(header)
    print("-" * len(header))
    for shape in shapes:
        for precision in precisions:
            if precision != "exact" and shape.mode != "fwd":
                continue  # quantized kernels are forward-only in practice; keeps the run short
            try:
                row = check_one(
                    shape,
                    precision=precision,
                    measured=bench.get(shape, {}),
                    verified=verified,
                    quantized=quantized,
                    args=args,
                )
            except Exception as exc:
                row = {
                    "shape": asdict(shape),
                    "label": shape.label,
                    "precision": precision,
                    "correct": False,
                    "verdict": "error",
                    "error": f"{type(exc).__name__}: {exc}"[:800],
                    "traceback": traceback.format_exc()[-3000:],
                }
                if args.device == "cuda":
                    torch.cuda.empty_cache()
            report["rows"].append(row)
            rel = row.get("numerics", {}).get("rel_err")
            print(
                f"{shape.label:<40} {shape.mode:<8} {precision:<15} {row.get('chosen') or '-':<16} "
                f"{row.get('best') or '-':<16} {row['verdict']:<19} "
                f"{f'{rel:.1e}' if isinstance(rel, float) else '-':>8}  {'yes' if row['correct'] else 'NO'}"
            )
            args.out.write_text(json.dumps(report, indent=2, default=str))

    rows = report["rows"]
    good = [r for r in rows if r["correct"] and r["verdict"] in ("best", "within_noise")]
    report["summary"] = {
        "rows": len(rows),
        "correct": sum(r["correct"] for r in rows),
        "best_or_within_noise": len(good),
        "verdicts": {v: sum(r["verdict"] == v for r in rows) for v in sorted({r["verdict"] for r in rows})},
    }
    args.out.write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps(report["summary"]))
    return 0 if rows and len(good) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
