"""The Ray side of the fleet: connecting, the alive nodes, one task pinned per node, and the per-node probe.

Fan-out, retries, placement and resource sizing are Ray's (tasks, ``NodeAffinitySchedulingStrategy(soft=False)``,
``max_retries``, ``num_cpus``/``memory``); this module decides what runs where and checks what comes back.

**The probe override.** A node whose environment sets ``ATTNFORGE_PROBE_SNAPSHOT=/path/to/snapshot.json``
reports that recorded snapshot (an ``attnforge probe --json`` file) instead of probing itself: tests make each
node of a one-machine Ray cluster a different machine with it (``Cluster.add_node(env_vars=...)``), and an
operator can pin what a node claims to be. Everything else on the node (the build, the rollout) runs for real.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from attnforge.errors import AttnforgeError, ProbeError, UsageError
from attnforge.fleet import FleetError, require_ray
from attnforge.fleet.kinds import Node
from attnforge.probe.snapshot import SystemSnapshot

T = TypeVar("T")

#: The documented override of the node probe (see the module docstring).
SNAPSHOT_ENV = "ATTNFORGE_PROBE_SNAPSHOT"

#: Seconds to wait for a TCP connection to the head, then for its HTTP/2 answer, before calling the address
#: unreachable or not Ray (``ray.init`` itself retries for minutes).
CONNECT_TIMEOUT_S = 5.0

_ADDRESS_RE = re.compile(r"(?:ray://)?(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-_]+):(?P<port>\d{1,5})")


def connect(address: str | None, *, num_cpus: int | None = None, log_to_driver: bool = True) -> Any:
    """Connect to the Ray cluster at ``address`` (``HOST:PORT``, ``ray://HOST:PORT`` or ``auto``), or, when
    ``address`` is None, to ``$RAY_ADDRESS`` / a cluster already running on this machine, else a local one-node
    Ray (Ray's own ``ray.init()`` rule). Returns the ``ray`` module.

    A ``HOST:PORT`` is checked first with a TCP connect and an HTTP/2 handshake (Ray's GCS and its client server
    speak gRPC), each within :data:`CONNECT_TIMEOUT_S`: ``ray.init`` itself retries for minutes against a port
    that is not Ray's.

    Args:
        log_to_driver: stream the workers' output to this process (``--json`` passes False: only JSON on stdout).

    Raises:
        FleetError: ray is missing, or the address does not answer, or not as Ray (exit 1).
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
        _check_grpc(address, match["host"].strip("[]"), int(match["port"]))
    try:
        if address is None:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=log_to_driver)
        else:
            ray.init(address=address, log_to_driver=log_to_driver)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise FleetError(f"cannot connect to Ray at {address}", cause=str(exc).splitlines()[0],
                         hint="check the address; `ray status` on the head prints it") from None
    return ray


#: The HTTP/2 client preface and an empty SETTINGS frame (RFC 9113 section 3.4): a gRPC server answers with its
#: own SETTINGS frame (type 0x4).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes((0, 0, 0, 4, 0, 0, 0, 0, 0))


def _check_grpc(address: str, host: str, port: int) -> None:
    """Raise :class:`FleetError` unless ``host:port`` accepts a TCP connection and answers an HTTP/2 preface with
    a SETTINGS frame, within :data:`CONNECT_TIMEOUT_S` each."""
    hint = ("start one with `ray start --head` on the head node, or check the address (`ray status` on the head "
            "prints it: the GCS port, 6379 by default, or ray://HOST:10001)")
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S) as conn:
            conn.settimeout(CONNECT_TIMEOUT_S)
            conn.sendall(_H2_PREFACE)
            head = b""
            while len(head) < 9:
                chunk = conn.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
    except TimeoutError:
        raise FleetError(f"{address} does not answer as a Ray cluster", cause=f"no HTTP/2 (gRPC) answer within "
                         f"{CONNECT_TIMEOUT_S:.0f} s: something else listens on that port", hint=hint) from None
    except OSError as exc:
        raise FleetError(f"no Ray cluster answers at {address}", cause=str(exc), hint=hint) from None
    if len(head) < 9 or head[3] != 4:
        raise FleetError(f"{address} does not answer as a Ray cluster",
                         cause=f"the port answered {head[:16]!r}, not an HTTP/2 (gRPC) SETTINGS frame", hint=hint)


@dataclass(frozen=True, slots=True, kw_only=True)
class Selection:
    """Which alive nodes a fleet verb works on: every one of ``labels`` (Ray node labels, ``LABEL=VALUE``) must
    hold, and the head is left out with ``exclude_head``."""

    labels: tuple[tuple[str, str], ...] = ()
    exclude_head: bool = False

    @classmethod
    def parse(cls, texts: Sequence[str], *, exclude_head: bool = False) -> Selection:
        """``("ray.io/accelerator-type=H100",)`` -> a selection.

        Raises:
            UsageError: an entry is not ``LABEL=VALUE``.
        """
        labels = []
        for text in texts:
            key, sep, value = text.partition("=")
            if not sep or not key.strip() or not value.strip():
                raise UsageError(f"not a node label: {text!r}",
                                 hint="write LABEL=VALUE, e.g. --nodes ray.io/accelerator-type=H100")
            labels.append((key.strip(), value.strip()))
        return cls(labels=tuple(labels), exclude_head=exclude_head)

    def admits(self, record: Mapping[str, Any]) -> bool:
        """Whether Ray's record of a node (``ray.nodes()``) is selected."""
        if self.exclude_head and is_head(record):
            return False
        labels = record.get("Labels") or {}
        return all(str(labels.get(k)) == v for k, v in self.labels)

    def __str__(self) -> str:
        return " ".join([*(f"--nodes {k}={v}" for k, v in self.labels), *(["--exclude-head"] if self.exclude_head
                                                                          else [])])


def is_head(record: Mapping[str, Any]) -> bool:
    """Ray marks its head node with the resource ``node:__internal_head__``."""
    return "node:__internal_head__" in (record.get("Resources") or {})


def alive_nodes(ray: Any) -> list[dict[str, Any]]:
    """Ray's records of the alive nodes (``NodeID``, ``NodeManagerAddress``, ``Resources``), in a stable order."""
    return sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: str(n["NodeID"]))


def on_node(ray: Any, func: Callable[..., T], node_id: str, **options: Any) -> Any:
    """``func`` as a Ray task pinned to ``node_id`` (node affinity, hard: it never runs elsewhere)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    return ray.remote(func).options(scheduling_strategy=strategy, **options)


#: Seconds without any result before :func:`as_completed` says what is still pending.
IDLE_LINE_S = 30.0


def as_completed(ray: Any, refs: Sequence[Any], *, on_idle: Callable[[int, int], None] = lambda _done, _left: None,
                 idle_s: float = IDLE_LINE_S, timeout_s: float | None = None) -> Iterator[int]:
    """The positions of ``refs`` in the order their results arrive (``ray.wait``), so a caller reports each as it
    comes; ``on_idle(done, left)`` every ``idle_s`` without a result (a busy cluster: tasks waiting for
    resources). After ``timeout_s`` the rest are yielded as they are (``ray.get`` then raises for them)."""
    pending = {ref: i for i, ref in enumerate(refs)}
    start = time.monotonic()
    while pending:
        left_s = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - start))
        wait_s = idle_s if left_s is None else min(idle_s, left_s)
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=wait_s)
        if not ready:
            if left_s is not None and left_s <= wait_s:
                yield from sorted(pending.values())
                return
            on_idle(len(refs) - len(pending), len(pending))
            continue
        for ref in ready:
            yield pending.pop(ref)


def waiting_line(ray: Any, done: int, left: int, *, gpu: bool = False) -> str:
    """``3 of 8 done; 5 running or waiting for resources (free now: 0 GPU, 2 CPU; `ray status` shows the
    demands)``: what a busy cluster looks like from the head."""
    try:
        free = ray.available_resources()
    except Exception:
        free = {}
    what = f"{free.get('GPU', 0):g} GPU, {free.get('CPU', 0):g} CPU" if gpu else f"{free.get('CPU', 0):g} CPU"
    return (f"{done} of {done + left} done; {left} running or waiting for resources (free now: {what}; "
            "`ray status` shows the pending demands)")


def on_nodes(ray: Any, func: Callable[..., T], node_ids: Sequence[str], **options: Any) -> Any:
    """``func`` as a Ray task that may run on any of ``node_ids`` (a label selector on Ray's ``ray.io/node-id``
    label, hard): Ray's scheduler picks one with the resources free, and a retry goes to any of them again."""
    selector = {"ray.io/node-id": f"in({','.join(node_ids)})"}
    return ray.remote(func).options(label_selector=selector, **options)


def node_fingerprint() -> str:
    """Run on a node: a cheap digest of what its probe depends on and what changes under a running fleet: the
    interpreter, torch's installed version, the NVIDIA driver, the CUDA toolkit's version file, and the
    ``$ATTNFORGE_PROBE_SNAPSHOT`` file (path, size, mtime). Milliseconds: no torch import, no ``nvidia-smi``."""
    import hashlib
    import importlib.metadata
    import sys
    from pathlib import Path

    parts = [sys.executable, sys.version]
    try:
        parts.append(importlib.metadata.version("torch"))
    except importlib.metadata.PackageNotFoundError:
        parts.append("no torch")
    for path in (Path("/proc/driver/nvidia/version"), Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
                 / "version.json"):
        try:
            parts.append(path.read_text(encoding="utf-8", errors="replace")[:4096])
        except OSError:
            parts.append(f"no {path}")
    override = os.environ.get(SNAPSHOT_ENV)
    if override:
        try:
            st = os.stat(override)
            parts.append(f"{override} {st.st_size} {st.st_mtime_ns}")
        except OSError:
            parts.append(f"{override} missing")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def node_probe() -> tuple[str, str]:
    """Run on a node: (its :func:`node_fingerprint`, its snapshot as JSON), the snapshot from
    ``$ATTNFORGE_PROBE_SNAPSHOT`` when set, else a fresh probe of this interpreter (``collect_snapshot``, which
    never raises). An override file that is not a snapshot raises :class:`ProbeError` (reported per node by
    :func:`probe_nodes`)."""
    fingerprint = node_fingerprint()
    path = os.environ.get(SNAPSHOT_ENV)
    if path:
        from pathlib import Path

        return fingerprint, SystemSnapshot.load(Path(path)).to_json(indent=None)
    from attnforge.catalog import load_catalog
    from attnforge.probe import collect_snapshot

    return fingerprint, collect_snapshot(backends=load_catalog().backends.values()).to_json(indent=None)


def probe_nodes(ray: Any, *, known: Sequence[Node] = (), timeout_s: float = 600.0,
                selection: Selection | None = None) -> tuple[list[Node], list[str]]:
    """Probe every selected alive node with one task pinned to it; returns (nodes, one problem line per node that
    failed or left). A node in ``known`` (by id) is probed again only when its :func:`node_fingerprint` changed
    (torch upgraded, a new driver); else its snapshot is reused and its Ray resources refreshed.

    Raises:
        FleetError: no node is alive (or none is selected).
    """
    selection = selection or Selection()
    all_records = [r for r in alive_nodes(ray) if selection.admits(r)]
    if not all_records:
        chosen = f" that matches {selection}" if str(selection) else ""
        raise FleetError(f"the Ray cluster has no alive node{chosen}",
                         hint="`ray status` shows the cluster's nodes; `ray list nodes --detail` their labels")
    remembered = {n.node_id: n for n in known}
    again = [r for r in all_records if str(r["NodeID"]) in remembered]
    prints = [on_node(ray, node_fingerprint, str(r["NodeID"]), num_cpus=0, max_retries=1).remote() for r in again]
    kept: list[Node] = []
    for record, ref in zip(again, prints, strict=True):
        old = remembered[str(record["NodeID"])]
        try:
            if ray.get(ref, timeout=timeout_s) == old.fingerprint:
                kept.append(_with_resources(old, record))
        except Exception:  # noqa: S112 - probed again below, which reports the node if it is gone
            continue
    fresh = {n.node_id for n in kept}
    records = [r for r in all_records if str(r["NodeID"]) not in fresh]
    refs = [on_node(ray, node_probe, str(r["NodeID"]), num_cpus=0, max_retries=1).remote() for r in records]
    nodes: list[Node] = []
    problems: list[str] = []
    for record, ref in zip(records, refs, strict=True):
        node_id, address = str(record["NodeID"]), str(record.get("NodeManagerAddress", "?"))
        try:
            fingerprint, text = ray.get(ref, timeout=timeout_s)
            snapshot = SystemSnapshot.from_json(text)
        except AttnforgeError as exc:
            problems.append(f"node {node_id[:12]} ({address}): {exc.message}")
            continue
        except Exception as exc:  # a task error, a node that left, a timeout: the node is reported, others go on
            problems.append(f"node {node_id[:12]} ({address}): lost ({task_failure(exc)})")
            continue
        nodes.append(_with_resources(Node(node_id=node_id, address=address, snapshot=snapshot,
                                          fingerprint=fingerprint), record))
    return [*nodes, *kept], problems


def _with_resources(node: Node, record: Mapping[str, Any]) -> Node:
    """``node`` with the Ray resources (CPU, memory, GPU) and head mark of its current record."""
    res = record.get("Resources", {})
    return dataclasses.replace(node, cpus=float(res.get("CPU", 0.0)), memory_bytes=float(res.get("memory", 0.0)),
                               gpus=float(res.get("GPU", 0.0)), head=is_head(record))


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
