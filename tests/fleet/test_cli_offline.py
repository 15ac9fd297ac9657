"""The fleet CLI on saved snapshots, without Ray: probe groups files into kinds, plan prints the table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SNAPSHOTS = Path(__file__).resolve().parents[1] / "fixtures" / "snapshots"
NVCC_EXT = Path(__file__).resolve().parent / "fixtures" / "nvcc_ext"
FILES = ("h200_torch2.11_cu130.json", "h100_torch2.8_cu128.json", "windows_rtx5090_torch2.8_cu128.json",
         "windows_vs17.10_cuda12.3_torch2.5_cu124.json")


def _fleet(cli_env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    snaps = [a for f in FILES for a in ("--snapshot", str(SNAPSHOTS / f))]
    return subprocess.run([sys.executable, "-m", "attnforge", "fleet", *args, *snaps], capture_output=True,
                          text=True, env={**cli_env, "COLUMNS": "200"}, timeout=120, check=False)


def test_probe_groups_snapshot_files_into_kinds(cli_env: dict[str, str]) -> None:
    done = _fleet(cli_env, "probe", "--json")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["kinds"]) == 4


def test_plan_table_names_builds_and_the_kind_it_cannot_serve(cli_env: dict[str, str]) -> None:
    done = _fleet(cli_env, "plan", "af-nvcc-fixture", "--source", str(NVCC_EXT))
    assert done.returncode == 1, done.stderr  # one kind cannot be served: exit 1 with its reasons
    assert "build 1 of 3" in done.stdout and "build 3 of 3" in done.stdout
    assert "cannot be served" in done.stdout and "_MSC_VER" in done.stdout
    assert "3 artifact(s), 3 build(s)" in done.stdout
    assert "Traceback" not in done.stderr


def test_plan_json_shows_each_kind_as_probe_json_does(cli_env: dict[str, str]) -> None:
    probed = json.loads(_fleet(cli_env, "probe", "--json").stdout)["kinds"]
    done = _fleet(cli_env, "plan", "af-nvcc-fixture", "--source", str(NVCC_EXT), "--json")
    planned = json.loads(done.stdout)["kinds"]
    assert planned == probed  # one rendering of a kind: id, describe, kind, nodes (no snapshots)
    assert all(set(n) == {"node_id", "address"} for k in planned for n in k["nodes"])
