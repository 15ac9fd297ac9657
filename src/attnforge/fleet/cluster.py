"""The Ray side of the fleet: connecting, the alive nodes, one task pinned per node, and the per-node probe.

Fan-out, retries, placement and resource sizing are Ray's (tasks, ``NodeAffinitySchedulingStrategy(soft=False)``,
``max_retries``, ``num_cpus``/``memory``); this module decides what runs where and checks what comes back.

**The probe override.** A node whose environment sets ``ATTNFORGE_PROBE_SNAPSHOT=/path/to/snapshot.json``
reports that recorded snapshot (an ``attnforge probe --json`` file) instead of probing itself: tests make each
node of a one-machine Ray cluster a different machine with it (``Cluster.add_node(env_vars=...)``), and an
operator can pin what a node claims to be. Everything else on the node (the build, the rollout) runs for real.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from attnforge.errors import AttnforgeError, ProbeError, UsageError
from attnforge.fleet import FleetError, require_ray
from attnforge.fleet.kinds import Node
from attnforge.probe.snapshot import SystemSnapshot

T = TypeVar("T")

#: The documented override of the node probe (see the module docstring).
SNAPSHOT_ENV = "ATTNFORGE_PROBE_SNAPSHOT"

#: Seconds to wait for a TCP connection to the head before calling the address unreachable (``ray.init`` itself
#: retries for minutes).
CONNECT_TIMEOUT_S = 5.0

_ADDRESS_RE = re.compile(r"(?:ray://)?(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-_]+):(?P<port>\d{1,5})")


def connect(address: str | None, *, num_cpus: int | None = None) -> Any:
    """Connect to the Ray cluster at ``address`` (``HOST:PORT``, ``ray://HOST:PORT`` or ``auto``), or start a
    local one-node Ray when ``address`` is None (the embedded default). Returns the ``ray`` module.

    Raises:
        FleetError: ray is missing, or the address does not answer (exit 1).
        UsageError: the address is not ``HOST:PORT`` (exit 2).
    """
    ray = require_ray()
    if ray.is_initialized():
        return ray
    if address is not None and address != "auto":
        match = _ADDRESS_RE.fullmatch(address.strip())
        if match is None or not 0 < int(match["port"]) < 65536:
            raise UsageError(f"not a Ray address: {address!r}",
                             hint="give the head's HOST:PORT (e.g. 10.0.0.1:6379), ray://HOST:10001, or auto")
        host, port = match["host"].strip("[]"), int(match["port"])
        try:
            with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
                pass
        except OSError as exc:
            raise FleetError(f"no Ray cluster answers at {address}", cause=str(exc),
                             hint="start one with `ray start --head` on the head node, or check the address "
                                  "(`ray status` on the head prints it)") from None
    try:
        if address is None:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
        else:
            ray.init(address=address, log_to_driver=True)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise FleetError(f"cannot connect to Ray at {address}", cause=str(exc).splitlines()[0],
                         hint="check the address; `ray status` on the head prints it") from None
    return ray


def alive_nodes(ray: Any) -> list[dict[str, Any]]:
    """Ray's records of the alive nodes (``NodeID``, ``NodeManagerAddress``, ``Resources``), in a stable order."""
    return sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: str(n["NodeID"]))


def on_node(ray: Any, func: Callable[..., T], node_id: str, **options: Any) -> Any:
    """``func`` as a Ray task pinned to ``node_id`` (node affinity, hard: it never runs elsewhere)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    return ray.remote(func).options(scheduling_strategy=strategy, **options)


def node_probe() -> str:
    """Run on a node: its snapshot as JSON, from ``$ATTNFORGE_PROBE_SNAPSHOT`` when set, else a fresh probe of
    this interpreter (``collect_snapshot``, which never raises). An override file that is not a snapshot raises
    :class:`ProbeError` (reported per node by :func:`probe_nodes`)."""
    path = os.environ.get(SNAPSHOT_ENV)
    if path:
        from pathlib import Path

        return SystemSnapshot.load(Path(path)).to_json(indent=None)
    from attnforge.catalog import load_catalog
    from attnforge.probe import collect_snapshot

    return collect_snapshot(backends=load_catalog().backends.values()).to_json(indent=None)


def probe_nodes(ray: Any, *, known: Sequence[Node] = (), timeout_s: float = 600.0) -> tuple[list[Node], list[str]]:
    """Probe every alive node with one task pinned to it; returns (nodes, one problem line per node that failed
    or left). Nodes in ``known`` (by id) are not probed again; their Ray resources are refreshed.

    Raises:
        FleetError: no node is alive.
    """
    all_records = alive_nodes(ray)
    if not all_records:
        raise FleetError("the Ray cluster has no alive node", hint="`ray status` shows the cluster's nodes")
    remembered = {n.node_id: n for n in known}
    records = [r for r in all_records if str(r["NodeID"]) not in remembered]
    refs = [on_node(ray, node_probe, str(r["NodeID"]), num_cpus=0, max_retries=1).remote() for r in records]
    nodes: list[Node] = []
    problems: list[str] = []
    for record, ref in zip(records, refs, strict=True):
        node_id, address = str(record["NodeID"]), str(record.get("NodeManagerAddress", "?"))
        try:
            text = ray.get(ref, timeout=timeout_s)
            snapshot = SystemSnapshot.from_json(text)
        except AttnforgeError as exc:
            problems.append(f"node {node_id[:12]} ({address}): {exc.message}")
            continue
        except Exception as exc:  # a task error, a node that left, a timeout: the node is reported, others go on
            problems.append(f"node {node_id[:12]} ({address}): lost ({task_failure(exc)})")
            continue
        res = record.get("Resources", {})
        nodes.append(Node(node_id=node_id, address=address, snapshot=snapshot,
                          cpus=float(res.get("CPU", 0.0)), memory_bytes=float(res.get("memory", 0.0))))
    for record in all_records:
        old = remembered.get(str(record["NodeID"]))
        if old is not None:
            res = record.get("Resources", {})
            nodes.append(Node(node_id=old.node_id, address=old.address, snapshot=old.snapshot,
                              cpus=float(res.get("CPU", 0.0)), memory_bytes=float(res.get("memory", 0.0))))
    return nodes, problems


def task_failure(exc: BaseException) -> str:
    """One line for a failed Ray task: the remote error's own message when there is one, else its type."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, AttnforgeError):
        return cause.message
    text = str(cause or exc).strip().splitlines()
    last = next((line for line in reversed(text) if line.strip()), "")
    return f"{type(exc).__name__}: {last}"[:300] if last else type(exc).__name__


def load_snapshots(paths: Sequence[str]) -> list[Node]:
    """Nodes from ``--snapshot`` files (offline planning): one node per file, named by the file.

    Raises:
        ProbeError: a file is not an attnforge snapshot (exit 2, with the hint to write one).
    """
    from pathlib import Path

    nodes = []
    for path in paths:
        try:
            snapshot = SystemSnapshot.load(Path(path))
        except ProbeError as exc:
            raise ProbeError(f"{path}: {exc.message}", cause=exc.cause, hint=exc.hint) from None
        nodes.append(Node(node_id=Path(path).name, address=path, snapshot=snapshot))
    return nodes
