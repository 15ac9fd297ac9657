"""``fleet install`` / ``verify`` / ``bench``: the single-machine command on every node, records back to the head.

Each node runs exactly what a person would type there (``python -m attnforge install BACKEND --index-url URL
--json``, ``... verify --json``, ``... bench --json``) in a subprocess of that node's interpreter, as one Ray
task pinned to the node (node affinity, hard), so the hash-checked install, the isolated verify children and
the bench are the local ones, unchanged. The head gets each node's exit code and JSON, per node; a node that
leaves mid-way is reported lost and the others finish.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnforge import _serde
from attnforge.fleet import FleetError
from attnforge.fleet.cluster import on_node, task_failure
from attnforge.fleet.kinds import Node, kind_of

#: Seconds one node's command may run before it is reported failed (a bench of the papers' grid takes minutes).
NODE_TIMEOUT_S = 3 * 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRun:
    """One node's run of one command.

    Attributes:
        status: ``ok`` (exit 0), ``failed`` (another exit code; ``message`` says why), ``lost`` (the node or its
            worker went away), ``skipped`` (a GPU command on a node without a GPU; ``message`` says why).
        kind / describe: the node's machine kind.
        rc: the command's exit code (None when lost); doc: its ``--json`` output (None when it printed none).
        command_s: the command's own wall time on the node; wall_s: from the head's submit to the result.
        argv: what ran there after ``python -m attnforge`` (``fleet install``: the node's kind's index URL and
            requirement); None when nothing ran.
    """

    node_id: str
    address: str
    kind: str
    describe: str
    status: str
    rc: int | None = None
    doc: Any = None
    message: str | None = None
    command_s: float | None = None
    wall_s: float | None = None
    argv: tuple[str, ...] | None = None


def node_command(argv: Sequence[str], timeout_s: float) -> dict[str, Any]:
    """Run on a node: ``python -m attnforge ARGV`` in this node's interpreter; returns rc, stdout, stderr's
    last lines and the duration. ``OMP_NUM_THREADS`` (Ray sets it to the task's CPUs, 1) is dropped, so the
    command's CPU side runs as it would when typed on the node; ``CUDA_VISIBLE_DEVICES`` (Ray's GPU grant) stays."""
    from attnforge._system.runner import SubprocessRunner

    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = SubprocessRunner().run([sys.executable, "-m", "attnforge", *argv], env=env, timeout_s=timeout_s)
    return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr[-4000:],
            "duration_s": done.duration_s}


def gpu_gap(node: Node, *, hold_gpu: bool) -> str | None:
    """Why a GPU command skips ``node``: its probe saw no GPU, or (``hold_gpu``: verify, bench) Ray grants none
    there (a task asking ``num_gpus=1`` would wait forever); None when it can run."""
    if not node.snapshot.gpus:
        return "no GPU: skipped (no attention kernel to install, verify or time there)"
    if hold_gpu and node.gpus < 1:
        return ("skipped: Ray grants no GPU on this node (start it with `ray start --num-gpus N`, or Ray did not "
                "detect its GPUs)")
    return None


def run_on_nodes(ray: Any, nodes: Sequence[Node], argv: Sequence[str] | Callable[[Node], Sequence[str] | str],
                 *, timeout_s: float = NODE_TIMEOUT_S,
                 gpu: bool = False, hold_gpu: bool = False,
                 on_event: Callable[[str], None] = lambda _: None) -> list[NodeRun]:
    """``attnforge ARGV`` on every node in parallel (one pinned task each); never raises for one node.

    ``argv`` may depend on the node (``fleet install``: each kind's sub-index): a function of the node giving the
    argv, or a string saying why that node gets nothing (reported ``failed`` with it).

    Each result is reported (``on_event``) as it arrives (``ray.wait``), with a line while none arrives (a busy
    cluster). With ``gpu`` a node without a GPU is ``skipped`` with the reason (:func:`gpu_gap`); with
    ``hold_gpu`` (verify, bench) each task also asks Ray for ``num_gpus=1``, so Ray hands it one GPU
    (``CUDA_VISIBLE_DEVICES``) and runs no other GPU task on it meanwhile (a bench times its GPU alone).

    Raises:
        FleetError: every node was skipped (or none was selected): nothing would run anywhere, which is not a
            success (each node's reason is the cause). Ray is not asked anything then.
    """
    from attnforge.fleet.cluster import as_completed, waiting_line

    start = time.monotonic()
    runs: dict[int, NodeRun] = {}
    todo: list[tuple[int, Node, list[str]]] = []
    for i, node in enumerate(nodes):
        gap = gpu_gap(node, hold_gpu=hold_gpu) if gpu or hold_gpu else None
        mine = argv if not callable(argv) else argv(node) if gap is None else ()  # a skipped node is not planned
        if gap is not None:
            runs[i] = NodeRun(**_base(node), status="skipped", message=gap)
            on_event(f"node {node.node_id[:12]} ({node.address}): {gap}")
        elif isinstance(mine, str):
            runs[i] = NodeRun(**_base(node), status="failed", message=mine)
            on_event(f"node {node.node_id[:12]} ({node.address}): {mine}")
        else:
            todo.append((i, node, list(mine)))
    if not todo and all(r.status == "skipped" for r in runs.values()):
        raise FleetError(
            "no selected node can run this command: " + (f"all {len(nodes)} were skipped" if nodes else "none"),
            cause="; ".join(f"node {r.node_id[:12]} ({r.address}): {r.message}" for r in runs.values()) or None,
            hint="select GPU nodes Ray grants a GPU on (`attnforge fleet probe` lists each node's GPUs; "
                 "`--nodes` picks them; a worker started with `ray start --num-gpus N` offers its GPUs)",
        )
    refs = [on_node(ray, node_command, n.node_id, num_cpus=1 if n.cpus >= 1 else 0, num_gpus=1 if hold_gpu else 0,
                    max_retries=1).remote(a, timeout_s) for _, n, a in todo]
    for j in as_completed(ray, refs, timeout_s=timeout_s + 60,
                          on_idle=lambda done, left: on_event(waiting_line(ray, done, left, gpu=hold_gpu))):
        i, node, ran = todo[j]
        try:
            out = ray.get(refs[j], timeout=0)
        except Exception as exc:  # the node left, its worker died twice, or it hung: this node only
            runs[i] = NodeRun(**_base(node), status="lost", message=task_failure(exc),
                              wall_s=time.monotonic() - start, argv=tuple(ran))
            on_event(f"node {node.node_id[:12]} ({node.address}): lost: {task_failure(exc)}")
            continue
        doc = _json(out["stdout"])
        message = None
        if out["rc"] != 0:
            error = doc.get("error") if isinstance(doc, dict) else None
            message = (error or {}).get("message") if isinstance(error, dict) else None
            message = message or (out["stderr"].strip().splitlines() or [f"exit status {out['rc']}"])[-1]
        runs[i] = NodeRun(**_base(node), status="ok" if out["rc"] == 0 else "failed", rc=out["rc"], doc=doc,
                          message=message, command_s=out["duration_s"], wall_s=time.monotonic() - start,
                          argv=tuple(ran))
        on_event(f"node {node.node_id[:12]} ({node.address}): exit {out['rc']} ({len(runs)} of {len(nodes)})"
                 + (f": {message}" if message else ""))
    return [runs[i] for i in range(len(nodes))]


def _base(node: Node) -> dict[str, Any]:
    kind = kind_of(node.snapshot)
    return {"node_id": node.node_id, "address": node.address, "kind": kind.id, "describe": kind.describe()}


def _json(text: str) -> Any:
    try:
        return _serde.loads(text)
    except ValueError:
        return None


def install_argv(backends: Sequence[str], index_url: str, extra: Sequence[str] = ()) -> list[str]:
    """``install BACKEND... --index-url URL --json`` (the hash-checked install of one machine)."""
    return ["install", *backends, "--index-url", index_url, "--json", *extra]


class InstallArgv:
    """``fleet install``'s command for each node: ``install REQUIREMENT --index-url <URL> --json [--source S]``.

    From a fleet directory index the URL is the node's kind's sub-index
    (:func:`attnforge.fleet.kind_index.kind_index_urls`). An index server has one namespace, so there the
    requirement becomes the exact version of the wheel the kind's plan takes from it
    (:func:`attnforge.fleet.kind_index.server_requirement`; planned once per kind, as ``attnforge plan
    REQUIREMENT --index-url URL --snapshot <kind> [--source S]`` plans it). Called with a node, it gives the argv,
    or a line saying why that node gets nothing (no sub-index, no wheel on the server for its kind).

    Args:
        requirement: ``NAME[specifier]`` as the user typed it; None with ``source`` alone (named by the source).
        index_url: ``fleet install --index-url``; source: ``--source`` (a directory every node can read, a URL).
        home: the head's ``$ATTNFORGE_HOME`` (the kinds' snapshot files of the plan).

    Raises (when called):
        UsageError: a bad requirement or source (exit 2).
    """

    def __init__(self, requirement: str | None, index_url: str, *, source: str | None, home: Path) -> None:
        import urllib.parse

        from attnforge.fleet.kind_index import kind_index_urls

        self.requirement, self.index_url, self.source, self.home = requirement, index_url, source, home
        self.url_of = kind_index_urls(index_url)
        self.server = urllib.parse.urlsplit(index_url).scheme in ("http", "https")
        self._pins: dict[str, str | None] = {}
        self._request: Any = None

    def __call__(self, node: Node) -> list[str] | str:
        kind = kind_of(node.snapshot).id
        url = self.url_of(kind)
        if url is None:
            return (f"{self.index_url} has no sub-index for kind {kind}: `attnforge fleet build` published no "
                    "wheel for it")
        requirement = self._server_pin(node, kind) if self.server else self.requirement
        if self.server and requirement is None:
            return (f"{self.index_url} has no wheel of {self.requirement or self.source} for kind {kind} (`attnforge "
                    "plan --index-url URL` on it would build): run `attnforge fleet build` with this index first")
        return install_argv([requirement] if requirement else [], url, ["--source", self.source] if self.source else [])

    def _server_pin(self, node: Node, kind: str) -> str | None:
        """The pin for ``node``, whose machine kind is ``kind`` (planned once per kind)."""
        from attnforge.fleet.kind_index import server_requirement
        from attnforge.fleet.requests import assemble_for_kinds
        from attnforge.provision import RequestArgs

        if kind not in self._pins:
            if self._request is None:
                args = RequestArgs(source=self.source, index_urls=(self.index_url,))
                (self._request,) = assemble_for_kinds([self.requirement] if self.requirement else [], args,
                                                      [node.snapshot], home=self.home)
            plan = self._request.plan_on(node.snapshot)
            self._pins[kind] = server_requirement(plan, self.index_url, self.requirement or plan.request.backend)
        return self._pins[kind]


def verify_argv(backends: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    return ["verify", *backends, "--json", *extra]


def bench_argv(backends: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    return ["bench", *backends, "--json", *extra]
