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


def test_known_sources_are_listed_only_when_the_plan_gets_past_the_cache(tmp_path: Path) -> None:
    """A cache hit asks no release server: the resolver ranks cache entries before every wheel."""
    from attnforge.cache import Store
    from attnforge.cache._files import sha256_file
    from attnforge.install.defaults import resolver_planner
    from attnforge.install.keys import prebuilt_wheel_inputs
    from attnforge.probe.snapshot import SystemSnapshot
    from attnforge.resolve.types import CandidateKind, Request, WheelRef
    from tests.cache.wheelmaker import make_wheel
    from tests.conftest import REPO

    snapshot = SystemSnapshot.load(REPO / "tests" / "fixtures" / "snapshots" / "h200_torch2.11_cu130.json")
    wheel = make_wheel(tmp_path / "dist", name="flash-attn-4", version="4.0.0b36")
    listed: list[int] = []

    def more() -> list[WheelRef]:
        listed.append(1)
        return [WheelRef(filename=wheel.name, url=str(wheel), sha256=None)]

    store = Store(tmp_path / "home")
    request = Request(backend="flash-attn-4")
    plan = resolver_planner(snapshot, load_catalog(), (), store.root, more_wheels=more)
    chosen = plan(request, cached=store.cached_artifacts()).chosen
    assert chosen is not None and chosen.kind is CandidateKind.WHEEL  # nothing cached: the sources were asked
    assert listed == [1]
    plan(request, cached=store.cached_artifacts())
    assert listed == [1]  # once per install, not once per plan

    store.put(wheel, prebuilt_wheel_inputs(wheel=wheel, sha256=sha256_file(wheel), archs=snapshot.compute_capabilities,
                                           snapshot=snapshot))
    listed.clear()
    plan = resolver_planner(snapshot, load_catalog(), (), store.root, more_wheels=more)
    chosen = plan(request, cached=store.cached_artifacts()).chosen
    assert chosen is not None and chosen.kind is CandidateKind.CACHE
    assert listed == []
