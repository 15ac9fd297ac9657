"""The fleet on a real four-node Ray cluster (tests/fleet/conftest.py): probe, plan, a real nvcc build for two
compute capabilities published to a PEP 503 directory, pip installing from it, idempotent re-runs."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.fleet.conftest import NVCC_EXT, FleetCluster

pytestmark = pytest.mark.integration


def fleet(fc: FleetCluster, home: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "attnforge", "fleet", *args], capture_output=True, text=True,
                          env=fc.env(home), timeout=timeout, check=False)


@pytest.mark.slow
def test_probe_runs_on_every_node_and_groups_kinds(fleet_cluster: FleetCluster, tmp_path: Path) -> None:
    done = fleet(fleet_cluster, tmp_path / "head", "probe", "--address", fleet_cluster.address, "--json")
    assert done.returncode == 0, done.stderr
    kinds = json.loads(done.stdout)["kinds"]
    described = sorted(k["describe"] for k in kinds)
    assert len(kinds) == 4
    assert any(d.endswith("no GPU") for d in described)
    assert any("torch 2.11.0+cu130" in d and d.endswith("sm_90") for d in described)
    assert any("torch 2.11.0+cu130" in d and d.endswith("sm_80") for d in described)
    assert any(d.startswith("win_amd64") and d.endswith("sm_120") for d in described)
    assert all(len(k["nodes"]) == 1 for k in kinds)


@pytest.mark.slow
def test_plan_on_the_cluster_shares_one_build_across_the_linux_kinds(fleet_cluster: FleetCluster,
                                                                     tmp_path: Path) -> None:
    done = fleet(fleet_cluster, tmp_path / "head", "plan", "af-nvcc-fixture", "--source", str(NVCC_EXT),
                 "--address", fleet_cluster.address, "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    archs = sorted(tuple(b["archs"]) for b in plan["builds"])
    assert len(plan["builds"]) == 2  # linux (H200 + A100: one fatbin) and windows
    assert [[8, 0], [9, 0]] in [list(map(list, a)) for a in archs]
    assert plan["artifacts"] == 2
    routes = {r["kind"]: r["route"] for r in plan["routes"]}
    kinds = {k["describe"].rsplit(" ", 1)[-1]: k["id"] for k in plan["kinds"]}
    assert routes[kinds["sm_80"]] == "build"  # the A100 has no nvcc: the H200's wheel key builds for it
    assert routes[kinds["GPU"]] == "skipped"  # the CPU-only head: no target, no failure (exit 0)
    linux = _linux_build(plan)
    assert len(linux["builder_nodes"]) == 2  # the H200 and the CPU-only head (nvcc needs no GPU); not the A100
    a100 = next(k for k in plan["kinds"] if k["id"] == kinds["sm_80"])
    assert a100["nodes"][0]["node_id"] not in linux["builder_nodes"]


def _linux_build(plan: dict) -> dict:
    return next(b for b in plan["builds"] if b["wheel"]["os"] == "linux")


@pytest.mark.slow
def test_build_compiles_once_for_two_archs_publishes_and_pip_installs(fleet_cluster: FleetCluster,
                                                                      tmp_path: Path) -> None:
    index = tmp_path / "index"
    args = ("build", "af-nvcc-fixture", "--source", str(NVCC_EXT), "--address", fleet_cluster.address,
            "--index", str(index), "--json")
    done = fleet(fleet_cluster, tmp_path / "head", *args)
    doc = json.loads(done.stdout)
    by_os = {b["number"]: b for b in doc["builds"]}
    linux = _linux_build(doc["plan"])
    built = by_os[linux["number"]]
    assert built["status"] == "built", (built, done.stderr)
    assert "cu130torch2.11" in built["wheel"]["filename"] and "sm80sm90" in built["wheel"]["filename"]
    windows = next(b for n, b in by_os.items() if n != linux["number"])
    assert windows["status"] == "failed" and windows["log_path"]  # a Windows build cannot run on Linux
    assert windows["wheel"] is None and built["failure"] is None
    assert "does not exist on this machine" in windows["failure"]["message"]  # its own words, not a worker death
    assert done.returncode == 1  # one failed build: exit 1, the other still published

    wheel = next(index.glob(f"artifacts/*/{built['wheel']['filename']}"))
    with zipfile.ZipFile(wheel) as zf:
        assert any(n.startswith("af_nvcc_fixture/_C") for n in zf.namelist())
    target = tmp_path / "target"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target),
                          "--index-url", (index / "simple").as_uri(), "af-nvcc-fixture"],
                         capture_output=True, text=True, check=False)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    archs = subprocess.run([sys.executable, "-c", "import af_nvcc_fixture; print(af_nvcc_fixture.archs())"],
                           cwd=target, capture_output=True, text=True, check=True)
    assert archs.stdout.strip() == "80,90"

    again = fleet(fleet_cluster, tmp_path / "head", *args)
    redo = {b["number"]: b for b in json.loads(again.stdout)["builds"]}
    assert redo[linux["number"]]["status"] == "present"  # idempotent by artifact key: not built again
    log = Path(built["log_path"]).read_text()
    assert log.count("attempt in worker pid") == 1


@pytest.mark.slow
def test_build_publishes_to_a_real_index_server_and_pip_installs_from_it(
        fleet_cluster: FleetCluster, tmp_path: Path, pypiserver: tuple[str, Path]) -> None:
    url, packages = pypiserver
    env_home = tmp_path / "head"
    env = fleet_cluster.env(env_home)
    env.update(ATTNFORGE_INDEX_USER="fleet", ATTNFORGE_INDEX_PASSWORD="s3cret-pw")  # noqa: S106 - a test value
    done = subprocess.run([sys.executable, "-m", "attnforge", "fleet", "build", "af-nvcc-fixture", "--source",
                           str(NVCC_EXT), "--address", fleet_cluster.address, "--index", url],
                          capture_output=True, text=True, env=env, timeout=240, check=False)
    assert "s3cret-pw" not in done.stdout + done.stderr
    assert "published af_nvcc_fixture-0.1.0+cu130torch2.11" in done.stderr, done.stderr
    assert [p.name for p in packages.iterdir() if "sm80sm90" in p.name]
    pin = "af-nvcc-fixture==0.1.0+cu130torch2.11.cxx11abitrue.sm80sm90"  # the H200 and A100 kinds' exact version
    assert done.stdout.count(f"pip install --index-url {url} '{pin}'") == 2, done.stdout
    target = tmp_path / "target"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target),
                          "--index-url", url, pin], capture_output=True, text=True, check=False)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    assert list(target.glob("af_nvcc_fixture/_C*.so"))
    # fleet install from the server: each Linux GPU node is handed that exact version (its kind's plan takes it
    # from the server); the Windows kind, for which the server holds nothing, is told so and nothing runs there
    done = subprocess.run([sys.executable, "-m", "attnforge", "fleet", "install", "af-nvcc-fixture", "--source",
                           str(NVCC_EXT), "--index-url", url, "--address", fleet_cluster.address, "--json"],
                          capture_output=True, text=True, env=env, timeout=240, check=False)
    runs = json.loads(done.stdout)["nodes"]
    argvs = sorted(r["argv"][1] for r in runs if r["argv"])
    assert argvs == [pin, pin], done.stderr[-3000:]
    windows = next(r for r in runs if r["describe"].startswith("win_amd64"))
    assert "has no wheel of af-nvcc-fixture" in windows["message"] and windows["argv"] is None


@pytest.mark.slow
def test_install_of_a_source_build_gives_each_node_its_kind_index_and_the_source(fleet_cluster: FleetCluster,
                                                                                 tmp_path: Path) -> None:
    """`fleet install NAME --source S` (a name outside the catalog, issue 33: refused before) runs `attnforge
    install NAME --index-url <the kind's sub-index> --json --source S` on every GPU node, and each node's own
    install plans with its kind's wheel. The nodes here claim GPUs they lack (their interpreter is this CPU-only
    torch), so their install then refuses that wheel with the reason: a GPU node would install it."""
    index = tmp_path / "index"
    built = fleet(fleet_cluster, tmp_path / "head", "build", "af-nvcc-fixture", "--source", str(NVCC_EXT),
                  "--address", fleet_cluster.address, "--index", str(index), "--json")
    doc = json.loads(built.stdout)
    wheel = next(b["wheel"]["filename"] for b in doc["builds"] if b["status"] == "built")
    done = fleet(fleet_cluster, tmp_path / "head", "install", "af-nvcc-fixture", "--source", str(NVCC_EXT),
                 "--index-url", (index / "simple").as_uri(), "--address", fleet_cluster.address, "--json")
    assert "Traceback" not in done.stderr and done.returncode in (0, 1), done.stderr[-3000:]
    runs = {r["kind"]: r for r in json.loads(done.stdout)["nodes"]}
    assert sorted(r["status"] for r in runs.values()) == ["failed", "failed", "failed", "skipped"]
    for kind, url in doc["kind_index_urls"].items():  # the H200 and the A100 kinds: one build serves both
        assert runs[kind]["argv"] == ["install", "af-nvcc-fixture", "--index-url", url, "--json", "--source",
                                      str(NVCC_EXT)]
        assert runs[kind]["doc"]["error"]["type"] == "ResolveError"
        assert wheel in runs[kind]["doc"]["error"]["cause"]  # the node's own plan weighed its kind's wheel
    assert len(doc["kind_index_urls"]) == 2
    windows = next(r for r in runs.values() if r["describe"].startswith("win_amd64"))
    assert "has no sub-index" in windows["message"] and windows["argv"] is None  # its build failed: not guessed


@pytest.mark.slow  # 40-100 s: verify, install and bench on three nodes of one 2-core machine (issue 32)
def test_install_verify_and_bench_run_per_node_and_report_per_kind(fleet_cluster: FleetCluster, tmp_path: Path) -> None:
    home = tmp_path / "head"
    verify = fleet(fleet_cluster, home, "verify", "sdpa-math", "--address", fleet_cluster.address, "--json")
    assert verify.returncode == 0, verify.stdout[-2000:] + verify.stderr[-2000:]
    runs = json.loads(verify.stdout)["nodes"]
    assert sorted(r["status"] for r in runs) == ["ok", "ok", "ok", "skipped"]  # the CPU-only head: no GPU
    assert "no GPU" in next(r["message"] for r in runs if r["status"] == "skipped")
    runs = [r for r in runs if r["status"] == "ok"]
    assert all(r["doc"]["kind"] == "verify" and r["doc"]["results"][0]["ok"] for r in runs)
    install = fleet(fleet_cluster, home, "install", "sdpa-math", "--index-url", (tmp_path / "idx").as_uri(),
                    "--address", fleet_cluster.address, "--json")
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    installed = json.loads(install.stdout)["nodes"]
    assert {r["doc"]["kind"] for r in installed if r["status"] == "ok"} == {"install"}
    assert sorted(r["status"] for r in installed) == ["ok", "ok", "ok", "skipped"]
    bench = fleet(fleet_cluster, home, "bench", "sdpa-math", "--address", fleet_cluster.address,
                  "--arg=--mode", "--arg=fwd", "--arg=--causal", "--arg=off", "--arg=--seqlen", "--arg=128",
                  "--arg=--head-dim", "--arg=64", "--arg=--max-noise", "--arg=1e6")  # 3 nodes on one loaded CPU
    assert bench.returncode == 0, bench.stdout[-2000:] + bench.stderr[-2000:]
    report = fleet(fleet_cluster, home, "report", "--json", "--plot", str(tmp_path / "fleet.png"))
    assert report.returncode == 0, report.stderr
    doc = json.loads(report.stdout)
    assert len(doc["kinds"]) == 3
    assert {(v["backend"], v["passed_nodes"], v["nodes"]) for v in doc["verdicts"]} == {("sdpa-math", 1, 1)}
    assert len(doc["winners"]) == 3 and all(w["shape_class"].endswith("Sq128 Sk128") for w in doc["winners"])
    assert (tmp_path / "fleet.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_a_node_whose_torch_changed_is_probed_again(fleet_cluster: FleetCluster, tmp_path: Path) -> None:
    """The head remembers each node's probe with a cheap fingerprint; a node whose fingerprint changed (here its
    recorded snapshot, as a torch upgrade changes its installed version) is probed again by the next command."""
    home = tmp_path / "head"
    assert fleet(fleet_cluster, home, "probe", "--address", fleet_cluster.address, "--json").returncode == 0
    path = fleet_cluster.snapshots["a100"]
    original = path.read_text()
    try:
        doc = json.loads(original)
        doc["torch"]["version"] = "2.10.0+cu130"
        path.write_text(json.dumps(doc))
        done = fleet(fleet_cluster, home, "plan", "af-nvcc-fixture", "--source", str(NVCC_EXT), "--address",
                     fleet_cluster.address, "--json")
    finally:
        path.write_text(original)
    described = [k["describe"] for k in json.loads(done.stdout)["kinds"]]
    assert any("torch 2.10.0+cu130" in d and d.endswith("sm_80") for d in described), described
    saved = json.loads((home / "fleet" / "nodes.json").read_text())
    assert len(saved["snapshots"]) == 4 and len(saved["nodes"]) == 4
