"""When a step after the plan fails: requirements that cannot be installed, a wheel that vanished before its fetch.

Real store, real pip into a fresh venv, a real pip-wheel build (as in test_flow.py).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from attnforge._system.runner import SubprocessRunner
from attnforge.cache import Store
from attnforge.errors import InstallError
from attnforge.install.flow import Action, InstallResult, install
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.types import CachedArtifact, CandidateKind, Plan, Request
from tests.cache.wheelmaker import make_wheel
from tests.install.helpers import OrderedPlanner, make_project, pip_wheel_builder

pytestmark = pytest.mark.integration

MISSING_REQUIREMENT = "af-not-on-this-machine"


def imported(python: str) -> str:
    script = "import af_pure_fixture, importlib.metadata as m; print(m.version('af-pure-fixture'))"
    done = subprocess.run([python, "-c", script], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "not importable"


def run_install(home: Path, planner: OrderedPlanner, snapshot: SystemSnapshot, python: str,
                links: Path) -> InstallResult:
    # offline with an empty extra find-links folder: pip cannot find the missing requirement, fast and hermetic
    return install(Request(backend="af-pure-fixture", offline=True, find_links=(str(links),)), snapshot=snapshot,
                   store=Store(home), planner=planner, builder=pip_wheel_builder, verifier=None,
                   runner=SubprocessRunner(), python=python)


def test_requirements_that_cannot_be_installed_roll_the_install_back(
    tmp_path: Path, snapshot: SystemSnapshot, python: str
) -> None:
    links = tmp_path / "links"
    make_wheel(links, version="0.2.0", requires=(MISSING_REQUIREMENT,))
    with pytest.raises(InstallError) as info:
        run_install(tmp_path / "home", OrderedPlanner(find_links=links), snapshot, python, links)
    error = info.value
    assert "af-pure-fixture 0.2.0 was not installed: its requirements could not be installed" in error.message
    assert MISSING_REQUIREMENT in (error.cause or "")
    assert error.hint is not None and f"install {MISSING_REQUIREMENT}" in error.hint
    assert imported(python) == "not importable", "the package this run installed is removed again"
    import torch

    versions = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                              text=True, check=True).stdout.strip()
    assert versions == torch.__version__, "torch is untouched"
    assert len(Store(tmp_path / "home").list()) == 1, "the verified wheel stays cached for the next try"


def test_a_version_that_replaced_another_says_it_is_installed_without_its_requirements(
    tmp_path: Path, snapshot: SystemSnapshot, python: str
) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    make_wheel(old, version="0.1.0")
    run_install(tmp_path / "home-old", OrderedPlanner(find_links=old), snapshot, python, old)
    assert imported(python) == "0.1.0"
    make_wheel(new, version="0.2.0", requires=(MISSING_REQUIREMENT,))
    with pytest.raises(InstallError) as info:
        run_install(tmp_path / "home-new", OrderedPlanner(find_links=new), snapshot, python, new)
    error = info.value
    assert "af-pure-fixture 0.2.0 is installed" in error.message
    assert "its requirements are not" in error.message
    assert "it replaced af-pure-fixture 0.1.0" in (error.cause or "")
    assert error.hint is not None and MISSING_REQUIREMENT in error.hint
    assert imported(python) == "0.2.0", "what was there before is gone either way: it is said, not hidden"


class VanishingPlanner(OrderedPlanner):
    """Plans like the resolver, then the find-links wheels disappear (another process cleaned the folder)."""

    def __call__(self, request: Request, *, cached: Sequence[CachedArtifact]) -> Plan:
        plan = super().__call__(request, cached=cached)
        for wheel in self.find_links.glob("*.whl") if self.find_links is not None else ():
            wheel.unlink()
        return plan


def test_a_wheel_gone_before_its_fetch_falls_back_to_the_plans_next_candidate(
    tmp_path: Path, snapshot: SystemSnapshot, python: str
) -> None:
    links = tmp_path / "links"
    make_wheel(links, version="0.1.0")
    planner = VanishingPlanner(find_links=links, source=make_project(tmp_path / "src", version="0.3.0"))
    result = run_install(tmp_path / "home", planner, snapshot, python, links)
    assert result.action == Action.BUILT
    assert imported(python) == "0.3.0"
    assert any("af_pure_fixture-0.1.0-py3-none-any.whl" in w and "is no longer at" in w
               and "used the plan's next candidate instead" in w for w in result.warnings), result.warnings
    wheel = next(c for c in result.plan.candidates if c.kind is CandidateKind.WHEEL)
    assert not wheel.accepted and any("could not be fetched" in r for r in wheel.reasons)


def test_a_wheel_gone_with_nothing_else_planned_is_an_error_with_a_hint(
    tmp_path: Path, snapshot: SystemSnapshot, python: str
) -> None:
    links = tmp_path / "links"
    make_wheel(links, version="0.1.0")
    with pytest.raises(InstallError) as info:
        run_install(tmp_path / "home", VanishingPlanner(find_links=links), snapshot, python, links)
    assert "could not be fetched" in info.value.message
    assert "nothing else to install af-pure-fixture" in info.value.message
    assert info.value.hint is not None and "attnforge plan af-pure-fixture" in info.value.hint
    assert imported(python) == "not importable"
