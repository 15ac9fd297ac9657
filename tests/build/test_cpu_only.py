"""A pure C++ torch extension (CppExtension, no .cu) builds through `attnforge build --source` on a CPU torch:
the CUDA preflight (torch's CUDA, nvcc, archs) does not apply to it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from attnforge.catalog import load_catalog
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.buildspec import plan_build
from attnforge.resolve.cpu_only import cpu_only_source
from attnforge.resolve.types import Request, SourceKind, SourceSpec
from tests._fakes import FIXTURES
from tests.conftest import SRC
from tests.install.fixture_build import EXT_PKG

CPU = SystemSnapshot.load(FIXTURES / "snapshots" / "cpu_dev_torch2.13_cpu.json")


def path_source(path: Path) -> SourceSpec:
    return SourceSpec(kind=SourceKind.PATH, location=str(path))


def project(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(
    ("files", "cpu_only"),
    [
        ({"setup.py": "CppExtension('m', ['m.cpp'])", "m.cpp": ""}, True),
        ({"setup.py": "CUDAExtension('m', ['m.cpp'])", "m.cpp": ""}, False),
        ({"setup.py": "CppExtension('m', ['m.cpp'])", "m.cpp": "", "csrc/k.cu": ""}, False),
        ({"setup.py": "", "csrc/k.cuh": "", "m.cc": ""}, False),
        ({"pyproject.toml": "[project]\nname='x'", "x/__init__.py": ""}, False),  # nothing to compile
        ({"CMakeLists.txt": "project(x LANGUAGES CXX CUDA)", "m.cpp": ""}, False),
        ({"setup.py": "", "m.cpp": "", "build/old.cu": ""}, True),  # a stale build tree is not the source
    ],
)
def test_cuda_sources_are_detected(files: dict[str, str], cpu_only: bool, tmp_path: Path) -> None:
    root = project(tmp_path / "src", files)
    assert (cpu_only_source(path_source(root), os="linux") is not None) is cpu_only


def test_sdists_are_read_without_unpacking(tmp_path: Path) -> None:
    tgz = tmp_path / "ext-0.1.tar.gz"
    with tarfile.open(tgz, "w:gz") as tf:
        tf.add(EXT_PKG, arcname="ext-0.1")
    assert cpu_only_source(path_source(tgz), os="linux") is not None
    zipped = tmp_path / "cuda-0.1.zip"
    with zipfile.ZipFile(zipped, "w") as zf:
        zf.writestr("cuda-0.1/setup.py", "CUDAExtension")
        zf.writestr("cuda-0.1/k.cpp", "")
    assert cpu_only_source(path_source(zipped), os="linux") is None


def test_git_and_url_sources_are_assumed_to_need_cuda() -> None:
    assert cpu_only_source(SourceSpec(kind=SourceKind.GIT, location="https://github.com/x/y"), os="linux") is None
    assert cpu_only_source(None, os="linux") is None


def test_the_preflight_of_a_cpp_extension_passes_on_a_cpu_torch() -> None:
    request = Request(backend="af-ext-fixture", from_source=True, source=path_source(EXT_PKG))
    decision = plan_build(CPU, load_catalog(), request)
    assert decision.preflight.ok, [c.text() for c in decision.preflight.failures]
    assert decision.preflight.cpu_only
    assert {c.name for c in decision.preflight.checks} == {"torch", "host-compiler", "ninja", "ram", "disk"}
    assert decision.spec is not None
    assert "CUDA_HOME" not in decision.spec.env
    assert "TORCH_CUDA_ARCH_LIST" not in decision.spec.env


def test_a_cuda_extension_is_still_refused_on_a_cpu_torch(tmp_path: Path) -> None:
    root = project(tmp_path / "cuda_ext", {"setup.py": "CUDAExtension('m', ['m.cu'])", "m.cu": ""})
    request = Request(backend="cuda-ext", from_source=True, source=path_source(root))
    decision = plan_build(CPU, load_catalog(), request)
    assert not decision.preflight.ok
    assert any(c.name == "torch-cuda" for c in decision.preflight.failures)


@pytest.mark.integration
@pytest.mark.slow
def test_attnforge_build_compiles_a_cpp_extension_with_the_real_gcc(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("no C++ compiler")
    src = shutil.copytree(EXT_PKG, tmp_path / "ext")
    env = {**os.environ, "PYTHONPATH": str(SRC), "ATTNFORGE_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "attnforge", "build", "--source", str(src), "--quiet"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    [wheel] = (tmp_path / "home" / "artifacts").rglob("af_ext_fixture-0.1.0+*.whl")  # the local label names torch
    assert "torch" in wheel.name.split("+", 1)[1].split("-", 1)[0]
    with zipfile.ZipFile(wheel) as zf:
        assert any(n.startswith("af_ext_fixture/_C") and n.endswith(".so") for n in zf.namelist())


def test_a_cpp_extension_takes_the_host_compilers_floors_not_nvccs() -> None:
    """CI's machine had 4.5 GiB free (stop 46): the C++ fixture, whose build tree is 4.3 MB, was refused for the
    5 GiB a CUDA extension of unknown size is given. A C++-only source takes the torch-cpp-extension recipe's
    floors; a CUDA source on the same machine still meets the CUDA floor."""
    import dataclasses

    small = dataclasses.replace(CPU, platform=dataclasses.replace(
        CPU.platform, disk_free_bytes=int(4.5 * 2**30), ram_available_bytes=3 * 2**30))
    cpp = plan_build(small, load_catalog(), Request(backend="af-ext-fixture", from_source=True,
                                                      source=path_source(EXT_PKG)))
    assert cpp.preflight.ok, [c.text() for c in cpp.preflight.failures]
    assert cpp.recipe.id == "torch-cpp-extension"
    assert cpp.spec is not None and cpp.spec.max_jobs == 1  # 3 GiB at 2 GiB per g++ job
    cuda = plan_build(small, load_catalog(), Request(backend="k", from_source=True,
                                                       source=path_source(FIXTURES / "cuda_ext_pkg")))
    assert cuda.recipe.id == "torch-extension"
    failed = {c.name: c.text() for c in cuda.preflight.failures}
    assert "about 5 GiB" in failed["disk"] and "nvcc thread" in failed["ram"]


def test_a_cpp_extensions_disk_floor_is_its_measured_size_not_a_whole_gib() -> None:
    """CI's machine had 0.8 GiB free (stop 66) and the C++ fixture (build tree 4.3 MB, wheel 315 kB) was refused for
    the 1 GiB that a whole-GiB field rounded its floor up to. The floor is a fraction now: 0.8 GiB builds, and a
    disk below the floor is still refused, naming the floor."""
    import dataclasses

    def planned(free_gib: float):  # type: ignore[no-untyped-def]
        snap = dataclasses.replace(CPU, platform=dataclasses.replace(CPU.platform,
                                                                     disk_free_bytes=int(free_gib * 2**30)))
        return plan_build(snap, load_catalog(), Request(backend="af-ext-fixture", from_source=True,
                                                        source=path_source(EXT_PKG)))

    fits = planned(0.8)
    assert fits.recipe.id == "torch-cpp-extension"
    assert fits.preflight.ok, [c.text() for c in fits.preflight.failures]
    full = {c.name: c.text() for c in planned(0.1).preflight.failures}
    assert "0.1 GiB free" in full["disk"] and "about 0.25 GiB" in full["disk"]
