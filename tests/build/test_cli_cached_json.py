"""``attnforge build --json`` of a cached build names the stored wheel, never the removed staging copy."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from attnforge.build.stream import launch
from attnforge.cli.build import run_build
from attnforge.probe.snapshot import SystemSnapshot
from tests._fakes import FIXTURES
from tests.build._helpers import copy_fixture, fixture_spec
from tests.cache.wheelmaker import make_wheel

_COPY = """
import pathlib, shutil, sys
print("[1/1] Building CXX object add.o", flush=True)
pathlib.Path(sys.argv[2]).mkdir(parents=True, exist_ok=True)
shutil.copy(sys.argv[1], sys.argv[2])
"""


class WheelLauncher:
    """Stands in for pip wheel: a real child process that leaves a real (pure-Python) wheel in --wheel-dir."""

    def __init__(self, wheel: Path) -> None:
        self.wheel = wheel

    def __call__(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]):  # type: ignore[no-untyped-def]
        out = argv[list(argv).index("--wheel-dir") + 1]
        return launch([sys.executable, "-c", _COPY, str(self.wheel), out], cwd=cwd, env=env)


def test_json_result_wheel_is_the_cached_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheel = make_wheel(tmp_path / "made", name="af_ext_fixture", version="0.1.0", requires=("torch",))
    spec = fixture_spec(copy_fixture(tmp_path / "src"), tmp_path / "b")
    home = tmp_path / "home"
    code = run_build(spec, home=home, snapshot=SystemSnapshot.load(FIXTURES / "snapshots" /
                                                                   "cpu_dev_torch2.13_cpu.json"),
                     keep_build_dir=False, quiet=True, as_json=True, launcher=WheelLauncher(wheel), cache=True)
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc
    assert doc["cache_key"].startswith("sha256:")
    stored = Path(doc["wheel"])
    assert stored.is_file() and stored.is_relative_to(home / "artifacts")
    assert doc["result"]["wheel"] == doc["wheel"], "the result names the file that exists, not the staging copy"
    assert not (home / "staging").exists() or not any((home / "staging").iterdir())


def test_a_cached_build_into_a_newer_attnforges_cache_is_refused_before_it_compiles(tmp_path: Path) -> None:
    """The store is asked before the build: a newer attnforge's ``cache.db`` (or a damaged one) was found only when
    the wheel was stored, after the whole compile (review, 2026-12-02)."""
    import contextlib
    import sqlite3

    from attnforge._system.statedb import NewerDatabaseError
    from attnforge.cache import Store
    from attnforge.cache._base import SCHEMA_VERSION
    from tests.cache.conftest import put_wheels

    home = tmp_path / "home"
    put_wheels(Store(home), tmp_path)  # a real cache.db, then a newer release's version on it
    with contextlib.closing(sqlite3.connect(home / "cache.db")) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    launched: list[Sequence[str]] = []

    def launcher(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]):  # type: ignore[no-untyped-def]
        launched.append(argv)
        raise AssertionError("the build ran")

    spec = fixture_spec(copy_fixture(tmp_path / "src"), tmp_path / "b")
    with pytest.raises(NewerDatabaseError, match="newer attnforge"):
        run_build(spec, home=home, snapshot=SystemSnapshot.load(FIXTURES / "snapshots" / "cpu_dev_torch2.13_cpu.json"),
                  keep_build_dir=False, quiet=True, as_json=True, launcher=launcher, cache=True)
    assert launched == []
