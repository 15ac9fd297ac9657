"""The GPU code really inside a wheel: fatbin parsing, and the refusal of a wheel that lacks this GPU's code.

The integration tests compile a real CUDA shared object for sm_80 only with /usr/local/cuda/bin/nvcc (a
one-line kernel, a few seconds) and put it in a wheel.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest

from attnforge._system.runner import SubprocessRunner
from attnforge.cache import Store
from attnforge.catalog import load_catalog
from attnforge.catalog.toolchain import Target
from attnforge.errors import InstallError
from attnforge.install.fatbin import arch_problems, fatbin_targets, wheel_targets
from attnforge.install.flow import install
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.types import Request
from tests.conftest import REPO
from tests.install.helpers import OrderedPlanner, pip_wheel_builder

NVCC = "/usr/local/cuda/bin/nvcc"
SNAPSHOT = REPO / "tests" / "fixtures" / "snapshots" / "cpu_dev_torch2.13_cpu.json"


def _entry(kind: int, arch: int, payload: bytes) -> bytes:
    header = struct.pack("<HHIQ", kind, 0x0101, 64, len(payload)) + b"\0" * 12 + struct.pack("<I", arch)
    return header.ljust(64, b"\0") + payload


def test_fatbin_entries_are_read_and_stray_magic_is_ignored() -> None:
    body = _entry(2, 90, b"\x7fELF-cubin") + _entry(1, 80, b".version 8.0\0")
    container = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body
    stray = struct.pack("<I", 0xBA55ED50) + b"junk"
    targets = fatbin_targets(b"prefix" + stray + container + b"suffix")
    assert [str(t) for t in targets] == ["compute_80", "sm_90"]


def test_arch_problems_lists_what_the_binary_has() -> None:
    tools = load_catalog().tools
    modules = {"pkg/_C.so": [Target.parse("sm_80"), Target.parse("compute_80")]}
    assert arch_problems(modules, [(9, 0)], tools.runs_on) == []  # PTX for 8.0 JIT-compiles on 9.0
    modules = {"pkg/_C.so": [Target.parse("sm_80"), Target.parse("sm_86")]}
    problems = arch_problems(modules, [(9, 0), (8, 9)], tools.runs_on)
    assert problems == [
        "pkg/_C.so has no SASS or compatible PTX for compute capability 9.0: it holds sm_80, sm_86",
    ]


@pytest.fixture(scope="module")
def sm80_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not Path(NVCC).exists():
        pytest.skip("needs /usr/local/cuda/bin/nvcc")
    work = tmp_path_factory.mktemp("sm80")
    (work / "k.cu").write_text(
        "__global__ void k(float* x) { x[0] = 1.0f; }\nextern \"C\" void launch(float* x) { k<<<1, 1>>>(x); }\n"
    )
    so = work / "_k.so"
    subprocess.run(
        [NVCC, "-shared", "-Xcompiler", "-fPIC", "-cudart", "shared", "-gencode", "arch=compute_80,code=sm_80",
         "-o", str(so), str(work / "k.cu")],
        check=True, capture_output=True, timeout=300,
    )
    dist = "af_cuda_fixture-0.1.0"
    wheel = work / "wheels" / f"{dist}-py3-none-linux_x86_64.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("af_cuda_fixture/__init__.py", "")
        zf.write(so, "af_cuda_fixture/_k.so")
        zf.writestr(f"{dist}.dist-info/METADATA", "Metadata-Version: 2.1\nName: af-cuda-fixture\nVersion: 0.1.0\n")
        wheel_meta = "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: py3-none-linux_x86_64\n"
        zf.writestr(f"{dist}.dist-info/WHEEL", wheel_meta)
        zf.writestr(f"{dist}.dist-info/RECORD", "")
    return wheel


@pytest.mark.integration
def test_a_real_sm80_binary_reads_as_sm80(sm80_wheel: Path) -> None:
    found = wheel_targets(sm80_wheel, use_cuobjdump=False)
    assert {k: [str(t) for t in v] for k, v in found.items()} == {"af_cuda_fixture/_k.so": ["sm_80"]}
    if shutil.which("/usr/local/cuda/bin/cuobjdump"):  # the tool, when present, must agree
        assert [str(t) for t in wheel_targets(sm80_wheel)["af_cuda_fixture/_k.so"]] == ["sm_80"]


@pytest.mark.integration
def test_install_refuses_the_sm80_wheel_on_a_9_0_gpu_after_download(sm80_wheel: Path, tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    planner = OrderedPlanner(find_links=sm80_wheel.parent)
    with pytest.raises(InstallError) as err:
        install(
            Request(backend="af-cuda-fixture", archs=((9, 0),)),
            snapshot=SystemSnapshot.load(SNAPSHOT), store=store, planner=planner, builder=pip_wheel_builder,
            verifier=None, runner=SubprocessRunner(), python="/nonexistent/python",
        )
    assert "has no GPU code for this machine" in err.value.message
    assert "compute capability 9.0: it holds sm_80" in str(err.value.cause)
    assert store.list() == []  # refused before it entered the cache


@pytest.mark.integration
def test_the_sm80_wheel_passes_on_an_8_6_gpu(sm80_wheel: Path) -> None:
    tools = load_catalog().tools
    assert arch_problems(wheel_targets(sm80_wheel, use_cuobjdump=False), [(8, 6)], tools.runs_on) == []
