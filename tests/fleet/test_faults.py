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
from pathlib import Path

import pytest

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

    extra = connected.cluster.add_node(num_cpus=1, object_store_memory=80 * 1024 * 1024, env_vars={
        "ATTNFORGE_PROBE_SNAPSHOT": str(connected.snapshots["h200"]),
        "ATTNFORGE_HOME": str(tmp_path / "extra-home"), "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    connected.cluster.wait_for_nodes()
    nodes, _ = probe_nodes(ray)
    assert len(nodes) == 5
    connected.cluster.remove_node(extra)
    runs = run_on_nodes(ray, nodes, ["--version"], timeout_s=60)
    by_status = sorted(r.status for r in runs)
    assert by_status == ["lost", "ok", "ok", "ok", "ok"]
    lost = next(r for r in runs if r.status == "lost")
    assert lost.message


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
    extra = connected.cluster.add_node(num_cpus=1, object_store_memory=80 * 1024 * 1024, env_vars={
        "ATTNFORGE_PROBE_SNAPSHOT": str(snap), "ATTNFORGE_HOME": str(home),
        "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
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
