"""``fleet report``: per machine kind, each backend's verify verdict and the per-class winner over SDPA. Pure
over the records ``fleet verify`` and ``fleet bench`` brought back (``$ATTNFORGE_HOME/fleet/records``).

The winner of a shape class on a kind is the backend most nodes of the kind named ``best`` (bench's column,
the one ranking rule of :mod:`attnforge.ranking`); its margin over SDPA is the median over those nodes of its
``ratio_to_baseline`` (speed-up over ``sdpa``, the bench's baseline).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """A backend's verify verdict on one kind: ``passed`` on every node, else ``failed`` with the count."""

    kind: str
    backend: str
    passed_nodes: int
    nodes: int
    summary: str

    @property
    def ok(self) -> bool:
        return self.passed_nodes == self.nodes


@dataclass(frozen=True, slots=True, kw_only=True)
class Winner:
    """The fastest backend of one shape class on one kind, and its speed-up over SDPA (1.0 = as fast)."""

    kind: str
    shape_class: str
    backend: str
    speedup: float | None
    nodes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRow:
    """One backend on one node: its version, its verify verdict (None: not verified) and its best TFLOP/s per
    shape class (bench's cells; empty: not timed)."""

    node_id: str
    address: str
    kind: str
    backend: str
    version: str | None
    verified: bool | None
    tflops: dict[str, float]


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetReport:
    """Kinds (id -> description), verdicts, winners, one row per node and backend, and the nodes whose run
    failed or was lost."""

    kinds: dict[str, str]
    verdicts: tuple[Verdict, ...]
    winners: tuple[Winner, ...]
    problems: tuple[str, ...]
    nodes: tuple[NodeRow, ...] = ()


def build_report(verify: Mapping[str, Any] | None, bench: Mapping[str, Any] | None) -> FleetReport:
    """The report from the saved ``verify`` and ``bench`` records (either may be None)."""
    kinds: dict[str, str] = {}
    problems: list[str] = []
    passes: dict[tuple[str, str], list[tuple[bool, str]]] = defaultdict(list)
    for run in _runs(verify, kinds, problems, "verify"):
        for result in run["doc"].get("results", []):
            passes[run["kind"], result["backend"]].append((bool(result.get("ok")), str(result.get("summary", ""))))
    verdicts = tuple(
        Verdict(kind=k, backend=b, passed_nodes=sum(ok for ok, _ in v), nodes=len(v),
                summary=next((s for ok, s in v if not ok), v[0][1]))
        for (k, b), v in sorted(passes.items()))
    bests: dict[tuple[str, str], list[tuple[str, float | None]]] = defaultdict(list)
    for run in _runs(bench, kinds, problems, "bench"):
        for row in run["doc"].get("rows", []):
            best = row.get("best")
            if not best:
                continue
            ratio = next((c.get("ratio_to_baseline") for c in row.get("cells", []) if c.get("backend") == best), None)
            bests[run["kind"], str(row.get("shape_class"))].append((str(best), ratio))
    winners = []
    for (kind, cls), values in sorted(bests.items()):
        backend, count = Counter(b for b, _ in values).most_common(1)[0]
        ratios = [r for b, r in values if b == backend and isinstance(r, (int, float))]
        winners.append(Winner(kind=kind, shape_class=cls, backend=backend, nodes=count,
                              speedup=statistics.median(ratios) if ratios else None))
    return FleetReport(kinds=kinds, verdicts=verdicts, winners=tuple(winners), problems=tuple(problems),
                       nodes=_node_rows(verify, bench))


def _node_rows(verify: Mapping[str, Any] | None, bench: Mapping[str, Any] | None) -> tuple[NodeRow, ...]:
    """Per (node, backend): version and verdict from verify, best TFLOP/s per shape class from bench."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}

    def row(run: Mapping[str, Any], backend: str) -> dict[str, Any]:
        return rows.setdefault((str(run["node_id"]), backend), {
            "node_id": str(run["node_id"]), "address": str(run["address"]), "kind": str(run["kind"]),
            "backend": backend, "version": None, "verified": None, "tflops": {}})

    for run in (verify or {}).get("nodes", []):
        doc = run.get("doc")
        for result in doc.get("results", []) if isinstance(doc, dict) else []:
            r = row(run, str(result["backend"]))
            r["version"] = result.get("version") or r["version"]
            r["verified"] = bool(result.get("ok"))
    for run in (bench or {}).get("nodes", []):
        doc = run.get("doc")
        for bench_row in doc.get("rows", []) if isinstance(doc, dict) else []:
            cls = str(bench_row.get("shape_class"))
            for cell in bench_row.get("cells", []):
                if isinstance(cell.get("tflops"), (int, float)) and cell.get("status", "ok") == "ok":  # not noisy
                    best = row(run, str(cell["backend"]))["tflops"]
                    best[cls] = max(best.get(cls, 0.0), float(cell["tflops"]))
    return tuple(NodeRow(**r) for _, r in sorted(rows.items()))


def _runs(records: Mapping[str, Any] | None, kinds: dict[str, str], problems: list[str], verb: str,
          ) -> list[dict[str, Any]]:
    out = []
    for run in (records or {}).get("nodes", []):
        if run["status"] == "skipped":  # a node without a GPU: no kernel there, no row in the report
            continue
        kinds.setdefault(run["kind"], run.get("describe", run["kind"]))
        if isinstance(run.get("doc"), dict) and run["doc"].get("kind") == verb:
            out.append(run)
        else:
            problems.append(f"{verb} on node {str(run['node_id'])[:12]} ({run['address']}): {run['status']}"
                            + (f": {run['message']}" if run.get("message") else ""))
    return out


def plot(report: FleetReport, path: Path) -> Path:
    """Kinds x shape classes, colour = the winner's speed-up over SDPA (annotated with the winner's name).

    Raises:
        UsageError: matplotlib is missing (``pip install 'attnforge[plot]'``), or no bench records.
    """
    from attnforge.errors import UsageError

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib", hint="pip install 'attnforge[plot]'") from None
    if not report.winners:
        raise UsageError("no bench records to plot", hint="run `attnforge fleet bench` first")
    kinds = sorted({w.kind for w in report.winners})
    classes = sorted({w.shape_class for w in report.winners})
    grid = [[float("nan")] * len(classes) for _ in kinds]
    labels = [f"{k}\n{report.kinds.get(k, '')}" for k in kinds]
    label_in = 0.065 * max((len(line) for lab in labels for line in lab.splitlines()), default=10)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(classes) + 2.5 + label_in), max(2.5, 0.75 * len(kinds) + 2.0)))
    for w in report.winners:
        i, j = kinds.index(w.kind), classes.index(w.shape_class)
        grid[i][j] = w.speedup if w.speedup is not None else float("nan")
        ax.text(j, i, f"{w.backend}\n{w.speedup:.2f}x" if w.speedup else w.backend, ha="center", va="center",
                fontsize=7)
    image = ax.imshow(grid, cmap="viridis", aspect="auto")
    fig.colorbar(image, ax=ax, label="speed-up over SDPA")
    ax.set_xticks(range(len(classes)), classes, rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(len(kinds)), labels, fontsize=7)
    ax.set_title("fastest verified backend per kind and shape class")
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")  # every label whole, however long
    plt.close(fig)
    return path
