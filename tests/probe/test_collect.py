"""The collectors, run against recorded real outputs through the FakeRunner (no GPU, no torch import)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from attnforge.probe import GpuInfo, ProbeContext, collect_snapshot
from attnforge.probe.collect import BUILD_ENV_VARS
from attnforge.probe.gpus import SMI_QUERY
from tests._fakes import FakeRunner, recorded

TORCH_SCRIPT = str(Path(__import__("attnforge.probe.collect").probe.collect.__file__).with_name("_torch_script.py"))


def _stub(dirpath: Path, *names: str) -> None:
    dirpath.mkdir(parents=True, exist_ok=True)
    for n in names:
        p = dirpath / n
        p.write_text("#!/bin/sh\nexit 99\n")  # never executed: the FakeRunner answers instead
        p.chmod(0o755)


def _no_nvml() -> list[GpuInfo]:
    raise OSError("NVML Shared Library Not Found")


@pytest.fixture
def h200_machine(tmp_path: Path) -> tuple[ProbeContext, FakeRunner]:
    """A machine laid out like the lent H200: CUDA 13.0 under /usr/local/cuda, gcc 13, ninja, nvidia-smi."""
    root = tmp_path / "root"
    cuda = root / "usr" / "local" / "cuda"
    _stub(cuda / "bin", "nvcc")
    (cuda / "include").mkdir(parents=True)
    (cuda / "include" / "cuda_runtime.h").write_text("")
    bindir = tmp_path / "bin"
    _stub(bindir, "gcc", "g++", "ninja", "nvidia-smi")
    runner = FakeRunner()
    runner.add([sys.executable, TORCH_SCRIPT], recorded("torch_probe_h200.json"))
    runner.add(SMI_QUERY, recorded("nvidia-smi_query_h200.csv"))
    runner.add(["nvidia-smi"], recorded("nvidia-smi_h200.txt"))
    runner.add([str(cuda / "bin" / "nvcc"), "--version"], recorded("nvcc_13.0_linux.txt"))
    runner.add([str(bindir / "gcc"), "--version"], recorded("gcc_13_ubuntu.txt"))
    runner.add([str(bindir / "g++"), "--version"], recorded("gcc_13_ubuntu.txt").replace("gcc (", "g++ ("))
    runner.add([str(bindir / "ninja"), "--version"], "1.13.0\n")
    env = {"PATH": str(bindir), "MAX_JOBS": "16", "HOME": str(tmp_path), "UNRELATED": "x"}
    ctx = ProbeContext(runner=runner, environ=env, python=sys.executable, os_name="linux", fs_root=root,
                       cache_dir=tmp_path / "cache", nvml=_no_nvml, timeout_s=5)
    return ctx, runner


def test_h200_machine_from_recorded_outputs(h200_machine: tuple[ProbeContext, FakeRunner]) -> None:
    ctx, _ = h200_machine
    snap = collect_snapshot(ctx, backends=())
    assert [(g.name, g.compute_capability, g.source, g.cuda_driver_version) for g in snap.gpus] == [
        ("NVIDIA H200", (9, 0), "nvidia-smi", "13.0")]
    assert snap.torch is not None
    assert (snap.torch.version, snap.torch.cuda_version, snap.torch.cudnn_version) == ("2.11.0+cu130", "13.0", 91900)
    assert snap.torch.arch_list[-1] == "sm_120"
    assert [(t.version, t.found_via, t.has_headers) for t in snap.cuda_toolkits] == [("13.0", "glob", True)]
    assert {c.kind: c.version for c in snap.compilers} == {"gcc": "13.3.0", "g++": "13.3.0"}
    assert snap.ninja is not None and snap.ninja.version == "1.13.0"
    assert snap.env == {"MAX_JOBS": "16"}  # only build-relevant variables are recorded
    assert all(v in BUILD_ENV_VARS for v in snap.env)
    assert snap.problem("gpus") is None
    assert snap.problem("torch") is None


def test_nvml_is_preferred_when_it_works(h200_machine: tuple[ProbeContext, FakeRunner]) -> None:
    ctx, runner = h200_machine
    gpu = GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0), memory_bytes=80 * 2**30,
                  driver_version="580.159.04", cuda_driver_version="13.0", source="nvml")
    snap = collect_snapshot(ProbeContext(**{**_fields(ctx), "nvml": lambda: [gpu]}), backends=())
    assert snap.gpus == (gpu,)
    assert not any(call[0] == "nvidia-smi" for call in runner.calls)


def test_torch_is_the_last_gpu_fallback(h200_machine: tuple[ProbeContext, FakeRunner]) -> None:
    ctx, runner = h200_machine
    del runner.responses[("nvidia-smi", *SMI_QUERY[1:])]
    snap = collect_snapshot(ctx, backends=())
    assert [(g.name, g.source) for g in snap.gpus] == [("NVIDIA H200", "torch")]


def test_no_gpu_no_torch_no_nvcc_still_gives_a_snapshot(tmp_path: Path) -> None:
    runner = FakeRunner()
    runner.add([sys.executable, TORCH_SCRIPT], '{"error": "ModuleNotFoundError: No module named \'torch\'"}\n')
    ctx = ProbeContext(runner=runner, environ={"PATH": str(tmp_path)}, os_name="linux", fs_root=tmp_path,
                       cache_dir=tmp_path, nvml=_no_nvml, timeout_s=5)
    snap = collect_snapshot(ctx, backends=())
    assert snap.gpus == () and snap.torch is None and snap.cuda_toolkits == () and snap.compilers == ()
    reasons = {p.section: p.reason for p in snap.problems}
    assert "No module named 'torch'" in reasons["torch"]
    assert "nvidia-smi: not found on PATH" in reasons["gpus"]
    assert "no nvcc" in reasons["cuda_toolkits"]
    assert "compilers" in reasons


@pytest.mark.parametrize(
    ("stdout", "stderr", "code", "expected"),
    [
        pytest.param("", "Segmentation fault", -11, "the torch probe crashed: Segmentation fault", id="crash"),
        pytest.param("", "timed out", 124, "did not finish", id="timeout"),
        pytest.param("not json\n", "", 0, "the torch probe crashed", id="garbage"),
    ],
)
def test_a_broken_torch_cannot_crash_the_probe(tmp_path: Path, stdout: str, stderr: str, code: int,
                                               expected: str) -> None:
    runner = FakeRunner().add([sys.executable, TORCH_SCRIPT], stdout, stderr=stderr, returncode=code)
    ctx = ProbeContext(runner=runner, environ={"PATH": str(tmp_path)}, os_name="linux", fs_root=tmp_path,
                       cache_dir=tmp_path, nvml=_no_nvml, timeout_s=5)
    snap = collect_snapshot(ctx, backends=())
    assert snap.torch is None
    assert expected in (snap.problem("torch") or "")


def test_cuda_home_wins_and_wrapper_roots_are_flagged(tmp_path: Path) -> None:
    """On the dev machine /usr/local/bin/nvcc is a wrapper script: its root has no headers."""
    wrapper_bin = tmp_path / "usr" / "local" / "bin"
    _stub(wrapper_bin, "nvcc")
    real = tmp_path / "cuda-13.0"
    _stub(real / "bin", "nvcc")
    (real / "include").mkdir()
    (real / "include" / "cuda_runtime.h").write_text("")
    runner = FakeRunner()
    runner.add([str(wrapper_bin / "nvcc"), "--version"], recorded("nvcc_13.0_linux.txt"))
    runner.add([str(real / "bin" / "nvcc"), "--version"], recorded("nvcc_13.0_linux.txt"))
    ctx = ProbeContext(runner=runner, environ={"PATH": str(wrapper_bin), "CUDA_HOME": str(real)}, os_name="linux",
                       fs_root=tmp_path / "empty", cache_dir=tmp_path, nvml=_no_nvml, timeout_s=5)
    snap = collect_snapshot(ctx, backends=())
    vias = {t.found_via: t.has_headers for t in snap.cuda_toolkits}
    assert vias == {"CUDA_HOME": True, "PATH": False}
    assert snap.primary_toolkit is not None and snap.primary_toolkit.path == str(real)


def _fields(ctx: ProbeContext) -> dict[str, object]:
    import dataclasses

    return {f.name: getattr(ctx, f.name) for f in dataclasses.fields(ctx)}


@dataclasses.dataclass(frozen=True)
class _Query:
    """A backend to look for, as plain data (the probe never reads the catalog itself)."""

    id: str
    distributions: tuple[str, ...]
    version_spec: SpecifierSet = dataclasses.field(default_factory=SpecifierSet)
    import_name: str = "nothing"
    native_modules: tuple[str, ...] = ()

    @property
    def builtin(self) -> bool:
        return not self.distributions


def test_backends_to_look_for_are_data(h200_machine: tuple[ProbeContext, FakeRunner]) -> None:
    ctx, _ = h200_machine
    wanted = [_Query("ghost", ("attnforge-no-such-distribution",)), _Query("sdpa", ())]
    snap = collect_snapshot(ctx, backends=wanted)
    assert [(b.backend, b.distribution, b.imports) for b in snap.backends] == [("ghost", None, None)]
    assert collect_snapshot(ctx, backends=()).backends == ()


def test_probe_imports_without_the_catalog() -> None:
    code = ("import sys, attnforge.probe; bad = sorted(m for m in sys.modules if m.startswith('attnforge.catalog'));"
            " print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
