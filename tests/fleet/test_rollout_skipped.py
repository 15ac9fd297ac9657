"""A fleet verify / bench / install where no selected node can run it is an error (exit 1), not a silent success."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attnforge.fleet import FleetError
from attnforge.fleet.kinds import Node
from attnforge.fleet.rollout import run_on_nodes, verify_argv
from attnforge.probe.snapshot import SystemSnapshot
from tests._fakes import FIXTURES

CPU = SystemSnapshot.load(FIXTURES / "snapshots" / "cpu_dev_torch2.13_cpu.json")
H200 = SystemSnapshot.load(FIXTURES / "snapshots" / "h200_torch2.11_cu130.json")


class NoRay:
    """Ray must not be asked anything when nothing runs: any use of it fails the test."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"ray.{name} was used although no node runs the command")


def test_every_node_skipped_is_an_error_naming_each_reason() -> None:
    nodes = [Node(node_id="a" * 40, address="10.0.0.1", snapshot=CPU, cpus=4, head=True),
             Node(node_id="b" * 40, address="10.0.0.2", snapshot=H200, cpus=4, gpus=0)]
    events: list[str] = []
    with pytest.raises(FleetError) as info:
        run_on_nodes(NoRay(), nodes, verify_argv(()), gpu=True, hold_gpu=True, on_event=events.append)
    error = info.value
    assert "no selected node can run this command: all 2 were skipped" in error.message
    assert "10.0.0.1" in (error.cause or "") and "no GPU" in (error.cause or "")
    assert "10.0.0.2" in (error.cause or "") and "Ray grants no GPU" in (error.cause or "")
    assert error.hint is not None and "--num-gpus" in error.hint
    assert len(events) == 2, "each skipped node is still said as it is decided"


def test_no_node_at_all_is_an_error() -> None:
    with pytest.raises(FleetError, match="no selected node can run this command: none"):
        run_on_nodes(NoRay(), [], verify_argv(()), gpu=True, hold_gpu=True)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("verb", ["verify", "bench"])
def test_fleet_verify_and_bench_on_a_gpu_less_machine_exit_1(verb: str, cli_env: dict[str, str]) -> None:
    """The embedded one-node Ray on this machine (no GPU): the node is skipped, so the command fails and says so."""
    pytest.importorskip("ray")
    env = {k: v for k, v in cli_env.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-m", "attnforge", "fleet", verb, "--json"], capture_output=True,
                          text=True, env=env, timeout=300, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no selected node can run this command" in done.stderr and "hint:" in done.stderr
    doc = json.loads(done.stdout[done.stdout.index("{"):])
    assert doc["kind"] == "error" and "no GPU" in doc["error"]["cause"]
