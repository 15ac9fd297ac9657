"""The real nvcc (compile only, no GPU): the resolver's arch choice compiles, a dropped arch is diagnosed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from attnforge.build.archs import gencode_flags
from attnforge.catalog import load_catalog
from attnforge.diagnose import diagnose_file
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve import Request, build_spec
from tests._fakes import FIXTURES

pytestmark = pytest.mark.integration

NVCC = Path("/usr/local/cuda/bin/nvcc")
KERNEL = FIXTURES / "cu" / "scale.cu"
H200 = SystemSnapshot.load(FIXTURES / "snapshots" / "h200_torch2.11_cu130.json")


def _nvcc(flags: tuple[str, ...], out: Path, log: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(NVCC), "-c", str(KERNEL), "-o", str(out / "scale.o"), "--keep", "--keep-dir", str(out), *flags],
        capture_output=True,
        text=True,
        check=False,
    )
    log.write_text(done.stdout + done.stderr, encoding="utf-8")
    return done


@pytest.mark.skipif(not NVCC.exists(), reason="needs /usr/local/cuda/bin/nvcc")
def test_the_specs_archs_compile_to_sass_and_ptx(tmp_path: Path) -> None:
    spec = build_spec(H200, load_catalog(), Request(backend="flash-attn"), home=str(tmp_path))
    assert spec.archs == ((9, 0),)
    done = _nvcc(gencode_flags(spec.archs), tmp_path, tmp_path / "nvcc.log")
    assert done.returncode == 0, done.stderr
    kept = {p.name for p in tmp_path.iterdir()}
    assert any(n.endswith(".sm_90.cubin") for n in kept), kept
    assert any(n.endswith((".compute_90.ptx", ".ptx")) for n in kept), kept
    assert (tmp_path / "scale.o").stat().st_size > 0


@pytest.mark.skipif(not NVCC.exists(), reason="needs /usr/local/cuda/bin/nvcc")
def test_an_arch_nvcc_13_dropped_is_diagnosed(tmp_path: Path) -> None:
    log = tmp_path / "nvcc.log"
    done = _nvcc(gencode_flags(((7, 0),)), tmp_path, log)  # Volta: CUDA 13 dropped sm_50-72
    assert done.returncode != 0
    d = diagnose_file(log, snapshot=H200, name="flash-attn")
    assert d.signature == "unsupported-gpu-arch"
    assert "compute_70" in d.cause
    assert d.cause.startswith("nvcc 13.0 cannot compile")
    assert any("nvcc --list-gpu-arch" in step for step in d.fix)
