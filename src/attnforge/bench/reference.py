"""Reproduce a recorded benchmark: read a reference file, rebuild its shapes, compare a new run with it.

The reference format is that of tests/fixtures/h200_bench_2026-11-21.json: a ``rows`` list of
``{"S", "B", "causal", "mode": "fwd"|"fwdbwd", "backend", "ms", "tflops"}`` measured with ``H`` heads of
head dim ``D`` in one dtype (given in its ``shapes`` text) and triton's do_bench (its ``timing`` text).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from attnforge import _serde
from attnforge.bench.run import BenchReport, CellStatus
from attnforge.errors import UsageError
from attnforge.types.shapes import AttentionShape, Mode

#: Backend names used in the H200 fixture -> attnforge backend ids (unlisted names are kept as they are).
FIXTURE_BACKENDS: dict[str, str] = {
    "sdpa_default": "sdpa",
    "sdpa_flash": "sdpa-flash",
    "sdpa_efficient": "sdpa-efficient",
    "sdpa_cudnn": "sdpa-cudnn",
    "sdpa_cudnn_run3": "sdpa-cudnn",
    "flex": "flex",
    "sage1_triton": "sageattention-1",
    "flash_attn_2.8.3.post2_bshd": "flash-attn",
    "flash_attn_4-4.0.0b36": "flash-attn-4",
}
_MODES = {"fwd": Mode.FWD, "fwdbwd": Mode.FWD_BWD, "fwd+bwd": Mode.FWD_BWD}


@dataclass(frozen=True, slots=True, kw_only=True)
class ReferenceRow:
    """One recorded measurement, with its backend mapped to an attnforge id."""

    shape: AttentionShape
    backend: str
    source_backend: str
    ms: float
    tflops: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Agreement:
    """A new measurement next to the recorded one (``ratio`` = new TFLOP/s / recorded TFLOP/s)."""

    shape: AttentionShape
    backend: str
    reference_tflops: float
    measured_tflops: float
    ratio: float


def load_reference(path: Path, *, heads_q: int | None = None, head_dim: int | None = None,
                   dtype: str | None = None) -> list[ReferenceRow]:
    """Read a reference file into shapes the bench can rerun.

    ``heads_q``, ``head_dim`` and ``dtype`` are read from the file's ``shapes`` text ("H=16 heads, head dim 128,
    bf16") unless given.

    Raises:
        UsageError: the file is unreadable, not JSON, or a row or the shape text cannot be read.
    """
    try:
        doc = _serde.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the reference benchmark {path}", cause=str(exc)) from None
    text = str(doc.get("shapes", ""))
    heads_q = heads_q or _grab(r"H=(\d+)", text, "heads")
    head_dim = head_dim or _grab(r"head dim (\d+)", text, "head dim")
    dtype = dtype or ("bfloat16" if "bf16" in text else "float16" if "fp16" in text else None)
    if dtype is None:
        raise UsageError(f"{path.name}: no dtype (bf16/fp16) in its 'shapes' text", hint="pass dtype=")
    rows = []
    for i, raw in enumerate(doc.get("rows", [])):
        try:
            s, mode = int(raw["S"]), _MODES[raw["mode"]]
            shape = AttentionShape(batch=int(raw["B"]), heads_q=heads_q, heads_kv=heads_q, head_dim=head_dim,
                               seqlen_q=s, seqlen_k=s, causal=bool(raw["causal"]), mode=mode, dtype=dtype)
            name = str(raw["backend"])
            rows.append(ReferenceRow(shape=shape, backend=FIXTURE_BACKENDS.get(name, name),
                                     source_backend=name, ms=float(raw["ms"]), tflops=float(raw["tflops"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{path.name}: rows[{i}] is not a benchmark row", cause=repr(exc)) from None
    return rows


def reference_shapes(rows: list[ReferenceRow]) -> list[AttentionShape]:
    """The distinct shapes of the reference, in file order (what to pass to :func:`run_bench`)."""
    return list(dict.fromkeys(r.shape for r in rows))


def compare_to_reference(report: BenchReport, rows: list[ReferenceRow],
                         aliases: Mapping[str, str] | None = None) -> list[Agreement]:
    """Pair every measured cell of ``report`` with the reference rows of the same shape and backend.

    Args:
        aliases: extra reference backend -> report backend names.
    """
    aliases = aliases or {}
    measured = {(row.shape, cell.backend): cell.tflops for row in report.rows for cell in row.cells
                if cell.status is CellStatus.OK and cell.tflops}
    out = []
    for ref in rows:
        name = aliases.get(ref.source_backend, ref.backend)
        got = measured.get((ref.shape, name))
        if got:
            out.append(Agreement(shape=ref.shape, backend=name, reference_tflops=ref.tflops,
                                 measured_tflops=got, ratio=got / ref.tflops))
    return out


def _grab(pattern: str, text: str, what: str) -> int:
    match = re.search(pattern, text)
    if match is None:
        raise UsageError(f"no {what} in the reference's 'shapes' text: {text!r}")
    return int(match.group(1))
