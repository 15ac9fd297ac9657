"""Faults on a real Ray cluster: a SIGKILLed build worker (retried once, then failed with log and diagnosis,
nothing partial in the index), two concurrent fleet builds (each key built once), a node that left (lost, the
others finish)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._http import local_server
from tests.fleet.conftest import NVCC_EXT, FleetCluster

pytestmark = pytest.mark.integration


def _slow_source(tmp_path: Path, seconds: float) -> Path:
    src = tmp_path / "nvcc_ext"
    shutil.copytree(NVCC_EXT, src)
    (src / "af_sleep_s").write_text(str(seconds))
    return src


def _linux_plan(fc: FleetCluster, source: Path):  # type: ignore[no-untyped-def]
    """The plan for the two Linux nodes only (one shared build), and those nodes."""
    import ray

    from attnforge.build.source import parse_source
    from attnforge.catalog import load_catalog
    from attnforge.fleet.cluster import probe_nodes
    from attnforge.fleet.kinds import group_nodes
    from attnforge.fleet.plan import plan_fleet
    from attnforge.resolve.types import Request

    nodes, problems = probe_nodes(ray)
    assert not problems
    linux = [n for n in nodes if n.snapshot.platform.os == "linux"]
    request = Request(backend="af-nvcc-fixture", source=parse_source(str(source)), from_source=True)
    plan = plan_fleet(group_nodes(linux), load_catalog(), [request])
    assert len(plan.builds) == 1
    return plan, linux


@pytest.mark.slow
def test_a_killed_build_worker_is_retried_once_then_reported_failed(connected: FleetCluster,
                                                                    tmp_path: Path) -> None:
    import ray

    from attnforge.fleet.build import run_builds
    from attnforge.fleet.index import DirIndex

    plan, nodes = _linux_plan(connected, _slow_source(tmp_path, 30))
    index = DirIndex(tmp_path / "index", home=tmp_path / "head")
    outcomes: list = []
    worker = threading.Thread(target=lambda: outcomes.extend(run_builds(
        ray, plan.builds, nodes, index, home=tmp_path / "head", log_dir=tmp_path / "logs")))
    worker.start()
    running = [home / "fleet" / "running" for home in connected.homes.values()]
    killed: set[int] = set()
    deadline = time.monotonic() + 120
    while len(killed) < 2 and time.monotonic() < deadline:  # the first try, then Ray's one retry
        for folder in running:
            for pid_file in folder.glob("*.pid") if folder.is_dir() else ():
                pid = int(pid_file.read_text())
                if pid not in killed:
                    time.sleep(1.0)  # mid-build: the fixture sleeps 30 s before nvcc
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
        time.sleep(0.2)
    worker.join(timeout=120)
    assert len(killed) == 2
    (outcome,) = outcomes
    assert outcome.status == "failed"
    assert outcome.failure is not None and outcome.wheel is None
    diagnosis = outcome.failure.diagnosis or {}
    assert "died" in diagnosis["title"] or diagnosis.get("known")
    log = Path(outcome.log_path).read_text()
    assert log.count("attempt in worker pid") == 2  # retried exactly once
    assert not list((tmp_path / "index").glob("artifacts/*/*.whl"))  # nothing partial reached the index
    assert not (tmp_path / "index" / "simple").exists() or not any((tmp_path / "index" / "simple").iterdir())


@pytest.mark.slow
def test_two_concurrent_fleet_builds_build_each_key_once(connected: FleetCluster, tmp_path: Path) -> None:
    source = _slow_source(tmp_path, 3)
    index = tmp_path / "index"
    argv = [sys.executable, "-m", "attnforge", "fleet", "build", "af-nvcc-fixture", "--source", str(source),
            "--address", connected.address, "--index", str(index), "--json"]
    procs = [subprocess.Popen(argv, env=connected.env(tmp_path / f"head{i}"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    import json

    statuses = []
    for out, _err in outs:
        doc = json.loads(out)
        linux = next(b["number"] for b in doc["plan"]["builds"] if b["wheel"]["os"] == "linux")
        statuses.append(next(b for b in doc["builds"] if b["number"] == linux))
    assert sorted(s["status"] for s in statuses) == ["built", "present"]
    log = Path(statuses[0]["log_path"] or statuses[1]["log_path"]).read_text()
    assert log.count("attempt in worker pid") == 1  # the key was built once
    wheels = list(index.glob("artifacts/*/*sm80sm90*.whl"))
    assert len(wheels) == 1


def test_a_node_that_left_is_reported_lost_and_the_others_finish(connected: FleetCluster, tmp_path: Path) -> None:
    import ray

    from attnforge.fleet.cluster import probe_nodes
    from attnforge.fleet.rollout import run_on_nodes

    extra = connected.cluster.add_node(num_cpus=1, object_store_memory=80 * 1024 * 1024, env_vars=connected.node_env(
        connected.snapshots["h200"], tmp_path / "extra-home"))
    connected.cluster.wait_for_nodes()
    nodes, _ = probe_nodes(ray)
    assert len(nodes) == 5
    connected.cluster.remove_node(extra)
    runs = run_on_nodes(ray, nodes, ["--version"], timeout_s=60)
    by_status = sorted(r.status for r in runs)
    assert by_status == ["lost", "ok", "ok", "ok", "ok"]
    lost = next(r for r in runs if r.status == "lost")
    assert lost.message


@pytest.mark.slow
def test_a_node_lost_mid_build_is_reported_lost_and_the_other_build_finishes(connected: FleetCluster,
                                                                            tmp_path: Path) -> None:
    """A fourth node of its own kind (torch 2.10) builds a slow copy of the fixture; it leaves mid-build. The
    other build (H200 + A100) is published."""
    import json

    import ray

    from attnforge.build.source import parse_source
    from attnforge.catalog import load_catalog
    from attnforge.fleet.build import run_builds
    from attnforge.fleet.cluster import probe_nodes
    from attnforge.fleet.index import DirIndex
    from attnforge.fleet.kinds import group_nodes
    from attnforge.fleet.plan import plan_fleet
    from attnforge.resolve.types import Request

    doc = json.loads(connected.snapshots["h200"].read_text())
    doc["torch"]["version"] = "2.10.0+cu130"
    snap = tmp_path / "torch210.json"
    snap.write_text(json.dumps(doc))
    home = tmp_path / "extra-home"
    extra = connected.cluster.add_node(num_cpus=1, object_store_memory=80 * 1024 * 1024,
                                       env_vars=connected.node_env(snap, home))
    connected.cluster.wait_for_nodes()
    nodes, _ = probe_nodes(ray)
    linux = [n for n in nodes if n.snapshot.platform.os == "linux"]
    request = Request(backend="af-nvcc-fixture", source=parse_source(str(_slow_source(tmp_path, 4))),
                      from_source=True)
    plan = plan_fleet(group_nodes(linux), load_catalog(), [request])
    assert len(plan.builds) == 2
    outcomes: list = []
    worker = threading.Thread(target=lambda: outcomes.extend(run_builds(
        ray, plan.builds, linux, DirIndex(tmp_path / "index", home=tmp_path / "head"), home=tmp_path / "head",
        log_dir=tmp_path / "logs", idle_s=2)))
    worker.start()
    deadline = time.monotonic() + 120
    while not list((home / "fleet" / "running").glob("*.pid")) and time.monotonic() < deadline:
        time.sleep(0.2)
    connected.cluster.remove_node(extra)
    worker.join(timeout=180)
    statuses = sorted(o.status for o in outcomes)
    assert statuses == ["built", "lost"], outcomes
    built, lost = sorted(outcomes, key=lambda o: o.status)
    assert built.wheel is not None and built.failure is None
    assert lost.wheel is None and lost.failure is not None and lost.failure.message


def _running_pids(fc: FleetCluster, *homes: Path) -> list[int]:
    folders = [h / "fleet" / "running" for h in homes or fc.homes.values()]
    return [int(p.read_text()) for f in folders if f.is_dir() for p in f.glob("*.pid")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").is_dir() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


@pytest.mark.slow
@pytest.mark.usefixtures("ctrl_c_raises")  # the child inherits a handled SIGINT as the default, not an ignored one
def test_ctrl_c_cancels_the_builds_publishes_nothing_and_exits_130(connected: FleetCluster, tmp_path: Path) -> None:
    import json

    for folder in (h / "fleet" / "running" for h in connected.homes.values()):
        shutil.rmtree(folder, ignore_errors=True)
    index = tmp_path / "index"
    proc = subprocess.Popen([sys.executable, "-m", "attnforge", "fleet", "build", "af-nvcc-fixture", "--source",
                             str(_slow_source(tmp_path, 60)), "--address", connected.address, "--index", str(index),
                             "--json"], env=connected.env(tmp_path / "head"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # SIGINT handled here: the child's is the default
    linux = [connected.homes["cpu"], connected.homes["h200"]]  # the Linux build's capable nodes
    deadline = time.monotonic() + 120
    while not _running_pids(connected, *linux) and time.monotonic() < deadline:
        time.sleep(0.2)
    (worker,) = _running_pids(connected, *linux)
    time.sleep(1.0)  # mid-build: the fixture sleeps 60 s before nvcc
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert time.monotonic() - sent <= 10
    doc = json.loads(out)  # --json: one JSON document, Ray's lines on stderr
    assert doc["interrupted"] is True
    linux = next(b for b in doc["builds"] if b["wheel"] is None and b["status"] == "cancelled")
    assert "nothing published" in linux["failure"]["message"]
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:  # ray.cancel(force=True) kills the build's worker
        time.sleep(0.2)
    assert not _alive(worker)
    assert not list(index.glob("artifacts/*/*.whl"))
    assert not list(index.glob(".fleet/keys/*.json"))


@pytest.fixture
def empty_index() -> Iterator[str]:
    """An index server that answers 200 to every upload and stores nothing (its pages list no file)."""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<!DOCTYPE html><html><body></body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with local_server(Handler) as url:
        yield url + "/simple/"


@pytest.mark.slow
def test_an_index_that_answers_200_and_stores_nothing_is_a_failed_publish(
        connected: FleetCluster, tmp_path: Path, empty_index: str) -> None:
    import json

    done = subprocess.run([sys.executable, "-m", "attnforge", "fleet", "build", "af-nvcc-fixture", "--source",
                           str(_slow_source(tmp_path, 0)), "--address", connected.address, "--index", empty_index,
                           "--json"], env=connected.env(tmp_path / "head"), capture_output=True, text=True,
                          timeout=240, check=False)
    assert done.returncode == 1, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    statuses = sorted(b["status"] for b in doc["builds"])
    assert statuses == ["failed", "failed"]  # both reported: the Linux one built but not published, Windows failed
    linux = next(b for b in doc["builds"] if "not published" in b["failure"]["message"])
    assert "does not list it" in linux["failure"]["message"] and linux["wheel"] is None


@pytest.mark.slow
def test_a_lost_builder_moves_the_build_to_another_capable_node(connected: FleetCluster, tmp_path: Path) -> None:
    """Two extra CPU-only builder nodes (nvcc, no GPU, label role=builder); the one Ray picked leaves mid-build;
    Ray runs the build again on the other and it is published."""
    import ray

    from attnforge.fleet.build import run_builds
    from attnforge.fleet.cluster import Selection
    from attnforge.fleet.index import DirIndex

    homes = [tmp_path / f"builder{i}" for i in range(2)]
    extra = [connected.cluster.add_node(num_cpus=1, object_store_memory=80 * 1024 * 1024, labels={"role": "builder"},
                                        env_vars=connected.node_env(connected.snapshots["cpu"], home))
             for home in homes]
    connected.cluster.wait_for_nodes()
    plan, nodes = _linux_plan(connected, _slow_source(tmp_path, 8))
    (build,) = plan.builds
    assert {n.node_id for n in nodes if not n.snapshot.gpus} <= set(build.builder_nodes)  # GPU-less builders
    outcomes: list = []
    worker = threading.Thread(target=lambda: outcomes.extend(run_builds(
        ray, plan.builds, nodes, DirIndex(tmp_path / "index", home=tmp_path / "head"), home=tmp_path / "head",
        log_dir=tmp_path / "logs", builders=Selection.parse(["role=builder"]), idle_s=2)))
    worker.start()
    deadline = time.monotonic() + 120
    first = None
    while first is None and time.monotonic() < deadline:
        first = next((i for i, h in enumerate(homes) if list((h / "fleet" / "running").glob("*.pid"))), None)
        time.sleep(0.2)
    assert first is not None
    connected.cluster.remove_node(extra[first])
    worker.join(timeout=180)
    (outcome,) = outcomes
    assert outcome.status == "built", outcome
    assert list((homes[1 - first] / "fleet" / "running").glob("*.pid"))  # the second try ran on the other node
    assert outcome.node == extra[1 - first].node_id
    connected.cluster.remove_node(extra[1 - first])
