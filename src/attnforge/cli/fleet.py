"""``attnforge fleet ...``: attnforge over a Ray cluster (probe, plan, build, install, verify, bench, report).

Each verb is parse -> one library call in :mod:`attnforge.fleet` -> render; this module has the group, ``probe``,
``plan`` and ``build``; :mod:`attnforge.cli.fleet_rollout` the per-node verbs and ``report``. Without
``--address`` Ray's own rule applies (``$RAY_ADDRESS``, a cluster running here, else a local one-node Ray), so
every command works on one machine exactly as on a cluster. Exit codes: 0 ok, 1 not possible (Ray missing or
unreachable, an index down, a build failed, a node lost), 2 bad input, 130 Ctrl-C.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import click

from attnforge.cli._fleet import (
    F,
    address_option,
    check_backend_names,
    cluster,
    head_home,
    node_options,
    say,
    selected_nodes,
)
from attnforge.cli._output import console, emit_json, json_option


def plan_options(func: F) -> F:
    """The options ``plan`` and ``build`` share: the request options of ``attnforge plan`` (one assembly:
    :func:`attnforge.fleet.requests.assemble_for_kinds`) and the node selection."""
    from attnforge.cli._request import _FLAGS, _REPEATED, abi_option, slim_options

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
        abi_option,
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _requests(backends: Sequence[str], snapshots: Sequence[Any], opts: dict[str, Any]) -> list[Any]:
    """One request per backend, assembled by ``attnforge plan``'s own pipeline for every kind's snapshot."""
    from attnforge.fleet.requests import assemble_for_kinds
    from attnforge.provision import RequestArgs

    names = {f for f in RequestArgs.__dataclass_fields__ if f in opts}
    args = RequestArgs(**{k: opts[k] for k in names})
    return assemble_for_kinds(backends, args, snapshots, home=head_home(), on_note=lambda line: say(f"note: {line}"))


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
        with cluster(address, as_json) as ray:
            nodes = selected_nodes(ray, opts, fresh=True)
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

    nodes = load_snapshots(snapshots) if snapshots else selected_nodes(ray, opts)
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
    check_backend_names(backends, opts.get("source"), example="attnforge fleet plan flash-attn")
    if snapshots:
        result, _ = _fleet_plan(backends, snapshots, opts)
    else:
        with cluster(address, as_json) as ray:
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
    check_backend_names(backends, opts.get("source"), example="attnforge fleet build flash-attn")
    builders = Selection.parse(builder_labels)
    home = head_home()
    index = open_index(index_text or str(home / "fleet" / "index"), home=home)
    log_dir = index.root / ".fleet" / "logs" if isinstance(index, DirIndex) else home / "fleet" / "logs"
    interrupted: BuildsInterrupted | None = None
    with cluster(address, as_json) as ray:
        result, nodes = _fleet_plan(backends, snapshots, opts, ray)
        try:
            outcomes = run_builds(ray, result.builds, nodes, index, home=home, log_dir=log_dir, on_event=say,
                                  builders=builders)
        except BuildsInterrupted as exc:
            interrupted, outcomes = exc, exc.outcomes
    bad = [o for o in outcomes if o.status in ("failed", "lost")]
    rc = 128 + interrupted.signum if interrupted else 1 if bad or result.unserved else 0
    kind_urls: dict[str, str] = {}
    kind_pins: dict[str, list[str]] = {}
    if not interrupted:  # what each kind installs (fleet/kind_index.py): its sub-index, and its exact versions
        from attnforge.fleet.kind_index import kind_requirements, publish_kinds

        wheels = {k: [o.wheel for o in outcomes if o.wheel and k in o.build.kinds]
                  for k in {k for o in outcomes if o.wheel for k in o.build.kinds}}
        kind_pins = kind_requirements(wheels)
        if isinstance(index, DirIndex):
            kind_urls = publish_kinds(index, wheels)
    if as_json:
        emit_json("fleet-build", {"index_url": index.pip_url, "kind_index_urls": kind_urls,
                                  "kind_requirements": kind_pins, "plan": _plan_doc(result),
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
    if not kind_urls:  # an index server has one namespace: a kind's wheels by exact version
        for kind, pins in sorted(kind_pins.items()):
            out.print(f"  kind {kind}: pip install --index-url {index.pip_url} "
                      + " ".join(f"'{p}'" for p in pins), markup=False, soft_wrap=True)
    return rc


def _register() -> None:
    from attnforge.cli.fleet_rollout import bench, install, report, verify

    for verb in (install, verify, bench, report):
        command.add_command(verb)


_register()
