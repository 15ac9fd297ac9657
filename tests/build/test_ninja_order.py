"""Longest compile units first: the ninja shim reorders torch's build.ninja, and a real ninja then starts the
backward / head-dim-256 kernels before the rest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge.build.ninja_order import install_shim, reorder

MANIFEST = """ninja_required_version = 1.3
rule compile
  command = echo $out >> order.log
rule cuda_compile
  command = echo $out >> order.log

build obj/flash_api.o: compile src/flash_api.cpp
build obj/flash_fwd_hdim32_bf16_sm80.o: cuda_compile src/flash_fwd_hdim32_bf16_sm80.cu
build obj/flash_fwd_hdim256_bf16_sm80.o: cuda_compile src/flash_fwd_hdim256_bf16_sm80.cu
build obj/flash_bwd_hdim64_bf16_sm80.o: cuda_compile src/flash_bwd_hdim64_bf16_sm80.cu
build obj/flash_bwd_hdim256_bf16_causal_sm80.o: cuda_compile src/flash_bwd_hdim256_bf16_causal_sm80.cu

"""
EXPECTED = ["obj/flash_bwd_hdim256_bf16_causal_sm80.o", "obj/flash_bwd_hdim64_bf16_sm80.o",
            "obj/flash_fwd_hdim256_bf16_sm80.o", "obj/flash_fwd_hdim32_bf16_sm80.o", "obj/flash_api.o"]


def _outs(manifest: str) -> list[str]:
    return [line.split(":")[0].removeprefix("build ") for line in manifest.splitlines() if line.startswith("build ")]


def test_reorder_puts_backward_and_big_head_dims_first_and_keeps_other_lines() -> None:
    new = reorder(MANIFEST, {})
    assert _outs(new) == EXPECTED
    assert [line for line in new.splitlines() if not line.startswith("build ")] == [
        line for line in MANIFEST.splitlines() if not line.startswith("build ")]
    assert reorder(new, {}) == new


def test_measured_durations_win_over_the_guess() -> None:
    durations = {o: float(i) for i, o in enumerate(_outs(MANIFEST))}  # the manifest's last line took longest
    assert _outs(reorder(MANIFEST, durations)) == list(reversed(_outs(MANIFEST)))
    assert _outs(reorder(MANIFEST, {"obj/flash_api.o": 99.0})) == EXPECTED  # partial data: the guess decides


def _run_ninja(tmp_path: Path, path: str) -> list[str]:
    work = tmp_path / "b"
    shutil.rmtree(work, ignore_errors=True)
    (work / "src").mkdir(parents=True)
    for out in _outs(MANIFEST):
        (work / "src" / Path(out).with_suffix(".cu" if "flash_api" not in out else ".cpp").name).write_text("")
    (work / "build.ninja").write_text(MANIFEST)
    subprocess.run(["ninja", "-j1"], cwd=work, env={**os.environ, "PATH": path}, check=True, capture_output=True)
    return (work / "order.log").read_text().split()


@pytest.mark.skipif(sys.platform == "win32" or shutil.which("ninja") is None, reason="needs ninja, POSIX sh")
def test_a_real_ninja_behind_the_shim_starts_the_longest_units_first(tmp_path: Path) -> None:
    plain = _run_ninja(tmp_path, os.environ["PATH"])
    assert plain == _outs(MANIFEST)  # ninja alone: manifest order (equal critical-path weights)
    shim_path = install_shim(tmp_path / "shims", os.environ)
    assert shim_path is not None
    assert _run_ninja(tmp_path, shim_path) == EXPECTED


def test_the_shim_can_be_turned_off(tmp_path: Path) -> None:
    assert install_shim(tmp_path / "shims", {**os.environ, "ATTNFORGE_NINJA_ORDER": "0"}) is None
    assert install_shim(tmp_path / "shims", {"PATH": str(tmp_path)}) is None  # no real ninja there
