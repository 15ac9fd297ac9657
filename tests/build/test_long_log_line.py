"""A failed build whose output has a 200k-character line without spaces still ends with its diagnosis.

The build diagnoses its own log as it fails; a failure pattern that backtracked on such a line (``a.cu`` repeated,
a progress bar, a flattened file list) made the build hang after pip had exited. The build runs in a child
process with a deadline, so a hang fails the test: ``re`` holds the GIL for a whole search.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

_CHILD = """
import json, sys
from pathlib import Path
from attnforge.build import BuildFailure, execute
from tests.build._helpers import ReplayLauncher, copy_fixture, fixture_spec
tmp, log = Path(sys.argv[1]), Path(sys.argv[2])
try:
    execute(fixture_spec(copy_fixture(tmp / "src"), tmp / "b"), home=tmp / "home",
            launcher=ReplayLauncher(log, returncode=1))
except BuildFailure as failure:
    print(json.dumps({"known": failure.diagnosis.known, "notes": list(failure.diagnosis.notes),
                      "log": failure.log_path}))
"""


def test_a_failed_build_with_a_huge_line_is_diagnosed_not_hung(tmp_path: Path, cli_env: dict[str, str]) -> None:
    log = tmp_path / "pip-output.log"
    log.write_text("FAILED: add.o\n" + "a.cu" * 50_000 + "\nninja: build stopped: subcommand failed.\n",
                   encoding="utf-8")
    env = {**cli_env, "PYTHONPATH": os.pathsep.join((cli_env["PYTHONPATH"], str(REPO)))}
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path), str(log)], capture_output=True,
                              text=True, env=env, timeout=120, check=True)
    except subprocess.TimeoutExpired:
        pytest.fail("the failed build hung while diagnosing its own log")
    doc = json.loads(done.stdout)
    assert doc["known"] is False
    assert any("longer than 32 KiB" in note for note in doc["notes"])
    assert Path(doc["log"]).is_file()
