"""The executor on a Windows snapshot: vcvars64 replayed through the runner seam, pip replaced at the launcher.

Nothing here ran on Windows. The resolver plans from the Windows snapshot fixtures, ``cmd /d /c
vcvars_capture.cmd`` answers with the recorded ``vcvars64.bat -vcvars_ver=14.39 && set`` output, and the
ReplayLauncher (a real child process) records the environment the build process was given. The Windows build
roots (``C:\\afb\\<key8>``) are relative names on Linux, so each test runs in its own temporary directory.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from attnforge._system.runner import Completed
from attnforge.build import execute
from attnforge.build.windows_env import parse_set_output
from attnforge.catalog import load_catalog
from attnforge.errors import BuildError, ResolveError
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve import build_spec
from attnforge.resolve.types import BuildSpec, Request, SourceKind, SourceSpec
from tests._fakes import FIXTURES, OUTPUTS, FakeRunner
from tests.build._helpers import FA_LOG, ReplayLauncher, copy_fixture

RTX5090 = FIXTURES / "snapshots" / "windows_rtx5090_torch2.8_cu128.json"
VS17_10 = FIXTURES / "snapshots" / "windows_vs17.10_cuda12.3_torch2.5_cu124.json"
SET_14_39 = OUTPUTS / "windows" / "vcvars64_vcvars_ver_14.39_set.txt"
MISSING_14_39 = OUTPUTS / "windows" / "vcvars64_missing_toolset_14.39.txt"
CUDA_ROOT = r"C:\Program Files\NVIDIA GPU Computing Toolkit\CUDA"
USER_ENV = {  # what os.environ looks like in a plain cmd prompt on that machine
    "Path": r"C:\WINDOWS\system32;C:\Users\dev\AppData\Local\Programs\Python\Python312",
    "TMP": r"C:\Users\dev\AppData\Local\Temp",
    "TEMP": r"C:\Users\dev\AppData\Local\Temp",
    "SystemRoot": r"C:\WINDOWS",
}


def recorded_capture(path: Path = SET_14_39) -> str:
    """The recorded ``vcvars64 && set`` output with the marker line the capture script echoes."""
    text = path.read_bytes().decode("utf-8")
    banner, sep, rest = text.partition("'x64'\r\n")
    return banner + sep + "===attnforge-vcvars-set===\r\n" + rest if sep else text


@dataclass
class VcvarsRunner(FakeRunner):
    """A FakeRunner that answers ``cmd /d /c <capture script>`` (the script's name is per build) and keeps
    each script's text, so a test can see which vcvars64.bat and ``-vcvars_ver`` were asked for."""

    output: str = ""
    returncode: int = 0
    scripts: list[str] = field(default_factory=list)

    def run(self, argv: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
            timeout_s: float | None = None) -> Completed:
        if tuple(argv[:3]) == ("cmd", "/d", "/c"):
            self.scripts.append(Path(argv[3]).read_bytes().decode("utf-8"))
            self.add(argv, self.output, returncode=self.returncode)
        return super().run(argv, cwd=cwd, env=env, timeout_s=timeout_s)


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _here(spec: BuildSpec, src: Path) -> BuildSpec:
    """The resolver's Windows spec, built from the local fixture package by this interpreter."""
    return dataclasses.replace(spec, source=SourceSpec(kind=SourceKind.PATH, location=str(src)),
                               python=sys.executable)


def _plan(snapshot: SystemSnapshot, backend: str, **request: object) -> BuildSpec:
    return build_spec(snapshot, load_catalog(), Request(backend=backend, **request))  # type: ignore[arg-type]


def _run(spec: BuildSpec, snapshot: SystemSnapshot, home: Path, runner: FakeRunner,
         launcher: ReplayLauncher) -> None:
    execute(spec, home=home, runner=runner, launcher=launcher, environ=USER_ENV, snapshot=snapshot)


def test_sageattention2_on_the_rtx5090_gets_the_vcvars_environment_and_the_windows_variables(
    in_tmp: Path,
) -> None:
    snap = SystemSnapshot.load(RTX5090)
    spec = _plan(snap, "sageattention-2")
    assert spec.msvc_toolset == "14.44"
    runner, launcher = VcvarsRunner(output=recorded_capture()), ReplayLauncher(FA_LOG)
    _run(_here(spec, copy_fixture(in_tmp / "src")), snap, in_tmp / "home", runner, launcher)

    env, captured = launcher.env, parse_set_output(SET_14_39.read_bytes().decode("utf-8"))
    # the resolver's decisions
    assert env["TORCH_CUDA_ARCH_LIST"] == "12.0"
    assert env["EXT_PARALLEL"] == "4"  # the extensions side by side, the jobs shared: 2 + 3 + 2 + 2 <= 9
    assert (spec.max_jobs, env["MAX_JOBS"]) == (9, "3")
    # windows_build_env's
    assert env["DISTUTILS_USE_SDK"] == "1"
    assert env["TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES"] == "1"
    assert env["CUDA_HOME"] == env["CUDA_PATH"] == rf"{CUDA_ROOT}\v12.8"
    assert env["NVCC_APPEND_FLAGS"].split() == ["-Xcompiler=/Zc:__cplusplus", "-DUSE_CUDA=1"]
    assert env["TMP"] == env["TEMP"] == spec.build_root + r"\t"
    assert len(env["TMP"]) < len(USER_ENV["TMP"]), "TMP/TEMP moved under the short build root"
    assert Path(spec.build_root + r"\t").is_dir(), "TMP must exist or tempfile falls back to the long one"
    # vcvars64's, with CUDA's bin first on the one Path
    for name in ("INCLUDE", "LIB", "LIBPATH", "VCToolsInstallDir", "WindowsSdkDir"):
        assert env[name] == captured[name], name
    assert [k for k in env if k.lower() == "path"] == ["Path"]
    assert env["Path"] == rf"{CUDA_ROOT}\v12.8\bin;" + captured["Path"]
    # the capture asked for the resolver's toolset of the newest instance
    (script,) = runner.scripts
    assert (r'call "C:\Program Files\Microsoft Visual Studio\2022\Community\VC\Auxiliary\Build\vcvars64.bat"'
            r" -vcvars_ver=14.44" + "\r\n") in script
    assert runner.calls[0][:3] == ("cmd", "/d", "/c")


def test_an_older_toolset_chosen_by_the_resolver_is_what_vcvars_is_asked_for(in_tmp: Path) -> None:
    # VS 2022 17.10 (MSVC 14.40) with CUDA 12.3: nvcc refuses 14.40; the 14.39 toolset is installed side by
    # side, so the resolver selects it and the build captures vcvars64 -vcvars_ver=14.39 (KB-09).
    base = SystemSnapshot.load(VS17_10)
    vs = dataclasses.replace(base.visual_studio[0], msvc_toolsets=("14.40.33807", "14.39.33519"))
    snap = dataclasses.replace(base, visual_studio=(vs,))
    spec = _plan(snap, "xformers")
    assert spec.msvc_toolset == "14.39"
    runner, launcher = VcvarsRunner(output=recorded_capture()), ReplayLauncher(FA_LOG)
    _run(_here(spec, copy_fixture(in_tmp / "src")), snap, in_tmp / "home", runner, launcher)

    (script,) = runner.scripts
    assert (r'call "C:\Program Files (x86)\Microsoft Visual Studio\2022\BuildTools\VC\Auxiliary\Build'
            r'\vcvars64.bat" -vcvars_ver=14.39' + "\r\n") in script
    env = launcher.env
    assert env["VCToolsVersion"] == "14.39.33519"
    assert env["CUDA_HOME"] == rf"{CUDA_ROOT}\v12.3"
    assert env["TORCH_CUDA_ARCH_LIST"] == "8.9"
    assert "-allow-unsupported-compiler" not in env["NVCC_APPEND_FLAGS"]
    log = next((in_tmp / "home" / "logs").iterdir()).read_text(encoding="utf-8")
    assert "-vcvars_ver=14.39 && set" in log, "the build log names the vcvars command to rerun by hand"


def test_allow_unsupported_compiler_passes_the_preflight_and_reaches_nvcc_on_windows(in_tmp: Path) -> None:
    snap = SystemSnapshot.load(VS17_10)  # only MSVC 14.40, which nvcc 12.3 refuses
    with pytest.raises(ResolveError, match="cannot be built"):
        _plan(snap, "xformers")
    spec = _plan(snap, "xformers", allow_unsupported_compiler=True)
    assert spec.allow_unsupported_compiler
    assert any("at your own risk" in n for n in spec.notes)
    # the recording stands in for 14.40's environment: only the flags are asserted here
    launcher = ReplayLauncher(FA_LOG)
    _run(_here(spec, copy_fixture(in_tmp / "src")), snap, in_tmp / "home",
         VcvarsRunner(output=recorded_capture()), launcher)
    assert "-allow-unsupported-compiler" in launcher.env["NVCC_APPEND_FLAGS"].split()


def test_a_failed_vcvars_stops_before_the_build_with_vcvars_words(in_tmp: Path) -> None:
    snap = SystemSnapshot.load(RTX5090)
    spec = _here(_plan(snap, "sageattention-2"), copy_fixture(in_tmp / "src"))
    launcher = ReplayLauncher(FA_LOG)
    runner = VcvarsRunner(output=MISSING_14_39.read_bytes().decode("utf-8"), returncode=1)
    with pytest.raises(BuildError) as err:
        _run(spec, snap, in_tmp / "home", runner, launcher)
    assert "Toolset directory for version '14.39' was not found" in (err.value.cause or "")
    assert launcher.argv == [], "pip never started"
    assert not any((in_tmp / "home" / "staging").iterdir())  # made before the build, left empty


def test_sccache_is_refused_for_a_windows_build(in_tmp: Path) -> None:
    snap = SystemSnapshot.load(RTX5090)
    spec = dataclasses.replace(_here(_plan(snap, "sageattention-2"), copy_fixture(in_tmp / "src")),
                               use_sccache=True)
    launcher = ReplayLauncher(FA_LOG)
    with pytest.raises(BuildError, match="Linux only"):
        _run(spec, snap, in_tmp / "home", VcvarsRunner(output=recorded_capture()), launcher)
    assert launcher.argv == []
