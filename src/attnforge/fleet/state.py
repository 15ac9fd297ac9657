"""What the head remembers between fleet commands, under ``$ATTNFORGE_HOME/fleet/``.

- ``nodes.json``: the last probe (node id, address, Ray CPU/memory/GPU, the node's fingerprint, and its snapshot,
  each distinct snapshot stored once), so ``plan``/``build``/rollout probe only the alive nodes it does not know
  yet or whose fingerprint changed (:func:`attnforge.fleet.cluster.node_fingerprint`);
- ``records/<verb>.json``: the last ``fleet install``/``verify``/``bench`` per node, read by ``fleet report``;
- ``logs/``: build logs when the index is a server (a directory index keeps them in ``DIR/.fleet/logs``).

Every file is written atomically (``_system.files.write_atomic``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnforge import _serde
from attnforge._system.files import write_atomic
from attnforge.errors import AttnforgeError, UsageError
from attnforge.fleet.kinds import Node
from attnforge.probe.snapshot import SystemSnapshot


def fleet_dir(home: Path) -> Path:
    path = home / "fleet"
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_nodes(home: Path, nodes: Sequence[Node], *, known: Sequence[Node] | None = None) -> Path:
    """Remember ``nodes`` (merged over ``known``, by default the ones remembered before, by node id); returns the
    file.

    Each distinct snapshot is stored once (a fleet of 10,000 nodes has a few dozen machines' worth of snapshots),
    keyed by :func:`snapshot_digest`; a node keeps its Ray resources, head mark and fingerprint.
    """
    merged = {n.node_id: n for n in (load_nodes(home) if known is None else known)}
    merged.update({n.node_id: n for n in nodes})
    snapshots: dict[str, Any] = {}
    docs = []
    digests: dict[int, str] = {}  # id(snapshot) -> digest: nodes of one probe share the object
    for n in merged.values():
        digest = digests.get(id(n.snapshot))
        if digest is None:
            text = n.snapshot.to_json(indent=None)
            digest = digests[id(n.snapshot)] = snapshot_digest(text)
            snapshots.setdefault(digest, _serde.loads(text))
        docs.append({"node_id": n.node_id, "address": n.address, "cpus": n.cpus, "memory_bytes": n.memory_bytes,
                     "gpus": n.gpus, "head": n.head, "fingerprint": n.fingerprint, "snapshot": digest})
    path = fleet_dir(home) / "nodes.json"
    write_atomic(path, json.dumps({"schema_version": 2, "snapshots": snapshots, "nodes": docs},
                                  separators=(",", ":")).encode())
    return path


def snapshot_digest(text: str) -> str:
    """sha256 (16 hex digits) of a snapshot's JSON without its ``created_at``: two probes of one machine agree."""
    doc = _serde.loads(text)
    doc.pop("created_at", None)
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def load_nodes(home: Path) -> list[Node]:
    """The remembered nodes; none when there is no (readable) record, or one of an older schema (re-probed)."""
    try:
        doc = _serde.loads((home / "fleet" / "nodes.json").read_text(encoding="utf-8"))
        if doc.get("schema_version") != 2:
            return []
        snapshots = {k: SystemSnapshot.from_json(json.dumps(v)) for k, v in doc["snapshots"].items()}
        return [Node(node_id=d["node_id"], address=d["address"], cpus=float(d["cpus"]),
                     memory_bytes=float(d["memory_bytes"]), gpus=float(d.get("gpus", 0.0)),
                     head=bool(d.get("head", False)), fingerprint=str(d.get("fingerprint", "")),
                     snapshot=snapshots[d["snapshot"]]) for d in doc["nodes"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    except AttnforgeError:  # a record of an older snapshot schema: re-probed, never fatal
        return []


def save_records(home: Path, verb: str, doc: dict[str, Any]) -> Path:
    path = fleet_dir(home) / "records" / f"{verb}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(doc, indent=1).encode())
    return path


def load_records(home: Path, verb: str) -> dict[str, Any] | None:
    """The last ``fleet <verb>`` records, None when there are none.

    Raises:
        UsageError: the file exists but is not JSON.
    """
    path = home / "fleet" / "records" / f"{verb}.json"
    if not path.is_file():
        return None
    try:
        doc = _serde.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}", cause=str(exc), hint=f"run `attnforge fleet {verb}` again") from None
    return doc if isinstance(doc, dict) else None
