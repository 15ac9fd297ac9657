"""A real four-node Ray cluster on this machine (``ray.cluster_utils.Cluster``), one per test module.

Each node is made a different machine through the probe's documented override ``ATTNFORGE_PROBE_SNAPSHOT``
(set in the node's own environment with ``env_vars``): a CPU-only Linux head (the recorded H200 probe without its
GPUs: the same wheel key, nvcc, no GPU), an H200 Linux node (the recorded H200 probe), an A100 Linux node without
nvcc (the same machine with its GPU swapped for an A100 and no CUDA toolkit: it cannot build, another node builds
for it) and an RTX 5090 Windows node (the recorded Windows probe). The Linux snapshots point their interpreter at
this one (``sys.executable``) and its Python version, so the builds they plan run here for real and their wheels
fit the kinds' tags. Every node has its own
``ATTNFORGE_HOME``, 1 CPU and an 80 MB object store; the GPU nodes tell Ray they have one GPU (``num_gpus=1``).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "snapshots"
FLEET_FIXTURES = Path(__file__).resolve().parent / "fixtures"
NVCC_EXT = FLEET_FIXTURES / "nvcc_ext"
OBJECT_STORE = 80 * 1024 * 1024


def make_snapshots(root: Path) -> dict[str, Path]:
    """The node snapshots (see the module docstring), written under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    h200 = json.loads((FIXTURES / "h200_torch2.11_cu130.json").read_text())
    h200["platform"]["python_executable"] = sys.executable
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"  # the Python of that interpreter: its wheels fit the kind
    h200["platform"]["python_version"] = platform.python_version()
    h200["platform"]["wheel_tag"] = f"{py}-{py}-" + h200["platform"]["wheel_tag"].split("-", 2)[2]
    h200["platform"]["disk_path"] = str(root / "disk")
    a100 = json.loads(json.dumps(h200))
    for gpu in a100["gpus"]:
        gpu.update(name="NVIDIA A100-SXM4-80GB", compute_capability=[8, 0], memory_bytes=85899345920)
    a100["cuda_toolkits"] = []
    cpu = json.loads(json.dumps(h200))
    cpu["gpus"] = []
    win = json.loads((FIXTURES / "windows_rtx5090_torch2.8_cu128.json").read_text())
    out = {}
    for name, doc in (("cpu", cpu), ("h200", h200), ("a100", a100), ("win5090", win)):
        out[name] = root / f"{name}.json"
        out[name].write_text(json.dumps(doc))
    return out


def _pythonpath() -> str:
    """This worktree's ``src`` first, so every node's workers import the attnforge under test."""
    return str(Path(__file__).resolve().parents[2] / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")


@dataclass
class FleetCluster:
    cluster: Cluster
    address: str
    snapshots: dict[str, Path]
    homes: dict[str, Path]

    def node_env(self, snapshot: Path, home: Path) -> dict[str, str]:
        """``env_vars`` of an extra node: claims ``snapshot``, its own home, this worktree's attnforge."""
        return {"ATTNFORGE_PROBE_SNAPSHOT": str(snapshot), "ATTNFORGE_HOME": str(home), "PYTHONPATH": _pythonpath()}

    def env(self, home: Path) -> dict[str, str]:
        """Environment for a CLI subprocess that talks to this cluster."""
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2] / "src")
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        env["ATTNFORGE_HOME"] = str(home)
        env.pop("RAY_ADDRESS", None)
        return env


@pytest.fixture(scope="module")
def fleet_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetCluster]:
    root = tmp_path_factory.mktemp("fleet")
    snapshots = make_snapshots(root / "snapshots")
    homes = {name: root / f"home-{name}" for name in snapshots}
    pythonpath = _pythonpath()

    def node_env(name: str) -> dict[str, str]:
        return {"ATTNFORGE_PROBE_SNAPSHOT": str(snapshots[name]), "ATTNFORGE_HOME": str(homes[name]),
                "PYTHONPATH": pythonpath}

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "num_gpus": 0, "object_store_memory": OBJECT_STORE, "include_dashboard": False,
        "env_vars": node_env("cpu")})
    for name in ("h200", "a100", "win5090"):
        cluster.add_node(num_cpus=1, num_gpus=1, object_store_memory=OBJECT_STORE, env_vars=node_env(name))
    cluster.wait_for_nodes()
    try:
        yield FleetCluster(cluster=cluster, address=cluster.address, snapshots=snapshots, homes=homes)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


@pytest.fixture
def connected(fleet_cluster: FleetCluster) -> FleetCluster:
    """This test process as a Ray driver of the module's cluster."""
    from attnforge.fleet.cluster import connect

    connect(fleet_cluster.address)
    return fleet_cluster


@pytest.fixture
def pypiserver(tmp_path: Path, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """A real pypiserver on 127.0.0.1 (a free port), uploads allowed without authentication (``-a . -P .``), no
    fallback to PyPI for projects it does not hold (``--disable-fallback``; indirect ``"fallback"``: pypiserver's
    default, which redirects them to pypi.org)."""
    import socket
    import subprocess
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    packages = tmp_path / "packages"
    packages.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "pypiserver", "run", "-p", str(port), "-i", "127.0.0.1",
                             "-a", ".", "-P", ".",
                             *([] if getattr(request, "param", None) == "fallback" else ["--disable-fallback"]),
                             str(packages)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/simple/"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("pypiserver did not start")
            time.sleep(0.2)
    try:
        yield url, packages
    finally:
        proc.terminate()
        proc.wait(timeout=10)
