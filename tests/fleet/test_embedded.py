"""Without --address a local one-node Ray starts (the embedded default): the fleet works on one machine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.integration


@pytest.mark.slow
def test_probe_without_address_starts_a_local_ray_and_probes_this_machine(cli_env: dict[str, str]) -> None:
    env = {k: v for k, v in cli_env.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-m", "attnforge", "fleet", "probe", "--json"], capture_output=True,
                          text=True, env=env, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    (kind,) = json.loads(done.stdout)["kinds"]
    assert len(kind["nodes"]) == 1
    assert f"cp{sys.version_info[0]}{sys.version_info[1]}" in kind["describe"]  # this interpreter's ABI
