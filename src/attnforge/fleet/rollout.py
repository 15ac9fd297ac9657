"""``fleet install`` / ``verify`` / ``bench``: the single-machine command on every node, records back to the head.

Each node runs exactly what a person would type there (``python -m attnforge install BACKEND --index-url URL
--json``, ``... verify --json``, ``... bench --json``) in a subprocess of that node's interpreter, as one Ray
task pinned to the node (node affinity, hard), so the hash-checked install, the isolated verify children and
the bench are the local ones, unchanged. The head gets each node's exit code and JSON, per node; a node that
leaves mid-way is reported lost and the others finish.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from attnforge.fleet.cluster import on_node, task_failure
from attnforge.fleet.kinds import Node, kind_of

#: Seconds one node's command may run before it is reported failed (a bench of the papers' grid takes minutes).
NODE_TIMEOUT_S = 3 * 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRun:
    """One node's run of one command.

    Attributes:
        status: ``ok`` (exit 0), ``failed`` (another exit code; ``message`` says why), ``lost`` (the node or its
            worker went away).
        kind / describe: the node's machine kind.
        rc: the command's exit code (None when lost); doc: its ``--json`` output (None when it printed none).
        command_s: the command's own wall time on the node; wall_s: from the head's submit to the result.
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


def node_command(argv: Sequence[str], timeout_s: float) -> dict[str, Any]:
    """Run on a node: ``python -m attnforge ARGV`` in this node's interpreter; returns rc, stdout, stderr's
    last lines and the duration."""
    from attnforge._system.runner import SubprocessRunner

    done = SubprocessRunner().run([sys.executable, "-m", "attnforge", *argv], timeout_s=timeout_s)
    return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr[-4000:],
            "duration_s": done.duration_s}


def run_on_nodes(ray: Any, nodes: Sequence[Node], argv: Sequence[str], *, timeout_s: float = NODE_TIMEOUT_S,
                 on_event: Callable[[str], None] = lambda _: None) -> list[NodeRun]:
    """``attnforge ARGV`` on every node in parallel (one pinned task each); never raises for one node."""
    start = time.monotonic()
    refs = [on_node(ray, node_command, n.node_id, num_cpus=1 if n.cpus >= 1 else 0, max_retries=1,
                    ).remote(list(argv), timeout_s) for n in nodes]
    runs: list[NodeRun] = []
    for node, ref in zip(nodes, refs, strict=True):
        kind = kind_of(node.snapshot)
        base: dict[str, Any] = {"node_id": node.node_id, "address": node.address, "kind": kind.id,
                                "describe": kind.describe()}
        try:
            out = ray.get(ref, timeout=timeout_s + 60)
        except Exception as exc:  # the node left, its worker died twice, or it hung: this node only
            runs.append(NodeRun(**base, status="lost", message=task_failure(exc),
                                wall_s=time.monotonic() - start))
            on_event(f"node {node.node_id[:12]} ({node.address}): lost: {task_failure(exc)}")
            continue
        doc = _json(out["stdout"])
        message = None
        if out["rc"] != 0:
            error = doc.get("error") if isinstance(doc, dict) else None
            message = (error or {}).get("message") if isinstance(error, dict) else None
            message = message or (out["stderr"].strip().splitlines() or [f"exit status {out['rc']}"])[-1]
        runs.append(NodeRun(**base, status="ok" if out["rc"] == 0 else "failed", rc=out["rc"], doc=doc,
                            message=message, command_s=out["duration_s"], wall_s=time.monotonic() - start))
        on_event(f"node {node.node_id[:12]} ({node.address}): exit {out['rc']}" + (f": {message}" if message else ""))
    return runs


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def install_argv(backends: Sequence[str], index_url: str, extra: Sequence[str] = ()) -> list[str]:
    """``install BACKEND... --index-url URL --json`` (the hash-checked install of one machine)."""
    return ["install", *backends, "--index-url", index_url, "--json", *extra]


def verify_argv(backends: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    return ["verify", *backends, "--json", *extra]


def bench_argv(backends: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    return ["bench", *backends, "--json", *extra]
