"""What the head remembers between fleet commands, under ``$ATTNFORGE_HOME/fleet/``.

- ``nodes.json``: the last probe (node id, address, Ray CPU/memory, snapshot), so ``plan``/``build``/rollout
  probe only the alive nodes it does not know yet;
- ``records/<verb>.json``: the last ``fleet install``/``verify``/``bench`` per node, read by ``fleet report``;
- ``logs/``: build logs when the index is a server (a directory index keeps them in ``DIR/.fleet/logs``).

Every file is written atomically (``_system.files.write_atomic``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnforge._system.files import write_atomic
from attnforge.errors import AttnforgeError, UsageError
from attnforge.fleet.kinds import Node
from attnforge.probe.snapshot import SystemSnapshot


def fleet_dir(home: Path) -> Path:
    path = home / "fleet"
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_nodes(home: Path, nodes: Sequence[Node]) -> Path:
    """Remember ``nodes`` (merged over the ones known before, by node id); returns the file."""
    known = {n.node_id: n for n in load_nodes(home)}
    known.update({n.node_id: n for n in nodes})
    docs = [{"node_id": n.node_id, "address": n.address, "cpus": n.cpus, "memory_bytes": n.memory_bytes,
             "snapshot": json.loads(n.snapshot.to_json(indent=None))} for n in known.values()]
    path = fleet_dir(home) / "nodes.json"
    write_atomic(path, json.dumps({"schema_version": 1, "nodes": docs}).encode())
    return path


def load_nodes(home: Path) -> list[Node]:
    """The remembered nodes; none when there is no (readable) record."""
    try:
        doc = json.loads((home / "fleet" / "nodes.json").read_text(encoding="utf-8"))
        return [Node(node_id=d["node_id"], address=d["address"], cpus=float(d["cpus"]),
                     memory_bytes=float(d["memory_bytes"]),
                     snapshot=SystemSnapshot.from_json(json.dumps(d["snapshot"]))) for d in doc["nodes"]]
    except (OSError, ValueError, KeyError, TypeError):
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
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}", cause=str(exc), hint=f"run `attnforge fleet {verb}` again") from None
    return doc if isinstance(doc, dict) else None
