"""``attnforge fleet ...``: attnforge over a Ray cluster (probe, plan, build, install, verify, bench, report).

Each verb is parse -> one library call in :mod:`attnforge.fleet` -> render. Without ``--address`` a local one-node
Ray starts (the embedded default), so every command works on one machine exactly as on a cluster. Exit codes:
0 ok, 1 not possible (Ray missing or unreachable, an index down, a build failed, a node lost), 2 bad input.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click

from attnforge.cli._output import console, emit_json, json_option

F = TypeVar("F", bound=Callable[..., Any])


def _home() -> Path:
    from attnforge._system.paths import home_dir

    return home_dir(os.environ)


def address_option(func: F) -> F:
    return click.option("--address", default=None, metavar="HOST:PORT",
                        help="The Ray cluster's head (HOST:PORT, ray://HOST:10001 or auto); default: start a "
                             "local one-node Ray.")(func)


def plan_options(func: F) -> F:
    """The options ``plan`` and ``build`` share: the request options of ``attnforge plan`` (one assembly:
    :func:`attnforge.fleet.requests.assemble_for_kinds`) and the node selection."""
    from attnforge.cli._request import _FLAGS, _REPEATED, slim_options

    helps = {param: (flag, metavar, text) for flag, param, metavar, text in _REPEATED}
    flags = dict(_FLAGS)
    options = [
        address_option,
        node_options,
        click.option("--snapshot", "snapshots", multiple=True, type=click.Path(dir_okay=False),
                     help="Plan for saved `attnforge probe --json` files instead of the cluster's nodes (offline; "
                          "repeat)."),
        click.option("--source", "source", default=None, metavar="PATH_OR_URL",
                     help="Build this source (a directory every builder node can read, an sdist URL, git+URL)."),
        *(click.option(helps[p][0], p, multiple=True, metavar=helps[p][1], help=helps[p][2])
          for p in ("archs", "find_links", "index_urls")),
        *(click.option(flag, is_flag=True, help=flags[flag])
          for flag in ("--from-source", "--offline", "--allow-unsupported-compiler")),
        slim_options,
    ]
    for option in reversed(options):
        func = option(func)
    return func


def node_options(func: F) -> F:
    """``--nodes LABEL=VALUE`` and ``--exclude-head``: which of the cluster's nodes a verb works on."""
    options = [
        click.option("--nodes", "node_labels", multiple=True, metavar="LABEL=VALUE",
                     help="Only nodes whose Ray label LABEL is VALUE (e.g. ray.io/accelerator-type=H100; repeat: "
                          "all must hold)."),
        click.option("--exclude-head", is_flag=True, help="Leave the Ray head node out."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _requests(backends: Sequence[str], snapshots: Sequence[Any], opts: dict[str, Any]) -> list[Any]:
    """One request per backend, assembled by ``attnforge plan``'s own pipeline for every kind's snapshot."""
    from attnforge.fleet.requests import assemble_for_kinds
    from attnforge.install.inputs import RequestArgs

    names = {f for f in RequestArgs.__dataclass_fields__ if f in opts}
    args = RequestArgs(**{k: opts[k] for k in names})
    if not backends and args.source is None:
        from attnforge.errors import UsageError

        raise UsageError("name at least one backend", hint="attnforge fleet plan flash-attn")
    return assemble_for_kinds(backends, args, snapshots, home=_home(), on_note=lambda line: _say(f"note: {line}"))


@contextmanager
def _cluster(address: str | None, as_json: bool = False) -> Iterator[Any]:
    """The connected ``ray`` module. Under ``--json`` everything Ray prints on this process's stdout (worker
    output, worker and node deaths) goes to stderr instead, so stdout carries only the JSON document."""
    import sys
    from contextlib import ExitStack, redirect_stdout

    from attnforge.fleet.cluster import connect

    with ExitStack() as stack:
        if as_json:
            stack.enter_context(redirect_stdout(sys.stderr))
        ray = connect(address, log_to_driver=True)
        try:
            yield ray
        finally:
            if address is None:
                ray.shutdown()


def _nodes(ray: Any, opts: dict[str, Any] | None = None, *, fresh: bool = False) -> list[Any]:
    """The selected alive nodes (``--nodes``, ``--exclude-head``), probing only the ones not remembered (or all
    with ``fresh``); problems go to stderr."""
    from attnforge.fleet.cluster import Selection, probe_nodes
    from attnforge.fleet.state import load_nodes, save_nodes

    opts = opts or {}
    selection = Selection.parse(opts.get("node_labels", ()), exclude_head=opts.get("exclude_head", False))
    home = _home()
    known = load_nodes(home)
    nodes, problems = probe_nodes(ray, known=() if fresh else known, selection=selection)
    for p in problems:
        click.echo(f"warning: {p}", err=True)
    save_nodes(home, nodes, known=known)
    return nodes


def _say(line: str) -> None:
    click.echo(line, err=True)


@click.group("fleet")
def command() -> None:
    """Run attnforge over a Ray cluster: probe every node, plan once, build once per kind, roll out."""


@command.command("probe")
@address_option
@node_options
@click.option("--snapshot", "snapshots", multiple=True, type=click.Path(dir_okay=False),
              help="Group these saved snapshots instead of probing a cluster.")
@json_option
def probe(address: str | None, snapshots: tuple[str, ...], as_json: bool, **opts: Any) -> int:
    """Probe every alive node (one pinned task per node) and group the nodes into machine kinds."""
    from attnforge.fleet.cluster import load_snapshots
    from attnforge.fleet.kinds import group_nodes

    if snapshots:
        nodes = load_snapshots(snapshots)
    else:
        with _cluster(address, as_json) as ray:
            nodes = _nodes(ray, opts, fresh=True)
    groups = group_nodes(nodes)
    if as_json:
        emit_json("fleet-probe", {"kinds": [_kind_doc(g) for g in groups]})
        return 0
    out = console()
    out.print(f"[bold]{len(nodes)} node(s), {len(groups)} machine kind(s)[/bold]")
    for g in groups:
        out.print(f"{g.kind.id}  {len(g.nodes)} node(s)  {g.kind.describe()}", markup=False, soft_wrap=True)
    return 0


def _kind_doc(group: Any) -> dict[str, Any]:
    """A machine kind as every fleet verb prints it in JSON: id, description, the kind, its nodes (id and address;
    their snapshots stay out)."""
    return {"id": group.kind.id, "describe": group.kind.describe(), "kind": group.kind,
            "nodes": [{"node_id": n.node_id, "address": n.address} for n in group.nodes]}


def _plan_doc(plan: Any) -> dict[str, Any]:
    """The fleet plan as ``fleet plan --json`` and ``fleet build --json`` print it: its kinds as :func:`_kind_doc`."""
    return {**{f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)},
            "kinds": [_kind_doc(g) for g in plan.kinds]}


def _outcome_doc(outcome: Any) -> dict[str, Any]:
    """A build's outcome as ``fleet build --json`` prints it: its build's number, key and backend (the whole build
    is in the plan), then the outcome's own fields."""
    build = outcome.build
    return {"number": build.number, "key": build.key, "backend": build.backend,
            **{f.name: getattr(outcome, f.name) for f in dataclasses.fields(outcome) if f.name != "build"}}


def _fleet_plan(backends: Sequence[str], snapshots: tuple[str, ...], opts: dict[str, Any],
                ray: Any = None) -> tuple[Any, list[Any]]:
    from attnforge.catalog import load_catalog
    from attnforge.fleet.cluster import load_snapshots
    from attnforge.fleet.kinds import group_nodes
    from attnforge.fleet.plan import plan_fleet

    nodes = load_snapshots(snapshots) if snapshots else _nodes(ray, opts)
    groups = group_nodes(nodes)
    requests = _requests(backends, [g.snapshot for g in groups], opts)
    return plan_fleet(groups, load_catalog(), requests), nodes


@command.command("plan")
@click.argument("backends", nargs=-1)
@plan_options
@json_option
def plan(backends: tuple[str, ...], address: str | None, snapshots: tuple[str, ...], as_json: bool,
         **opts: Any) -> int:
    """The fewest artifacts that cover every machine kind: kinds x backends -> route, builds, expected time."""
    if snapshots:
        result, _ = _fleet_plan(backends, snapshots, opts)
    else:
        with _cluster(address, as_json) as ray:
            result, _ = _fleet_plan(backends, snapshots, opts, ray)
    if as_json:
        emit_json("fleet-plan", _plan_doc(result))
    else:
        _render_plan(result)
    return 0 if result.unserved == 0 else 1


def _render_plan(result: Any) -> None:
    from rich.table import Table

    out = console()
    table = Table(title="fleet plan", show_lines=False)
    for col in ("kind", "nodes", "machine", "backend", "route", "expected"):
        table.add_column(col)
    kinds = {g.kind.id: g for g in result.kinds}
    for r in result.routes:
        g = kinds[r.kind]
        when = "" if r.expected_s is None else f"~{r.expected_s / 60:.0f} min" if r.expected_s >= 120 else \
            f"~{r.expected_s:.0f} s"
        route = {"none": "[red]cannot be served[/red]", "skipped": "[dim]no GPU: skipped[/dim]"}.get(r.route, r.detail)
        table.add_row(r.kind, str(len(g.nodes)), g.kind.describe(), r.backend, route, when)
    out.print(table)
    _render_builds_and_gaps(out, result)
    out.print(f"{result.artifacts} artifact(s), {len(result.builds)} build(s); expected ~"
              f"{result.expected_total_s / 60:.0f} min one after another", markup=False)


def _render_builds_and_gaps(out: Any, result: Any) -> None:
    """Each build and where it may run; each kind that cannot be served with the resolver's reasons."""
    for b in result.builds:
        out.print(f"build {b.number} of {len(result.builds)}: {b.backend} for "
                  f"{', '.join(map(str, b.archs))} ({b.wheel}) on any of {len(b.builder_nodes)} capable "
                  f"node(s), serves {', '.join(b.kinds)}",
                  markup=False, soft_wrap=True)
    for r in result.routes:
        if r.route == "none":
            out.print(f"{r.kind} cannot get {r.backend}:", markup=False)
            for reason in r.reasons:
                out.print(f"  - {reason}", markup=False, soft_wrap=True)


@command.command("build")
@click.argument("backends", nargs=-1)
@plan_options
@click.option("--index", "index_text", default=None, metavar="DIR|URL",
              help="Where the wheels go: a directory on shared storage (a PEP 503 index; default "
                   "$ATTNFORGE_HOME/fleet/index) or an index server's URL (pypiserver, devpi).")
@click.option("--builders", "builder_labels", multiple=True, metavar="LABEL=VALUE",
              help="Only nodes with this Ray label build (repeat: all must hold); default: any capable node.")
@json_option
def build(backends: tuple[str, ...], address: str | None, snapshots: tuple[str, ...], index_text: str | None,
          *, builder_labels: tuple[str, ...], as_json: bool, **opts: Any) -> int:
    """Run the planned builds as Ray tasks in parallel and publish each wheel to the index (only whole, read back).

    Exit 0 when every build is published or present and every kind is served; 1 otherwise; 130 on Ctrl-C (the
    running builds are cancelled, nothing more is published)."""
    from attnforge.errors import UsageError
    from attnforge.fleet.build import BuildsInterrupted, run_builds
    from attnforge.fleet.cluster import Selection
    from attnforge.fleet.index import DirIndex, open_index

    if snapshots:
        raise UsageError("fleet build runs on the cluster's nodes, not on --snapshot files",
                         hint="use `attnforge fleet plan --snapshot ...` to plan offline")
    builders = Selection.parse(builder_labels)
    home = _home()
    index = open_index(index_text or str(home / "fleet" / "index"), home=home)
    log_dir = index.root / ".fleet" / "logs" if isinstance(index, DirIndex) else home / "fleet" / "logs"
    interrupted: BuildsInterrupted | None = None
    with _cluster(address, as_json) as ray:
        result, nodes = _fleet_plan(backends, snapshots, opts, ray)
        try:
            outcomes = run_builds(ray, result.builds, nodes, index, home=home, log_dir=log_dir, on_event=_say,
                                  builders=builders)
        except BuildsInterrupted as exc:
            interrupted, outcomes = exc, exc.outcomes
    bad = [o for o in outcomes if o.status in ("failed", "lost")]
    rc = 128 + interrupted.signum if interrupted else 1 if bad or result.unserved else 0
    kind_urls: dict[str, str] = {}
    if isinstance(index, DirIndex) and not interrupted:  # each kind's own sub-index (fleet/kind_index.py)
        from attnforge.fleet.kind_index import publish_kinds

        kind_urls = publish_kinds(index, {k: [o.wheel for o in outcomes if o.wheel and k in o.build.kinds]
                                          for k in {k for o in outcomes if o.wheel for k in o.build.kinds}})
    if as_json:
        emit_json("fleet-build", {"index_url": index.pip_url, "kind_index_urls": kind_urls, "plan": _plan_doc(result),
                                  "builds": [_outcome_doc(o) for o in outcomes], "interrupted": bool(interrupted)})
        return rc
    out = console()
    for o in outcomes:
        line = f"build {o.build.number}: {o.status}" + (f" {o.wheel.filename}" if o.wheel else "") + (
            f": {o.failure.message}" if o.failure else "")
        out.print(line, markup=False, soft_wrap=True)
        if o.failure is not None:
            diag = o.failure.diagnosis or {}
            if diag.get("cause"):
                out.print(f"  cause: {diag['cause']}", markup=False, soft_wrap=True)
            for fix in diag.get("fix", ()):
                out.print(f"  fix: {fix}", markup=False, soft_wrap=True)
            if o.log_path:
                out.print(f"  log: {o.log_path}", markup=False, soft_wrap=True)
    if result.unserved:
        _render_builds_and_gaps(out, dataclasses.replace(result, builds=()))
    if interrupted:
        out.print("interrupted: the running builds were cancelled; nothing more was published", markup=False)
    out.print(f"index: {index.pip_url}", markup=False, soft_wrap=True)
    for kind, url in sorted(kind_urls.items()):
        out.print(f"  kind {kind}: {url}", markup=False, soft_wrap=True)
    return rc


def _rollout(verb: str, argvs: list[tuple[str, Any]], address: str | None, as_json: bool,
             opts: dict[str, Any], *, hold_gpu: bool) -> int:
    """Run each argv on every selected GPU node (``hold_gpu``: holding one GPU each); save and print the records;
    exit 1 when a node failed or was lost (a node skipped for want of a GPU is said, not a failure)."""
    import datetime as dt

    from attnforge.fleet.rollout import run_on_nodes
    from attnforge.fleet.state import save_records

    runs = []
    with _cluster(address, as_json) as ray:
        nodes = _nodes(ray, opts)
        for label, argv in argvs:
            for run in run_on_nodes(ray, nodes, argv, gpu=True, hold_gpu=hold_gpu, on_event=_say):
                runs.append({"what": label, **_plain(run)})
    doc = {"verb": verb, "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "nodes": runs}
    save_records(_home(), verb, doc)
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


@command.command("install")
@click.argument("backends", nargs=-1, required=True)
@click.option("--index-url", required=True, metavar="URL", help="The index `fleet build` published to.")
@address_option
@node_options
@json_option
def install(backends: tuple[str, ...], index_url: str, address: str | None, as_json: bool, **opts: Any) -> int:
    """`attnforge install BACKEND --index-url URL` on every GPU node (hash-checked install, then verify); from a
    fleet directory index each node gets its kind's sub-index; a server that falls back to PyPI is refused."""
    from attnforge.catalog import load_catalog
    from attnforge.fleet.kind_index import kind_index_urls, refuse_fallback
    from attnforge.fleet.kinds import kind_of
    from attnforge.fleet.rollout import install_argv
    from attnforge.install.inputs import parse_requirement

    catalog = load_catalog()
    for text in backends:  # bad names exit 2 here, before any node is asked
        catalog.backend(parse_requirement(text)[0])

    refuse_fallback(index_url)  # a server that hands unknown projects to PyPI: exit 1 before any node is asked
    url_of = kind_index_urls(index_url)

    def argv_for(backend: str) -> Callable[[Any], list[str] | str]:
        def argv(node: Any) -> list[str] | str:
            kind = kind_of(node.snapshot).id
            url = url_of(kind)
            return install_argv([backend], url) if url else f"{index_url} has no sub-index for kind {kind}: " \
                "`attnforge fleet build` published no wheel for it"
        return argv

    return _rollout("install", [(b, argv_for(b)) for b in backends], address, as_json, opts, hold_gpu=False)


@command.command("verify")
@click.argument("backends", nargs=-1)
@address_option
@node_options
@json_option
def verify(backends: tuple[str, ...], address: str | None, as_json: bool, **opts: Any) -> int:
    """`attnforge verify [BACKEND...]` on every node (isolated children, float64 reference)."""
    from attnforge.fleet.rollout import verify_argv

    return _rollout("verify", [("verify", verify_argv(backends))], address, as_json, opts, hold_gpu=True)


@command.command("bench")
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


@command.command("report")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a PNG: kinds x shape classes, colour = speed-up over SDPA.")
@json_option
def report(plot_path: Path | None, as_json: bool) -> int:
    """Per kind: each backend's verify verdict and the per-class winner with its margin over SDPA."""
    from attnforge.errors import UsageError
    from attnforge.fleet.report import build_report, plot
    from attnforge.fleet.state import load_records

    home = _home()
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
