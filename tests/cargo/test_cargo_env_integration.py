"""The cargo-env flow end to end, with the real nvcc and a stand-in for cargo (no crates.io here).

tests/fixtures/cargo/fake_cargo.py does what candle-flash-attn's build script does with its kernels: compile
into $CANDLE_FLASH_ATTN_BUILD_DIR for $CUDA_COMPUTE_CAP unless libflashattention.a there is up to date. The
test shows the first build compiles, the second reuses the library, and a fresh machine that imported the
cache export reuses it too.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests._fakes import FIXTURES

NVCC = Path("/usr/local/cuda/bin/nvcc")
SNAPSHOT = FIXTURES / "snapshots" / "cpu_dev_torch2.13_cpu.json"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not NVCC.exists() or shutil.which("ar") is None, reason="needs nvcc and ar"),
]


def _attnforge(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "attnforge", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def _cargo_env(workdir: Path, env: dict[str, str], *extra: str) -> dict[str, object]:
    cmd = [sys.executable, str(FIXTURES / "cargo" / "fake_cargo.py"), str(workdir / "kernel.cu"),
           str(workdir / "events.txt"), str(NVCC)]
    res = _attnforge(["cargo-env", "candle-flash-attn", "--snapshot", str(SNAPSHOT), "--compute-cap", "9.0",
                      "--cargo-lock", str(FIXTURES / "cargo" / "Cargo.lock"), "--json", *extra, "--", *cmd],
                     env, workdir)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["kind"] == "cargo-env"
    return doc  # type: ignore[no-any-return]


def _events(workdir: Path) -> list[str]:
    return (workdir / "events.txt").read_text().split()


def test_second_build_reuses_the_kernels_and_the_export_carries_them(tmp_path: Path, cli_env: dict[str, str],
                                                                     attnforge_home: Path) -> None:
    work = tmp_path / "ws"
    work.mkdir()
    shutil.copy(FIXTURES / "cargo" / "kernel.cu", work / "kernel.cu")

    first = _cargo_env(work, cli_env)
    assert _events(work) == ["compiled"]
    assert first["library_present_before"] is False
    assert first["stored"] is True
    assert first["env"]["CUDA_COMPUTE_CAP"] == "90"  # type: ignore[index]
    build_dir = Path(str(first["build_dir"]))
    assert build_dir.is_relative_to(attnforge_home)
    assert (build_dir / "libflashattention.a").is_file()
    members = subprocess.run(["ar", "t", str(build_dir / "libflashattention.a")], capture_output=True,
                             text=True, check=True).stdout.split()
    assert members == ["kernel.o"]
    obj_mtime = (build_dir / "kernel.o").stat().st_mtime_ns

    second = _cargo_env(work, cli_env)
    assert _events(work) == ["compiled", "reused"]  # nvcc did not run again
    assert (build_dir / "kernel.o").stat().st_mtime_ns == obj_mtime
    assert second["library_present_before"] is True
    assert second["build_dir"] == first["build_dir"]
    assert second["cache_key"] == first["cache_key"]
    assert second["stored"] is False

    # another machine: export the cache, import it into an empty home, build there without compiling
    export = tmp_path / "export"
    assert _attnforge(["cache", "export", str(export)], cli_env, work).returncode == 0
    other_env = dict(cli_env, ATTNFORGE_HOME=str(tmp_path / "other-home"))
    imported = _attnforge(["cache", "import", str(export)], other_env, work)
    assert imported.returncode == 0, imported.stderr
    third = _cargo_env(work, other_env)
    assert third["restored_from_cache"] is True
    assert third["cache_key"] == first["cache_key"]
    assert _events(work) == ["compiled", "reused", "reused"]
    assert not (Path(str(third["build_dir"])) / "kernel.o").exists()  # the library came from the cache


def test_another_compute_capability_gets_its_own_directory(tmp_path: Path, cli_env: dict[str, str]) -> None:
    lines = []
    for cap in ("9.0", "12.0"):
        res = _attnforge(["cargo-env", "candle-flash-attn", "--snapshot", str(SNAPSHOT), "--compute-cap", cap,
                          "--crate-version", "0.9.1", "--print", "--shell", "sh"], cli_env, tmp_path)
        assert res.returncode == 0, res.stderr
        lines.append(res.stdout.splitlines())
    assert lines[0][0].startswith("export CANDLE_FLASH_ATTN_BUILD_DIR='")
    assert lines[0][1] == "export CUDA_COMPUTE_CAP='90'"
    assert lines[1][1] == "export CUDA_COMPUTE_CAP='120'"
    assert lines[0][0] != lines[1][0]


def test_a_failing_build_keeps_its_exit_code(tmp_path: Path, cli_env: dict[str, str]) -> None:
    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    res = _attnforge(["cargo-env", "candle-flash-attn", "--snapshot", str(SNAPSHOT), "--compute-cap", "9.0",
                      "--crate-version", "0.9.1", "--json", "--", *failing], cli_env, tmp_path)
    assert res.returncode == 3
    doc = json.loads(res.stdout)
    assert doc["returncode"] == 3
    assert doc["cache_key"] is None
