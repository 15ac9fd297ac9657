"""The install flow with a real store, real pip into a fresh venv, and a real pip-wheel build."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from attnforge._system.runner import SubprocessRunner
from attnforge.cache import Store
from attnforge.cache._files import sha256_file
from attnforge.errors import CacheError, ResolveError
from attnforge.install.flow import Action, VerifyOutcome, install
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.types import Candidate, CandidateKind, Plan, Request
from tests.cache.wheelmaker import flip_byte, make_wheel
from tests.install.helpers import OrderedPlanner, make_project, pip_wheel_builder

pytestmark = pytest.mark.integration



def imported_value(python: str) -> str:
    done = subprocess.run([python, "-c", "import af_pure_fixture as m; print(m.VALUE)"],
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else f"import failed: {done.stderr.strip()[-200:]}"


class RecordingVerifier:
    def __init__(self) -> None:
        self.backends: list[str] = []

    def __call__(self, backend: str) -> VerifyOutcome:
        self.backends.append(backend)
        return VerifyOutcome(ok=True, summary="checked")


def run_install(store: Store, planner: OrderedPlanner, snapshot: SystemSnapshot, python: str,
                **request: object):  # type: ignore[no-untyped-def]
    return install(
        Request(backend="af-pure-fixture", **request),  # type: ignore[arg-type]
        snapshot=snapshot, store=store, planner=planner, builder=pip_wheel_builder,
        verifier=RecordingVerifier(), runner=SubprocessRunner(), python=python,
    )


def test_a_find_links_wheel_goes_through_the_cache_and_the_second_install_is_a_hit(
    tmp_path: Path, snapshot: SystemSnapshot, python: str
) -> None:
    wheel = make_wheel(tmp_path / "links", value=11)
    store = Store(tmp_path / "home")
    planner = OrderedPlanner(find_links=tmp_path / "links",
                             published_sha256={wheel.name: sha256_file(wheel)})
    first = run_install(store, planner, snapshot, python)
    assert first.action == Action.WHEEL
    assert imported_value(python) == "11"
    second = run_install(store, planner, snapshot, python)
    assert second.action == Action.CACHE_HIT
    assert second.cache_key == first.cache_key
    assert len(store.list()) == 1
    assert second.verification == VerifyOutcome(ok=True, summary="checked")
    entry = store.show(str(first.cache_key))
    assert entry.inputs.torch_version == "2.13.0+cpu"
    assert entry.inputs.flags == ("prebuilt",)


def test_a_wheel_that_does_not_match_its_published_hash_is_refused(
    tmp_path: Path, snapshot: SystemSnapshot, python: str
) -> None:
    wheel = make_wheel(tmp_path / "links")
    store = Store(tmp_path / "home")
    planner = OrderedPlanner(find_links=tmp_path / "links", published_sha256={wheel.name: "0" * 64})
    with pytest.raises(CacheError, match="does not match its published sha256"):
        run_install(store, planner, snapshot, python)
    assert store.list() == []
    assert imported_value(python).startswith("import failed")


def test_a_tampered_cache_entry_is_quarantined_and_fetched_again(
    tmp_path: Path, snapshot: SystemSnapshot, python: str
) -> None:
    make_wheel(tmp_path / "links", value=12)
    store = Store(tmp_path / "home")
    planner = OrderedPlanner(find_links=tmp_path / "links")
    first = run_install(store, planner, snapshot, python)
    flip_byte(Path(str(first.artifact)))
    again = run_install(store, planner, snapshot, python)
    assert again.action == Action.WHEEL
    assert any("corrupt" in w for w in again.warnings)
    assert len(list(store.quarantine_dir.iterdir())) == 1
    assert imported_value(python) == "12"


def test_a_source_build_is_stored_with_its_log_then_hit(
    tmp_path: Path, snapshot: SystemSnapshot, python: str
) -> None:
    store = Store(tmp_path / "home")
    planner = OrderedPlanner(source=make_project(tmp_path / "src", value=13))
    first = run_install(store, planner, snapshot, python, from_source=True)
    assert first.action == Action.BUILT
    assert imported_value(python) == "13"
    entry = store.show(str(first.cache_key))
    assert entry.log_path is not None
    assert "af_pure_fixture" in Path(entry.log_path).read_text()
    assert entry.inputs.flags == ("AF_FIXTURE_FLAG=on",)  # MAX_JOBS does not change the binary
    assert entry.inputs.archs == ((9, 0),)
    second = run_install(store, planner, snapshot, python, from_source=True)
    assert second.action == Action.CACHE_HIT
    assert len(store.list()) == 1


def test_nothing_viable_lists_every_rejection(tmp_path: Path, snapshot: SystemSnapshot, python: str) -> None:
    with pytest.raises(ResolveError, match="nothing can install") as info:
        run_install(Store(tmp_path / "home"), OrderedPlanner(), snapshot, python)
    assert "no nvcc on this machine" in (info.value.cause or "")


def test_already_installed_runs_no_pip(tmp_path: Path, snapshot: SystemSnapshot, python: str) -> None:
    def planner(request: Request, *, cached: object) -> Plan:
        return Plan(request=request, candidates=(
            Candidate(kind=CandidateKind.INSTALLED, description="af-pure-fixture 1.0", accepted=True),))

    result = install(Request(backend="af-pure-fixture"), snapshot=snapshot, store=Store(tmp_path / "home"),
                     planner=planner, builder=pip_wheel_builder, verifier=None, runner=SubprocessRunner(),
                     python=python)
    assert result.action == Action.ALREADY_INSTALLED
    assert result.pip is None
