"""``attnforge fleet install / verify / bench / report``: the single-machine command on every selected GPU node,
records back to the head, and the report over them. Each verb: parse -> one library call -> render."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from attnforge.cli._fleet import (
    address_option,
    check_backend_names,
    cluster,
    head_home,
    node_options,
    say,
    selected_nodes,
)
from attnforge.cli._output import console, emit_json, json_option


def _rollout(verb: str, argvs: list[tuple[str, Any]], address: str | None, as_json: bool,
             opts: dict[str, Any], *, hold_gpu: bool) -> int:
    """Run each argv on every selected GPU node (``hold_gpu``: holding one GPU each); save and print the records;
    exit 1 when a node failed or was lost (a node skipped for want of a GPU is said, not a failure)."""
    import datetime as dt

    from attnforge.fleet.rollout import run_on_nodes
    from attnforge.fleet.state import save_records

    runs = []
    with cluster(address, as_json) as ray:
        nodes = selected_nodes(ray, opts)
        for label, argv in argvs:
            for run in run_on_nodes(ray, nodes, argv, gpu=True, hold_gpu=hold_gpu, on_event=say):
                runs.append({"what": label, **_plain(run)})
    doc = {"verb": verb, "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "nodes": runs}
    save_records(head_home(), verb, doc)
    failed = [r for r in runs if r["status"] in ("failed", "lost")]
    if as_json:
        emit_json(f"fleet-{verb}", doc)
        return 1 if failed else 0
    out = console()
    for r in runs:
        out.print(f"{r['node_id'][:12]} {r['address']} {r['kind']} {r['what']}: {r['status']}"
                  + (f" ({r['command_s']:.1f} s on the node, {r['wall_s']:.1f} s from the head)" if r["command_s"]
                     else "") + (f": {r['message']}" if r.get("message") else ""), markup=False, soft_wrap=True)
    return 1 if failed else 0


def _plain(run: Any) -> dict[str, Any]:
    from attnforge._serde import to_jsonable

    doc: dict[str, Any] = to_jsonable(run)
    return doc


@click.command("install")
@click.argument("backends", nargs=-1)
@click.option("--index-url", required=True, metavar="URL", help="The index `fleet build` published to.")
@click.option("--source", "source", default=None, metavar="PATH_OR_URL",
              help="The source `fleet build --source` built (its name need not be a catalog id; a directory every "
                   "node can read at that path).")
@address_option
@node_options
@json_option
def install(backends: tuple[str, ...], index_url: str, source: str | None, address: str | None, as_json: bool,
            **opts: Any) -> int:
    """`attnforge install BACKEND --index-url URL` on every GPU node (hash-checked install, then verify); from a
    fleet directory index each node gets its kind's sub-index, from an index server the exact version its kind
    takes there; a server that falls back to PyPI is refused."""
    from attnforge.fleet.kind_index import refuse_fallback
    from attnforge.fleet.rollout import InstallArgv

    check_backend_names(backends, source, example="attnforge fleet install flash-attn --index-url URL")
    refuse_fallback(index_url)  # a server that hands unknown projects to PyPI: exit 1 before any node is asked
    texts: list[str | None] = list(backends) or [None]
    return _rollout("install", [(t or str(source), InstallArgv(t, index_url, source=source, home=head_home()))
                                for t in texts], address, as_json, opts, hold_gpu=False)


@click.command("verify")
@click.argument("backends", nargs=-1)
@address_option
@node_options
@json_option
def verify(backends: tuple[str, ...], address: str | None, as_json: bool, **opts: Any) -> int:
    """`attnforge verify [BACKEND...]` on every node (isolated children, float64 reference)."""
    from attnforge.fleet.rollout import verify_argv

    return _rollout("verify", [("verify", verify_argv(backends))], address, as_json, opts, hold_gpu=True)


@click.command("bench")
@click.argument("backends", nargs=-1)
@click.option("--model", type=click.Path(dir_okay=False), default=None, help="Time a config.json's classes.")
@click.option("--arg", "extra", multiple=True, metavar="ARG",
              help="Pass ARG to `attnforge bench` on each node (repeat: --arg=--seqlen --arg=128).")
@address_option
@node_options
@json_option
def bench(backends: tuple[str, ...], model: str | None, extra: tuple[str, ...], address: str | None,
          as_json: bool, **opts: Any) -> int:
    """`attnforge bench [BACKEND...]` on every node; records come back for `fleet report`."""
    from attnforge.fleet.rollout import bench_argv

    args = [*(["--shapes", "model", "--model", model] if model else []), *extra]
    return _rollout("bench", [("bench", bench_argv(backends, args))], address, as_json, opts, hold_gpu=True)


def _render_node_table(out: Any, rows: Sequence[Any]) -> None:
    """One row per node and backend: kind, version, verified, best TFLOP/s per shape class."""
    from rich.table import Table

    table = Table(title="per node")
    for col in ("node", "address", "kind", "backend", "version", "verified", "best TFLOP/s per class"):
        table.add_column(col)
    for r in rows:
        verified = "-" if r.verified is None else "yes" if r.verified else "[red]FAILED[/red]"
        speeds = "; ".join(f"{cls}: {t:.3g}" for cls, t in sorted(r.tflops.items())) or "-"
        table.add_row(r.node_id[:12], r.address, r.kind, r.backend, r.version or "-", verified, speeds)
    out.print(table)


@click.command("report")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a PNG: kinds x shape classes, colour = speed-up over SDPA.")
@json_option
def report(plot_path: Path | None, as_json: bool) -> int:
    """Per kind: each backend's verify verdict and the per-class winner with its margin over SDPA."""
    from attnforge.errors import UsageError
    from attnforge.fleet.report import build_report, plot
    from attnforge.fleet.state import load_records

    home = head_home()
    verify_doc, bench_doc = load_records(home, "verify"), load_records(home, "bench")
    if verify_doc is None and bench_doc is None:
        raise UsageError("no fleet records yet", hint="run `attnforge fleet verify` and `attnforge fleet bench`")
    result = build_report(verify_doc, bench_doc)
    if plot_path is not None:
        plot(result, plot_path)
    if as_json:
        emit_json("fleet-report", result)
        return 0
    out = console()
    for kind, describe in result.kinds.items():
        out.print(f"[bold]{kind}[/bold] {describe}", soft_wrap=True)
        for v in (v for v in result.verdicts if v.kind == kind):
            verdict = "passed" if v.ok else f"FAILED on {v.nodes - v.passed_nodes} of {v.nodes} node(s)"
            out.print(f"  verify {v.backend}: {verdict} ({v.summary})", markup=False, soft_wrap=True)
        for w in (w for w in result.winners if w.kind == kind):
            speed = f"{w.speedup:.2f}x SDPA" if w.speedup is not None else "no SDPA figure"
            out.print(f"  {w.shape_class}: {w.backend} ({speed})", markup=False, soft_wrap=True)
    if result.nodes:
        _render_node_table(out, result.nodes)
    for p in result.problems:
        out.print(f"note: {p}", markup=False, soft_wrap=True)
    if plot_path is not None:
        out.print(f"plot: {plot_path}", markup=False)
    return 0
