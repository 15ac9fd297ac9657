"""Issue 33's six-node case on a real Ray cluster (``ray.cluster_utils.Cluster``, one per module): a CPU-only head
that Ray may not schedule work on (``num_cpus=0``, Ray's advice for a head), two H200 nodes, an A100 and an L40S
without nvcc, and a CPU-only builder with nvcc. Each node claims a recorded probe (``ATTNFORGE_PROBE_SNAPSHOT``,
derived from the recorded H200 one, as in ``tests/fleet/conftest.py``); the build is real (nvcc 13.0 on
``tests/fleet/fixtures/nvcc_ext``).

What it proves, through the command line (``fleet build --json``): every GPU node's kind is served by one build
whose fatbin covers sm_80, sm_89 and sm_90; the build runs on a capable node (never on a node without nvcc, never
on the head Ray gives no CPU); the node Ray picked is killed mid-build (its raylet and workers, ``remove_node``)
and Ray runs the build again on another capable node, which finishes it; every GPU kind's sub-index then hands
its nodes that wheel.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fleet.conftest import NVCC_EXT, OBJECT_STORE, FleetCluster, _pythonpath, make_snapshots

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.integration

#: The GPU-less nodes and the nodes whose snapshot has no CUDA toolkit (the rest have nvcc 13.0).
BUILDERS = ("h200a", "h200b", "cpub")


def _six_snapshots(root: Path) -> dict[str, Path]:
    """cpu (head) and cpub: the recorded H200 probe without GPUs; h200a/h200b: it as recorded; a100 and l40s:
    its GPU swapped (sm_80, sm_89) and no CUDA toolkit."""
    base = make_snapshots(root)
    h200 = json.loads(base["h200"].read_text())
    l40s = json.loads(json.dumps(h200))
    for gpu in l40s["gpus"]:
        gpu.update(name="NVIDIA L40S", compute_capability=[8, 9], memory_bytes=48 * 1024**3)
    l40s["cuda_toolkits"] = []
    out = {"cpu": base["cpu"], "h200a": base["h200"], "h200b": base["h200"], "a100": base["a100"],
           "cpub": base["cpu"], "l40s": root / "l40s.json"}
    out["l40s"].write_text(json.dumps(l40s))
    return out


@dataclass
class SixNodes:
    fc: FleetCluster
    handles: dict[str, Any]  # name -> Ray's node handle (``.node_id``), the head's included


@pytest.fixture(scope="module")
def six(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SixNodes]:
    root = tmp_path_factory.mktemp("six")
    snapshots = _six_snapshots(root / "snapshots")
    homes = {name: root / f"home-{name}" for name in snapshots}

    def env(name: str) -> dict[str, str]:
        return {"ATTNFORGE_PROBE_SNAPSHOT": str(snapshots[name]), "ATTNFORGE_HOME": str(homes[name]),
                "PYTHONPATH": _pythonpath()}

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "num_gpus": 0, "object_store_memory": OBJECT_STORE, "include_dashboard": False,
        "env_vars": env("cpu")})
    handles = {"cpu": cluster.head_node}
    for name in ("h200a", "h200b", "a100", "l40s", "cpub"):
        handles[name] = cluster.add_node(num_cpus=1, num_gpus=0 if name == "cpub" else 1,
                                         object_store_memory=OBJECT_STORE, env_vars=env(name))
    cluster.wait_for_nodes()
    try:
        yield SixNodes(fc=FleetCluster(cluster=cluster, address=cluster.address, snapshots=snapshots, homes=homes),
                       handles=handles)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


def _pid_files(home: Path) -> list[Path]:
    folder = home / "fleet" / "running"
    return list(folder.glob("*.pid")) if folder.is_dir() else []


@pytest.mark.slow
def test_six_nodes_every_gpu_kind_served_and_a_killed_builder_moves_the_build(six: SixNodes, tmp_path: Path) -> None:
    fc = six.fc
    source = tmp_path / "nvcc_ext"
    shutil.copytree(NVCC_EXT, source)
    (source / "af_sleep_s").write_text("6")  # a build slow enough to kill its node mid-way
    index = tmp_path / "index"
    proc = subprocess.Popen([sys.executable, "-m", "attnforge", "fleet", "build", "af-nvcc-fixture", "--source",
                             str(source), "--address", fc.address, "--index", str(index), "--json"],
                            env=fc.env(tmp_path / "head"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    first = None
    while first is None and time.monotonic() < deadline and proc.poll() is None:
        first = next((n for n in fc.homes if _pid_files(fc.homes[n])), None)
        time.sleep(0.2)
    assert first in BUILDERS, (first, proc.poll())  # a capable node with a Ray CPU: not the head, not a100/l40s
    time.sleep(1.0)  # mid-build: the fixture sleeps before nvcc
    fc.cluster.remove_node(six.handles[first])  # the builder dies: its raylet and its workers
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    doc = json.loads(out)

    plan = doc["plan"]
    routes = {r["kind"]: r["route"] for r in plan["routes"]}
    gpu_kinds = {k["id"] for k in plan["kinds"] if not k["describe"].endswith("no GPU")}
    assert len(gpu_kinds) == 3  # H200 (two nodes), A100, L40S
    assert sum(len(k["nodes"]) for k in plan["kinds"] if k["id"] in gpu_kinds) == 4
    assert {routes[k] for k in gpu_kinds} == {"build"} and not plan["unserved"]
    (build,) = plan["builds"]
    assert [list(a) for a in build["archs"]] == [[8, 0], [8, 9], [9, 0]]  # one fatbin for the three GPU kinds
    no_nvcc = {six.handles[n].node_id for n in ("a100", "l40s")}
    assert not no_nvcc & set(build["builder_nodes"])

    (outcome,) = doc["builds"]
    assert outcome["status"] == "built", outcome
    survivors = {six.handles[n].node_id for n in BUILDERS if n != first}
    assert outcome["node"] in survivors  # Ray ran the build again on another capable node
    assert Path(outcome["log_path"]).read_text().count("attempt in worker pid") == 2
    assert sorted(doc["kind_index_urls"]) == sorted(gpu_kinds)  # every GPU kind has its sub-index
    for url in doc["kind_index_urls"].values():
        page = Path(url.removeprefix("file://")) / "af-nvcc-fixture" / "index.html"
        assert outcome["wheel"]["filename"] in page.read_text()
    target = tmp_path / "target"  # an L40S node (no nvcc) installs from its kind's sub-index
    l40s_kind = next(k["id"] for k in plan["kinds"] if k["describe"].endswith("sm_89"))
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target),
                          "--index-url", doc["kind_index_urls"][l40s_kind], "af-nvcc-fixture"],
                         capture_output=True, text=True, check=False)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    archs = subprocess.run([sys.executable, "-c", "import af_nvcc_fixture; print(af_nvcc_fixture.archs())"],
                           cwd=target, capture_output=True, text=True, check=True)
    assert archs.stdout.strip() == "80,89,90"
