"""The Windows probe, run here on recorded real Windows outputs (tests/fixtures/outputs/windows/).

No Windows machine ran these tests: vswhere JSON, cl banners, nvcc banners and reg output are replayed through
the FakeRunner, and the filesystem parts (MSVC toolset folders, CUDA folders) are built under tmp_path.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

from attnforge._system.runner import NOT_FOUND, Completed
from attnforge.probe import collect_snapshot, parsers
from attnforge.probe.context import ProbeContext
from attnforge.probe.snapshot import GpuInfo
from attnforge.probe.windows import (
    PYTHON_DEV_SCRIPT,
    VSWHERE_ARGS,
    collect_python_dev,
    collect_visual_studio,
    reg_query_long_paths,
    vswhere_path,
)
from tests._fakes import OUTPUTS, FakeRunner


def win(name: str) -> str:
    """A recorded Windows output byte for byte (CRLF kept, as the runner would decode it)."""
    return (OUTPUTS / "windows" / name).read_bytes().decode("utf-8")


WIN_PYTHON = r"C:\Users\dev\AppData\Local\Programs\Python\Python312\python.exe"


class PathRunner(FakeRunner):
    """A FakeRunner that tells programs apart by their full path (several nvcc.exe on one machine)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_path: dict[tuple[str, ...], Completed] = {}

    def add_exact(self, argv: Sequence[str], stdout: str = "", *, stderr: str = "", rc: int = 0) -> None:
        self.by_path[tuple(argv)] = Completed(argv=tuple(argv), returncode=rc, stdout=stdout, stderr=stderr)

    def run(self, argv: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
            timeout_s: float | None = None) -> Completed:
        hit = self.by_path.get(tuple(map(str, argv)))
        if hit is not None:
            self.calls.append(tuple(map(str, argv)))
            return hit
        return super().run(argv, cwd=cwd, env=env, timeout_s=timeout_s)


def _vswhere_json_at(tmp_path: Path) -> tuple[str, list[Path]]:
    """The recorded two-instance vswhere answer, with each installationPath moved under tmp_path."""
    data = json.loads(win("vswhere_two_instances.json"))
    roots = []
    for i, item in enumerate(data):
        root = tmp_path / f"vs{i}"
        item["installationPath"] = str(root)
        roots.append(root)
    return json.dumps(data), roots


def _ctx(runner: FakeRunner, tmp_path: Path, *, environ: Mapping[str, str] | None = None,
         registry: Callable[[], int | None] = lambda: None) -> ProbeContext:
    env = {"PATH": str(tmp_path / "empty-path"), "ProgramFiles": str(tmp_path / "pf"),
           "ProgramFiles(x86)": r"C:\Program Files (x86)", **(environ or {})}
    return ProbeContext(runner=runner, environ=env, python=WIN_PYTHON, os_name="windows", fs_root=tmp_path,
                        cache_dir=tmp_path / "cache", nvml=_no_nvml, registry=registry, timeout_s=5.0)


def _no_nvml() -> list[GpuInfo]:
    raise RuntimeError("NVML Shared Library Not Found")


# -- parsers over recorded outputs ---------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "version", "msc"), [
    pytest.param("cl_19.39_stderr.txt", "19.39.33523", 1939, id="vs2022-17.9"),
    pytest.param("cl_19.44_stderr.txt", "19.44.35207", 1944, id="vs2022-17.14"),
    pytest.param("cl_19.51_zh-cn_stderr.txt", "19.51.36248", 1951, id="vs2026-localised-banner"),
])
def test_cl_banner_gives_version_and_msc_ver(name: str, version: str, msc: int) -> None:
    parsed = parsers.cl_banner(win(f"{name}"))
    assert parsed is not None
    assert parsed[0] == version
    assert version in parsed[1]
    assert parsers.msc_ver(parsed[0]) == msc


def test_cl_banner_rejects_the_linker_banner() -> None:
    assert parsers.cl_banner("Microsoft (R) Incremental Linker Version 14.44.35207.1\r\n") is None


@pytest.mark.parametrize(("name", "release", "build"), [
    pytest.param("nvcc_12.3_windows.txt", "12.3", "Build cuda_12.3.r12.3/compiler.33567101_0", id="12.3"),
    pytest.param("nvcc_12.8_windows.txt", "12.8", "Build cuda_12.8.r12.8/compiler.35404655_0", id="12.8"),
    pytest.param("nvcc_13.0_windows.txt", "13.0", "Build cuda_13.0.r13.0/compiler.36424714_0", id="13.0"),
])
def test_nvcc_windows_banners_with_crlf(name: str, release: str, build: str) -> None:
    text = win(f"{name}")
    assert "\r\n" in text
    assert parsers.nvcc_release(text) == (release, build)


@pytest.mark.parametrize(("toolset", "msc"), [
    pytest.param("14.29.30133", 1929, id="vs2019"),
    pytest.param("14.39.33519", 1939, id="vs2022-17.9"),
    pytest.param("14.40.33807", 1940, id="vs2022-17.10"),
    pytest.param("14.44.35207", 1944, id="vs2022-17.14"),
    pytest.param("14.50.35717", 1950, id="vs2026"),
])
def test_toolset_msc_ver(toolset: str, msc: int) -> None:
    assert parsers.toolset_msc_ver(toolset) == msc


@pytest.mark.parametrize("bad", ["19.44.35207", "14", "v143", ""])
def test_toolset_msc_ver_rejects_non_toolsets(bad: str) -> None:
    with pytest.raises(ValueError, match="not an MSVC toolset"):
        parsers.toolset_msc_ver(bad)


# -- Visual Studio instances ---------------------------------------------------------------------------------
def test_two_instances_newest_first_with_their_toolsets(tmp_path: Path) -> None:
    text, (community, buildtools) = _vswhere_json_at(tmp_path)
    for root, toolsets in ((community, ["14.44.35207", "14.39.33519"]), (buildtools, ["14.39.33519"])):
        for t in toolsets:
            (root / "VC" / "Tools" / "MSVC" / t).mkdir(parents=True)
    runner = FakeRunner().add((str(vswhere_path()), *VSWHERE_ARGS), text)
    found, why = collect_visual_studio(_ctx(runner, tmp_path))
    assert why is None
    names = [vs.display_name for vs in found]
    assert names == ["Visual Studio Community 2022", "Visual Studio Build Tools 2022"]
    assert [vs.version for vs in found] == ["17.14.37027.9", "17.9.34728.123"]
    assert found[0].msvc_toolsets == ("14.44.35207", "14.39.33519")
    assert found[1].msvc_toolsets == ("14.39.33519",)


@pytest.mark.parametrize(("stdout", "rc", "reason"), [
    pytest.param("", NOT_FOUND, "no Visual Studio 2017+", id="no-vswhere"),
    pytest.param(win("vswhere_none.json"), 0, "Desktop development with C++", id="no-cpp-workload"),
    pytest.param("not json", 0, "vswhere:", id="garbage"),
])
def test_no_usable_visual_studio_gives_a_reason(tmp_path: Path, stdout: str, rc: int, reason: str) -> None:
    runner = FakeRunner()
    if rc != NOT_FOUND:
        runner.add((str(vswhere_path()), *VSWHERE_ARGS), stdout, returncode=rc)
    found, why = collect_visual_studio(_ctx(runner, tmp_path))
    assert found == []
    assert why is not None
    assert reason in why


# -- LongPathsEnabled ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "rc", "value", "enabled"), [
    pytest.param("reg_long_paths_1.txt", 0, 1, True, id="enabled"),
    pytest.param("reg_long_paths_0.txt", 0, 0, False, id="disabled"),
    pytest.param("reg_long_paths_absent_stderr.txt", 1, None, None, id="absent"),
])
def test_long_paths_from_recorded_reg_output(tmp_path: Path, name: str, rc: int, value: int | None,
                                             enabled: bool | None) -> None:
    text = win(f"{name}")
    reg = FakeRunner().add(("reg", "query", r"HKLM\SYSTEM\CurrentControlSet\Control\FileSystem", "/v",
                            "LongPathsEnabled"), "" if rc else text, stderr=text if rc else "", returncode=rc)
    assert reg_query_long_paths(reg) == value
    snap = collect_snapshot(_ctx(FakeRunner(), tmp_path, registry=lambda: reg_query_long_paths(reg)), backends=())
    assert snap.long_paths_enabled is enabled


def test_a_registry_error_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    def denied() -> int | None:
        raise PermissionError("[WinError 5] Access is denied")

    snap = collect_snapshot(_ctx(FakeRunner(), tmp_path, registry=denied), backends=())
    assert snap.long_paths_enabled is None
    assert "Access is denied" in (snap.problem("long_paths_enabled") or "")


# -- CUDA toolkits under Program Files -----------------------------------------------------------------------
def _toolkit(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "include" / "cuda_runtime.h").write_text("")
    nvcc = root / "bin" / "nvcc.exe"
    nvcc.write_text("")
    return nvcc


def test_toolkits_from_cuda_path_and_program_files(tmp_path: Path) -> None:
    base = tmp_path / "pf" / "NVIDIA GPU Computing Toolkit" / "CUDA"
    runner = PathRunner()
    for folder, output in (("v12.3", "nvcc_12.3_windows.txt"), ("v12.8", "nvcc_12.8_windows.txt"),
                           ("v13.0", "nvcc_13.0_windows.txt")):
        runner.add_exact((str(_toolkit(base / folder)), "--version"), win(f"{output}"))
    environ = {"CUDA_PATH": str(base / "v12.8"), "CUDA_PATH_V12_8": str(base / "v12.8"),
               "CUDA_PATH_V12_3": str(base / "v12.3")}
    snap = collect_snapshot(_ctx(runner, tmp_path, environ=environ), backends=())
    found = [(t.version, t.found_via) for t in snap.cuda_toolkits]
    # CUDA_PATH first, then the per-version variables newest first, then folders not seen yet
    assert found == [("12.8", "CUDA_PATH"), ("12.3", "CUDA_PATH_V12_3"), ("13.0", "glob")]
    assert snap.primary_toolkit is not None
    assert snap.primary_toolkit.version == "12.8"


def test_program_files_folders_are_ordered_by_version_not_name(tmp_path: Path) -> None:
    base = tmp_path / "pf" / "NVIDIA GPU Computing Toolkit" / "CUDA"
    runner = PathRunner()
    for folder, output in (("v12.8", "nvcc_12.8_windows.txt"), ("v13.0", "nvcc_13.0_windows.txt"),
                           ("v12.10", "nvcc_12.3_windows.txt")):
        runner.add_exact((str(_toolkit(base / folder)), "--version"), win(f"{output}"))
    snap = collect_snapshot(_ctx(runner, tmp_path), backends=())
    assert [Path(t.path).name for t in snap.cuda_toolkits] == ["v13.0", "v12.10", "v12.8"]


def test_cuda_path_without_nvcc_is_reported(tmp_path: Path) -> None:
    snap = collect_snapshot(_ctx(FakeRunner(), tmp_path, environ={"CUDA_PATH": str(tmp_path / "gone")}), backends=())
    assert snap.cuda_toolkits == ()
    assert "has no bin/nvcc.exe" in (snap.problem("cuda_toolkits") or "")


# -- embedded / portable Python ------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "can_build", "embedded"), [
    pytest.param("python_dev_installed_3.12.json", True, False, id="python.org-install"),
    pytest.param("python_dev_embedded_3.12.json", False, True, id="comfyui-python_embeded"),
])
def test_python_dev_files(tmp_path: Path, name: str, can_build: bool, embedded: bool) -> None:
    runner = FakeRunner().add((WIN_PYTHON, "-c", PYTHON_DEV_SCRIPT), win(f"{name}"))
    snap = collect_snapshot(_ctx(runner, tmp_path), backends=())
    assert snap.python_dev is not None
    assert snap.python_dev.can_build_extensions is can_build
    assert snap.python_dev.embedded is embedded
    assert snap.python_dev.import_lib == "python312.lib"


def test_python_dev_probe_failure_is_a_reason(tmp_path: Path) -> None:
    dev, why = collect_python_dev(_ctx(FakeRunner(), tmp_path))
    assert dev is None
    assert why is not None
    assert "did not report" in why


def test_the_python_dev_script_runs_here() -> None:
    """The script itself is real Python: on this Linux interpreter it finds Python.h and reports no libs."""
    import subprocess
    import sys

    argv = [sys.executable, "-c", PYTHON_DEV_SCRIPT]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    data = parsers.python_dev_json(out.stdout)
    assert data is not None
    assert data["libs_dir"] is None
    assert data["has_import_lib"] is None
    assert isinstance(data["has_python_h"], bool)


def test_windows_snapshot_round_trips_through_json(tmp_path: Path) -> None:
    runner = FakeRunner().add((WIN_PYTHON, "-c", PYTHON_DEV_SCRIPT),
                              win("python_dev_embedded_3.12.json"))
    snap = collect_snapshot(_ctx(runner, tmp_path, registry=lambda: 0), backends=())
    again = type(snap).from_json(snap.to_json())
    assert again == snap
