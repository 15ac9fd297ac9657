"""Shared pieces of the build tests: BuildSpecs for the fixture package and a launcher that replays a log."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from attnforge.build.stream import launch
from attnforge.resolve.types import BuildSpec, SourceKind, SourceSpec
from tests._fakes import FIXTURES

EXT_PKG = FIXTURES / "ext_pkg"
FA_LOG = FIXTURES / "logs" / "flash_attn-2.8.3.post2_sm90_cu130_success.log"
OOM_LOG = FIXTURES / "logs" / "af_ext_fixture_ulimit_v_800000.log"
ISOLATION_LOG = FIXTURES / "logs" / "af_ext_fixture_build_isolation.log"
WHEEL_NAME = "af_ext_fixture-0.1.0-cp311-cp311-linux_x86_64.whl"

_REPLAY = """
import pathlib, sys, time
log, out, code, wheel, sleep_s = sys.argv[1:6]
for line in open(log, encoding="utf-8"):
    sys.stdout.write(line)
sys.stdout.flush()
time.sleep(float(sleep_s))
if int(code) == 0:
    pathlib.Path(out).mkdir(parents=True, exist_ok=True)
    (pathlib.Path(out) / wheel).write_bytes(b"PK")
sys.exit(int(code))
"""


def copy_fixture(dest: Path) -> Path:
    """A private copy of the fixture package (tests may edit it)."""
    shutil.copytree(EXT_PKG, dest, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    return dest


def fixture_spec(source_dir: Path, build_root: Path, **changes: object) -> BuildSpec:
    """A BuildSpec for the C++ fixture package built by this interpreter (no CUDA, 2 jobs)."""
    fields: dict[str, object] = {
        "name": "af_ext_fixture",
        "version": "0.1.0",
        "source": SourceSpec(kind=SourceKind.PATH, location=str(source_dir)),
        "archs": (),
        "max_jobs": 2,
        "nvcc_threads": 1,
        "env": {"MAX_JOBS": "2"},
        "build_root": str(build_root),
        "python": sys.executable,
    }
    fields.update(changes)
    return BuildSpec(**fields)  # type: ignore[arg-type]


class ReplayLauncher:
    """Stands in for pip: replays a recorded log, then writes a wheel (exit 0) or fails (other codes).

    A real child process (the real ``launch``), so pipes, process groups and signals are exercised for real.
    """

    def __init__(self, log: Path, *, returncode: int = 0, sleep_s: float = 0.0) -> None:
        self.log, self.returncode, self.sleep_s = log, returncode, sleep_s
        self.argv: list[str] = []
        self.env: dict[str, str] = {}
        self.pids: list[int] = []

    def __call__(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]):  # type: ignore[no-untyped-def]
        self.argv, self.env = list(argv), dict(env)
        out = argv[list(argv).index("--wheel-dir") + 1]
        proc = launch(
            [
                sys.executable,
                "-c",
                _REPLAY,
                str(self.log),
                out,
                str(self.returncode),
                WHEEL_NAME,
                str(self.sleep_s),
            ],
            cwd=cwd,
            env=env,
        )
        self.pids.append(proc.pid)
        return proc


class Recorder:
    """A reporter that keeps every event."""

    def __init__(self) -> None:
        self.events: list[object] = []

    def report(self, event: object) -> None:
        self.events.append(event)
