"""Benchmarks of `attnforge fleet` (docs/fleet.md). Not tests: numbers for the docs, printed as JSON lines.

    PYTHONPATH=src python3 scripts/fleet_bench.py plan       # 10,000 synthetic nodes of 40 kinds; 4 kinds -> 2 builds
    PYTHONPATH=src python3 scripts/fleet_bench.py cli-plan   # the CLI's fleet plan over 40 kind snapshots
    PYTHONPATH=src python3 scripts/fleet_bench.py state      # the head's nodes.json at 10,000 nodes: load + save
    PYTHONPATH=src python3 scripts/fleet_bench.py makespan   # 4 independent real nvcc builds on 1 vs 2 Ray workers
    PYTHONPATH=src python3 scripts/fleet_bench.py fanout     # fleet verify on a node vs attnforge verify there
    PYTHONPATH=src python3 scripts/fleet_bench.py first-verified  # six nodes: fleet build, then fleet verify

Every cluster here is a real Ray cluster on this machine (ray.cluster_utils.Cluster); its nodes claim a
recorded H200 snapshot through ATTNFORGE_PROBE_SNAPSHOT. State goes to a temporary ATTNFORGE_HOME.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT / "tests" / "fixtures" / "snapshots"
NVCC_EXT = ROOT / "tests" / "fleet" / "fixtures" / "nvcc_ext"
TORCHES = ("2.11.0+cu130", "2.10.0+cu130", "2.9.1+cu130", "2.9.0+cu130")
CCS = ((7, 5), (8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0))


def _h200(torch: str | None = None, cc: tuple[int, int] | None = None, python: str | None = None) -> dict:
    doc = json.loads((SNAPSHOTS / "h200_torch2.11_cu130.json").read_text())
    if torch:
        doc["torch"]["version"] = torch
    if cc:
        for g in doc["gpus"]:
            g["compute_capability"] = list(cc)
    if python:
        doc["platform"]["python_executable"] = python
    return doc


def bench_plan(nodes_total: int = 10_000) -> None:
    from attnforge.build.source import parse_source
    from attnforge.catalog import load_catalog
    from attnforge.fleet.kinds import Node, group_nodes
    from attnforge.fleet.plan import plan_fleet
    from attnforge.probe.snapshot import SystemSnapshot
    from attnforge.resolve.types import Request

    kinds = [SystemSnapshot.from_json(json.dumps(_h200(t, cc))) for t in TORCHES for cc in CCS]
    nodes = [Node(node_id=f"node-{i:05d}", address=f"10.0.{i // 250}.{i % 250}",
                  snapshot=dataclasses.replace(kinds[i % len(kinds)], created_at=f"2026-11-25T00:00:{i % 60:02d}"))
             for i in range(nodes_total)]
    catalog = load_catalog()
    request = Request(backend="af-nvcc-fixture", source=parse_source(str(NVCC_EXT)), from_source=True)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        plan = plan_fleet(group_nodes(nodes), catalog, [request])
        times.append(time.perf_counter() - start)
    wheel_keys = {k.wheel for k in (kind for g in group_nodes(nodes) for kind in [g.kind])}
    print(json.dumps({"bench": "plan", "nodes": nodes_total, "kinds": len(plan.kinds), "builds": len(plan.builds),
                      "distinct_wheel_keys": len(wheel_keys), "unserved": plan.unserved,
                      "median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3),
                      "build_archs": sorted({",".join(map(str, b.archs)) for b in plan.builds})}))
    four = [SystemSnapshot.from_json(json.dumps(d)) for d in (
        _h200(), _h200(cc=(10, 0)), _h200("2.10.0+cu130"), _h200("2.10.0+cu130", (12, 0)))]
    small = plan_fleet(group_nodes([Node(node_id=str(i), address="-", snapshot=s) for i, s in enumerate(four)]),
                       catalog, [request])
    print(json.dumps({"bench": "plan-4-kinds", "kinds": len(small.kinds), "builds": len(small.builds),
                      "distinct_wheel_keys": len({b.wheel for b in small.builds}),
                      "routes": [r.detail for r in small.routes]}))


def bench_state(nodes_total: int = 10_000) -> None:
    """The head's per-command state handling at 10,000 nodes of 40 kinds: load nodes.json, save it back."""
    from attnforge.fleet.kinds import Node
    from attnforge.fleet.state import load_nodes, save_nodes
    from attnforge.probe.snapshot import SystemSnapshot

    kinds = [SystemSnapshot.from_json(json.dumps(_h200(t, cc))) for t in TORCHES for cc in CCS]
    nodes = [Node(node_id=f"{i:056x}", address=f"10.0.{i // 250}.{i % 250}", cpus=128, memory_bytes=2.0**40, gpus=8,
                  fingerprint=f"{i % 40:016x}",
                  snapshot=dataclasses.replace(kinds[i % len(kinds)], created_at=f"2026-11-26T00:00:{i % 60:02d}"))
             for i in range(nodes_total)]
    home = Path(tempfile.mkdtemp(prefix="fleet-state-"))
    save_nodes(home, nodes, known=())
    times = []
    for _ in range(5):
        start = time.perf_counter()
        known = load_nodes(home)
        save_nodes(home, known, known=known)
        times.append(time.perf_counter() - start)
    size = (home / "fleet" / "nodes.json").stat().st_size
    shutil.rmtree(home, ignore_errors=True)
    print(json.dumps({"bench": "state", "nodes": nodes_total, "kinds": len(kinds), "file_bytes": size,
                      "load_and_save_median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3)}))


def _cluster(workers: int, snapshot: Path, home: Path, num_gpus: int = 0):  # type: ignore[no-untyped-def]
    from ray.cluster_utils import Cluster

    env = {"ATTNFORGE_PROBE_SNAPSHOT": str(snapshot), "ATTNFORGE_HOME": str(home),
           "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "num_gpus": num_gpus, "object_store_memory": 80 << 20, "include_dashboard": False,
        "env_vars": env})
    for _ in range(workers - 1):
        cluster.add_node(num_cpus=1, num_gpus=num_gpus, object_store_memory=80 << 20, env_vars=env)
    cluster.wait_for_nodes()
    return cluster


def bench_cli_plan(kinds_total: int = 40) -> None:
    """`fleet plan` on the command line over 40 kind snapshots: each kind assembled by `attnforge plan`'s own
    pipeline (install.inputs.assemble on the kind's snapshot)."""
    tmp = Path(tempfile.mkdtemp(prefix="fleet-cli-plan-"))
    args = []
    for i, (t, cc) in enumerate((t, cc) for t in TORCHES for cc in CCS):
        if i >= kinds_total:
            break
        (tmp / f"k{i}.json").write_text(json.dumps(_h200(t, cc)))
        args += ["--snapshot", str(tmp / f"k{i}.json")]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "ATTNFORGE_HOME": str(tmp / "home"),
           "ATTNFORGE_WHEEL_SOURCES": "off"}
    times = []
    for _ in range(3):
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "attnforge", "fleet", "plan", "af-nvcc-fixture", "--source",
                               str(NVCC_EXT), *args, "--json"], env=env, capture_output=True, text=True, check=False)
        times.append(time.monotonic() - start)
    doc = json.loads(done.stdout)
    shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"bench": "cli-plan", "kinds": len(doc["kinds"]), "builds": len(doc["builds"]),
                      "median_s": round(statistics.median(times), 2), "max_s": round(max(times), 2)}))


def bench_makespan(rounds: int = 2) -> None:
    import ray

    from attnforge.build.source import parse_source
    from attnforge.catalog import load_catalog
    from attnforge.fleet.build import run_builds
    from attnforge.fleet.cluster import connect, probe_nodes
    from attnforge.fleet.index import DirIndex
    from attnforge.fleet.kinds import group_nodes
    from attnforge.fleet.plan import plan_fleet
    from attnforge.resolve.types import Request

    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    snap = tmp / "h200.json"
    snap.write_text(json.dumps(_h200(python=sys.executable)))
    requests = []
    for i in range(1, 5):  # four independent builds: four distributions
        src = tmp / f"ext{i}"
        shutil.copytree(NVCC_EXT, src)
        setup = src / "setup.py"
        setup.write_text(setup.read_text().replace('name="af-nvcc-fixture"', f'name="af-nvcc-fixture-{i}"'))
        requests.append(Request(backend=f"af-nvcc-fixture-{i}", source=parse_source(str(src)), from_source=True))
    results: dict[int, list[float]] = {1: [], 2: []}
    for r in range(rounds):
        for workers in (1, 2):
            home = tmp / f"home-{workers}-{r}"
            cluster = _cluster(workers, snap, home)
            try:
                connect(cluster.address)
                nodes, _ = probe_nodes(ray)
                plan = plan_fleet(group_nodes(nodes), load_catalog(), requests, home=str(home))
                index = DirIndex(tmp / f"index-{workers}-{r}", home=home)
                start = time.perf_counter()
                outcomes = run_builds(ray, plan.builds, nodes, index, home=home, log_dir=tmp / f"logs-{workers}-{r}")
                results[workers].append(time.perf_counter() - start)
                assert [o.status for o in outcomes] == ["built"] * 4, outcomes
            finally:
                ray.shutdown()
                cluster.shutdown()
    one, two = statistics.median(results[1]), statistics.median(results[2])
    print(json.dumps({"bench": "makespan", "builds": 4, "rounds": rounds,
                      "one_worker_s": [round(x, 2) for x in results[1]],
                      "two_workers_s": [round(x, 2) for x in results[2]],
                      "ratio_1_over_2": round(one / two, 2)}))
    shutil.rmtree(tmp, ignore_errors=True)


def bench_fanout(repeats: int = 5) -> None:
    import ray

    from attnforge.fleet.cluster import connect, probe_nodes
    from attnforge.fleet.rollout import run_on_nodes, verify_argv

    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    snap = tmp / "h200.json"
    snap.write_text(json.dumps(_h200(python=sys.executable)))
    env = {**os.environ, "ATTNFORGE_HOME": str(tmp / "home"),
           "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    argv = verify_argv(["sdpa-math"])
    cluster = _cluster(1, snap, tmp / "home")
    try:
        connect(cluster.address)
        nodes, _ = probe_nodes(ray)
        local, fleet, node_cmd = [], [], []
        for _ in range(repeats):  # interleaved: local, then the same command through Ray
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "attnforge", *argv], env=env, capture_output=True, check=True)
            local.append(time.perf_counter() - start)
            start = time.perf_counter()
            (run,) = run_on_nodes(ray, nodes, argv)
            fleet.append(time.perf_counter() - start)
            node_cmd.append(run.command_s or 0.0)
            assert run.status == "ok", run
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(json.dumps({"bench": "fanout", "repeats": repeats,
                      "local_verify_s": round(statistics.median(local), 2),
                      "fleet_verify_per_node_s": round(statistics.median(fleet), 2),
                      "command_on_node_s": round(statistics.median(node_cmd), 2),
                      "fanout_cost_s": round(statistics.median(f - c for f, c in zip(fleet, local, strict=True)), 2),
                      "ray_task_overhead_s": round(statistics.median(
                          f - n for f, n in zip(fleet, node_cmd, strict=True)), 2)}))
    shutil.rmtree(tmp, ignore_errors=True)


def _six_nodes(tmp: Path):  # type: ignore[no-untyped-def]
    """Issue 33's six nodes (tests/fleet/test_six_nodes.py): a CPU-only head Ray gives no CPU, two H200s, an A100
    and an L40S without nvcc, a CPU-only nvcc builder; every node its own home."""
    from ray.cluster_utils import Cluster

    cpu = _h200(python=sys.executable)
    cpu["gpus"] = []
    docs = {"cpu": cpu, "h200a": _h200(python=sys.executable), "h200b": _h200(python=sys.executable),
            "a100": _h200(cc=(8, 0), python=sys.executable), "l40s": _h200(cc=(8, 9), python=sys.executable),
            "cpub": cpu}
    for name in ("a100", "l40s"):
        docs[name]["cuda_toolkits"] = []
    pythonpath = str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")

    def env(name: str) -> dict[str, str]:
        (tmp / f"{name}.json").write_text(json.dumps(docs[name]))
        return {"ATTNFORGE_PROBE_SNAPSHOT": str(tmp / f"{name}.json"), "ATTNFORGE_HOME": str(tmp / f"home-{name}"),
                "PYTHONPATH": pythonpath}

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "num_gpus": 0, "object_store_memory": 80 << 20, "include_dashboard": False,
        "env_vars": env("cpu")})
    for name in ("h200a", "h200b", "a100", "l40s", "cpub"):
        cluster.add_node(num_cpus=1, num_gpus=0 if name == "cpub" else 1, object_store_memory=80 << 20,
                         env_vars=env(name))
    cluster.wait_for_nodes()
    return cluster


def bench_first_verified(rounds: int = 2) -> None:
    """Time to the first verified node, as a user types it: `fleet build` of the real nvcc fixture (one fatbin for
    sm_80/89/90, published to a directory index), then `fleet verify sdpa-math`, each a fresh command against a
    six-node cluster that is already up; the clock runs from the build command's start to the verify command's
    first `exit 0` line (a node's verified record). The nodes' interpreter is this box's CPU-only torch, so what
    is verified there is SDPA's math kernel, not the fixture (it is no attention kernel and cannot load on a
    CPU-only torch): the figure is the fleet's own path (plan, build, publish, fan-out, per-node verify)."""
    rows = []
    for _ in range(rounds):
        tmp = Path(tempfile.mkdtemp(prefix="fleet-first-"))
        up = time.monotonic()
        cluster = _six_nodes(tmp)
        up_s = time.monotonic() - up
        env = {**os.environ, "ATTNFORGE_HOME": str(tmp / "head"),
               "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
        env.pop("RAY_ADDRESS", None)
        fleet = [sys.executable, "-m", "attnforge", "fleet"]
        try:
            start = time.monotonic()
            built = subprocess.run([*fleet, "build", "af-nvcc-fixture", "--source", str(NVCC_EXT), "--address",
                                    cluster.address, "--index", str(tmp / "index"), "--json"], env=env,
                                   capture_output=True, text=True, check=False)
            build_s = time.monotonic() - start
            doc = json.loads(built.stdout)
            assert built.returncode == 0 and [b["status"] for b in doc["builds"]] == ["built"], built.stderr[-2000:]
            with open(tmp / "verify.json", "w+") as out:  # a file: a full stdout pipe would stall the command
                verify = subprocess.Popen([*fleet, "verify", "sdpa-math", "--address", cluster.address, "--json"],
                                          env=env, stdout=out, stderr=subprocess.PIPE, text=True)
                first_s = None
                assert verify.stderr is not None
                for line in verify.stderr:
                    if first_s is None and ": exit 0 (" in line:
                        first_s = time.monotonic() - start
                verify.wait()
            runs = json.loads((tmp / "verify.json").read_text())["nodes"]
            all_s = time.monotonic() - start
            assert verify.returncode == 0 and first_s is not None, verify.returncode
            ran = [r for r in runs if r["status"] == "ok"]
            rows.append({"cluster_up_s": round(up_s, 1), "build_s": round(build_s, 1),
                         "first_verified_s": round(first_s, 1), "all_verified_s": round(all_s, 1),
                         "verify_on_node_s": sorted(round(r["command_s"], 1) for r in ran),
                         "verify_wall_from_head_s": sorted(round(r["wall_s"], 1) for r in ran),
                         "kinds": len(doc["plan"]["kinds"]), "builds": len(doc["plan"]["builds"])})
        finally:
            cluster.shutdown()
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"bench": "first-verified", "nodes": 6, "rounds": rows,
                      "first_verified_median_s": round(statistics.median(r["first_verified_s"] for r in rows), 1)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benches = {"plan": bench_plan, "cli-plan": bench_cli_plan, "state": bench_state,
               "makespan": bench_makespan, "fanout": bench_fanout, "first-verified": bench_first_verified}
    parser.add_argument("which", choices=list(benches))
    benches[parser.parse_args().which]()


if __name__ == "__main__":
    main()
