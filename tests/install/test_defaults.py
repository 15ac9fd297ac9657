"""The installer's verifier runs the library's verify in a fresh interpreter, never the command line."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from attnforge._system.runner import Completed, SubprocessRunner
from attnforge.catalog import load_catalog
from attnforge.install.defaults import VERIFY_CHILD, subprocess_verifier
from attnforge.install.flow import VerifyOutcome


def test_verifier_runs_the_library_child_not_the_cli(tmp_path: Path) -> None:
    child_env = {**os.environ, "ATTNFORGE_HOME": str(tmp_path / "home")}
    calls: list[tuple[str, ...]] = []
    real = SubprocessRunner()

    class Recording:
        def run(self, argv: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
                timeout_s: float | None = None) -> Completed:
            calls.append(tuple(argv))
            return real.run(argv, cwd=cwd, env=child_env, timeout_s=timeout_s)

    verify = subprocess_verifier(Recording(), load_catalog())
    outcome = verify("flash-attn-3")  # a catalog backend that is not installed here: verify fails, cleanly
    assert calls == [(sys.executable, "-m", VERIFY_CHILD, "flash-attn-3")]
    assert outcome == VerifyOutcome(ok=False, summary="not installed")  # the library's own verdict


def test_child_reports_an_unknown_backend_as_json(tmp_path: Path) -> None:
    env = {**os.environ, "ATTNFORGE_HOME": str(tmp_path / "home")}
    done = SubprocessRunner().run([sys.executable, "-m", VERIFY_CHILD, "no-such-backend"], env=env, timeout_s=300)
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 2
    assert doc["ok"] is False and "no-such-backend" in doc["error"]
