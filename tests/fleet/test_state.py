"""What the head remembers: each distinct snapshot once, nodes by id, round-trip; small and quick at 10,000 nodes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from attnforge.fleet.kinds import Node
from attnforge.fleet.state import load_nodes, save_nodes
from attnforge.probe.snapshot import SystemSnapshot

SNAPSHOTS = Path(__file__).resolve().parents[1] / "fixtures" / "snapshots"


def _fleet(count: int) -> list[Node]:
    snaps = [SystemSnapshot.load(SNAPSHOTS / f) for f in ("h200_torch2.11_cu130.json", "h100_torch2.8_cu128.json")]
    return [Node(node_id=f"n{i:05d}", address=f"10.0.{i // 250}.{i % 250}", cpus=16, memory_bytes=2.0**37, gpus=8,
                 head=i == 0, fingerprint=f"fp{i % 2}",
                 snapshot=dataclasses.replace(snaps[i % 2], created_at=f"2026-11-26T00:00:{i % 60:02d}"))
            for i in range(count)]


def test_nodes_round_trip_with_each_snapshot_stored_once(attnforge_home: Path) -> None:
    nodes = _fleet(10_000)
    path = save_nodes(attnforge_home, nodes, known=())
    doc = json.loads(path.read_text())
    assert len(doc["snapshots"]) == 2  # created_at aside, two machines
    assert path.stat().st_size < 3_000_000  # a full snapshot per node was 27.8 MB
    back = load_nodes(attnforge_home)
    assert [(n.node_id, n.address, n.cpus, n.gpus, n.head, n.fingerprint) for n in back] == [
        (n.node_id, n.address, n.cpus, n.gpus, n.head, n.fingerprint) for n in nodes]
    assert back[1].snapshot.torch == nodes[1].snapshot.torch and back[0].snapshot.gpus == nodes[0].snapshot.gpus


def test_a_record_of_the_older_schema_is_forgotten_not_fatal(attnforge_home: Path) -> None:
    (attnforge_home / "fleet").mkdir(parents=True)
    (attnforge_home / "fleet" / "nodes.json").write_text(json.dumps({"schema_version": 1, "nodes": [{}]}))
    assert load_nodes(attnforge_home) == []
