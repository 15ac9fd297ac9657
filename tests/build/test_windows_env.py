"""The Windows build environment, decided from Windows snapshots and recorded vcvars/set outputs.

Nothing here ran on Windows: the snapshot fixture is written from recorded outputs and the research notes,
and vcvars64 is replayed through the FakeRunner.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from attnforge.build.windows_env import (
    WindowsBuildEnv,
    capture_vcvars,
    merge_env,
    parse_set_output,
    vc_env_problems,
    vcvars_command_line,
    windows_build_env,
)
from attnforge.catalog import load_catalog
from attnforge.catalog.msvc import load_msvc
from attnforge.catalog.toolchain import HostCompilerRange
from attnforge.errors import BuildError
from attnforge.probe.snapshot import CudaToolkit, PythonDevFiles, SystemSnapshot, TorchInfo
from attnforge.resolve.buildspec import plan_build
from attnforge.resolve.msvc import FixKind, check_msvc, choose_windows_toolchain
from attnforge.resolve.types import Request
from tests._fakes import FIXTURES, OUTPUTS, FakeRunner

SNAPSHOT = FIXTURES / "snapshots" / "windows_rtx5090_torch2.8_cu128.json"
Rows = tuple[HostCompilerRange, ...]
CUDA_ROOT = r"C:\Program Files\NVIDIA GPU Computing Toolkit\CUDA"


def win(name: str) -> str:
    return (OUTPUTS / "windows" / name).read_bytes().decode("utf-8")


@pytest.fixture(scope="module")
def snap() -> SystemSnapshot:
    return SystemSnapshot.load(SNAPSHOT)


@pytest.fixture(scope="module")
def rows() -> Rows:
    toolchain = load_catalog().toolchain
    assert toolchain is not None
    return tuple(toolchain.host_compilers)


def _toolkit(version: str, via: str = "CUDA_PATH") -> CudaToolkit:
    root = rf"{CUDA_ROOT}\v{version}"
    return CudaToolkit(path=root, nvcc=rf"{root}\bin\nvcc.exe", version=version, build=None, found_via=via)


def _with(snap: SystemSnapshot, *, toolkits: tuple[CudaToolkit, ...] | None = None,
          toolsets: tuple[tuple[str, ...], tuple[str, ...]] | None = None, **kw: object) -> SystemSnapshot:
    changes: dict[str, object] = dict(kw)
    if toolkits is not None:
        changes["cuda_toolkits"] = toolkits
    if toolsets is not None:
        changes["visual_studio"] = tuple(dataclasses.replace(vs, msvc_toolsets=ts)
                                         for vs, ts in zip(snap.visual_studio, toolsets, strict=True))
    return dataclasses.replace(snap, **changes)


# -- the showcase: RTX 5090, torch 2.8.0+cu128, CUDA 12.8, VS 2022 17.14 -----------------------------------
def test_rtx5090_plans_sageattention2_with_the_windows_environment(snap: SystemSnapshot) -> None:
    catalog = load_catalog()
    decision = plan_build(snap, catalog, Request(backend="sageattention-2"))
    assert decision.spec is not None, [c for c in decision.preflight.checks if not c.ok]
    spec = decision.spec
    assert spec.env["TORCH_CUDA_ARCH_LIST"] == "12.0"
    assert spec.archs == ((12, 0),)
    assert spec.msvc_toolset == "14.44"

    assert catalog.toolchain is not None
    key8 = spec.build_root.rsplit("\\", 1)[-1]
    toolchain = choose_windows_toolchain(snap, windows=catalog.toolchain.host_compilers, msvc=load_msvc(),
                                         msvc_toolset=spec.msvc_toolset)
    env = windows_build_env(snap, key8=key8, toolchain=toolchain, msvc=load_msvc(), build_root=spec.build_root)
    assert env.msvc.ok is True
    assert env.msvc.msc_ver == 1944
    assert env.visual_studio.display_name == "Visual Studio Community 2022"
    assert env.vcvars_ver == "14.44"
    assert env.vcvars_command == (r'cmd /s /c ""C:\Program Files\Microsoft Visual Studio\2022\Community\VC'
                                  r'\Auxiliary\Build\vcvars64.bat" -vcvars_ver=14.44 && set"')
    assert env.env["DISTUTILS_USE_SDK"] == "1"
    assert env.env["TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES"] == "1"
    assert env.env["CUDA_HOME"] == env.env["CUDA_PATH"] == rf"{CUDA_ROOT}\v12.8"
    assert env.env["TMP"] == env.env["TEMP"] == spec.build_root + r"\t"
    assert len(env.env["TMP"]) <= 20
    flags = env.env["NVCC_APPEND_FLAGS"].split()
    assert flags == ["-Xcompiler=/Zc:__cplusplus", "-DUSE_CUDA=1"]
    assert any("LongPathsEnabled" in n for n in env.notes)

    # the build runs with the user's environment, then vcvars', then these; CUDA's bin first on Path
    captured = parse_set_output(win("vcvars64_vcvars_ver_14.39_set.txt"))
    full = env.full_env({"PATH": r"C:\WINDOWS\system32", "NVCC_APPEND_FLAGS": "ignored"}, captured)
    assert full["PATH"].startswith(rf"{CUDA_ROOT}\v12.8\bin;")
    assert "Path" not in full  # one spelling of a case-insensitive name
    assert full["VCToolsVersion"] == "14.39.33519"
    assert full["NVCC_APPEND_FLAGS"] == env.env["NVCC_APPEND_FLAGS"]


# -- _MSC_VER against nvcc, with the three fixes -------------------------------------------------------------
@pytest.mark.parametrize(("msc", "cuda", "ok"), [
    pytest.param(1944, (12, 8), True, id="vs17.14-cuda12.8"),
    pytest.param(1939, (12, 3), True, id="vs17.9-cuda12.3"),
    pytest.param(1940, (12, 3), False, id="vs17.10-cuda12.3"),
    pytest.param(1944, (12, 4), True, id="vs17.14-cuda12.4"),
    pytest.param(1950, (13, 1), False, id="vs2026-cuda13.1"),
    pytest.param(1950, (13, 2), True, id="vs2026-cuda13.2"),
    pytest.param(1916, (13, 0), False, id="vs2017-cuda13.0"),
])
def test_msvc_windows(rows: Rows, msc: int, cuda: tuple[int, int], ok: bool) -> None:
    check = check_msvc(msc=msc, cuda=cuda, windows=rows, msvc=load_msvc())
    assert check.ok is ok
    assert (check.problem is None) is ok
    assert bool(check.fixes) is (not ok)


def test_vs17_10_with_cuda12_3_gets_the_three_fixes(rows: Rows) -> None:
    check = check_msvc(msc=1940, cuda=(12, 3), windows=rows, msvc=load_msvc(),
                       installed_toolsets=("14.40.33807", "14.39.33519"), torch_cuda=(12, 1))
    assert check.problem is not None
    assert "unsupported Microsoft Visual Studio version" in check.problem
    kinds = [f.kind for f in check.fixes]
    assert kinds == [FixKind.NEWER_CUDA, FixKind.OLDER_TOOLSET, FixKind.ALLOW_UNSUPPORTED]
    newer, older, allow = check.fixes
    assert newer.cuda_min == "12.4"
    assert older.vcvars_ver == "14.39"
    assert older.installed
    assert "-vcvars_ver=14.39" in older.text
    assert allow.nvcc_flags == ("-allow-unsupported-compiler",)
    assert allow.at_users_risk


def test_vs17_14_with_cuda12_3_also_needs_the_stl_override(rows: Rows) -> None:
    check = check_msvc(msc=1944, cuda=(12, 3), windows=rows, msvc=load_msvc())
    allow = next(f for f in check.fixes if f.kind is FixKind.ALLOW_UNSUPPORTED)
    assert allow.nvcc_flags == ("-allow-unsupported-compiler", "-D_ALLOW_COMPILER_AND_STL_VERSION_MISMATCH")
    older = next(f for f in check.fixes if f.kind is FixKind.OLDER_TOOLSET)
    assert older.vcvars_ver == "14.39"
    assert not older.installed
    assert "Visual Studio Installer" in older.text


def test_vs2026_with_cuda13_0_points_at_13_2_and_14_44(rows: Rows) -> None:
    check = check_msvc(msc=1950, cuda=(13, 0), windows=rows, msvc=load_msvc(),
                       installed_toolsets=("14.50.35717", "14.44.35207"), torch_cuda=(13, 0))
    newer = next(f for f in check.fixes if f.kind is FixKind.NEWER_CUDA)
    older = next(f for f in check.fixes if f.kind is FixKind.OLDER_TOOLSET)
    assert newer.cuda_min == "13.2"
    assert older.vcvars_ver == "14.44"
    assert older.installed


def test_vs2017_with_cuda13_needs_a_newer_toolset(rows: Rows) -> None:
    check = check_msvc(msc=1916, cuda=(13, 0), windows=rows, msvc=load_msvc())
    assert [f.kind for f in check.fixes] == [FixKind.NEWER_TOOLSET]


def test_cuda_without_data_is_unchecked_not_refused(rows: Rows) -> None:
    check = check_msvc(msc=1944, cuda=(10, 2), windows=rows, msvc=load_msvc())
    assert check.ok is None
    assert check.fixes == ()


# -- the environment picks the fix it can apply by itself ----------------------------------------------------
def _env(snap: SystemSnapshot, rows: Rows, **kw: Any) -> WindowsBuildEnv:
    root = kw.pop("build_root", None)
    toolchain = choose_windows_toolchain(snap, windows=rows, msvc=load_msvc(), **kw)
    return windows_build_env(snap, key8="0123abcd", toolchain=toolchain, msvc=load_msvc(), build_root=root)


def test_an_installed_newer_cuda_is_preferred(snap: SystemSnapshot, rows: Rows) -> None:
    s = _with(snap, toolkits=(_toolkit("12.3"), _toolkit("12.8", "glob")))
    env = _env(s, rows)
    assert env.toolkit.version == "12.8"
    assert env.vcvars_ver is None
    assert any("using the installed CUDA 12.8" in n for n in env.notes)


def test_an_installed_older_toolset_in_another_instance_is_selected(snap: SystemSnapshot,
                                                                     rows: Rows) -> None:
    s = _with(snap, toolkits=(_toolkit("12.3"),))
    env = _env(s, rows)
    assert env.toolkit.version == "12.3"
    assert env.vcvars_ver == "14.39"
    assert env.visual_studio.display_name == "Visual Studio Build Tools 2022"
    assert env.vcvars_command.endswith('vcvars64.bat" -vcvars_ver=14.39 && set"')


def test_no_installed_fix_refuses_with_every_fix(snap: SystemSnapshot, rows: Rows) -> None:
    s = _with(snap, toolkits=(_toolkit("12.3"),), toolsets=(("14.44.35207",), ()))
    with pytest.raises(BuildError) as err:
        _env(s, rows)
    assert err.value.message == "nvcc 12.3 will refuse the Visual Studio compiler"
    assert "C1189: #error: -- unsupported Microsoft Visual Studio version" in (err.value.cause or "")
    hint = err.value.hint or ""
    assert "CUDA 12.4 or newer" in hint
    assert "-vcvars_ver=14.39" in hint
    assert "-allow-unsupported-compiler" in hint


def test_allow_unsupported_compiler_is_opt_in(snap: SystemSnapshot, rows: Rows) -> None:
    s = _with(snap, toolkits=(_toolkit("12.3"),), toolsets=(("14.44.35207",), ()))
    env = _env(s, rows, allow_unsupported_compiler=True)
    flags = env.env["NVCC_APPEND_FLAGS"].split()
    assert "-allow-unsupported-compiler" in flags
    assert "-D_ALLOW_COMPILER_AND_STL_VERSION_MISMATCH" in flags


Conformance = tuple[str, str, tuple[str, ...], tuple[str, ...]]  # nvcc, torch, flags present, flags absent
CONFORMANCE = [
    pytest.param(("12.8", "2.8.0+cu128", (), ("/Zc:preprocessor", "/permissive-")), id="12.8"),
    pytest.param(("13.2", "2.11.0+cu130", ("/Zc:preprocessor",), ("/permissive-",)), id="13.2"),
    pytest.param(("13.2", "2.13.0+cu130", ("/Zc:preprocessor", "/permissive-"), ()), id="13.2-torch2.13"),
]


@pytest.mark.parametrize("case", CONFORMANCE)
def test_conformance_flags_follow_cuda_and_torch(snap: SystemSnapshot, rows: Rows, case: Conformance) -> None:
    cuda, torch, present, absent = case
    assert snap.torch is not None
    t = dataclasses.replace(snap.torch, version=torch, cuda_version=cuda if cuda != "13.2" else "13.0")
    s = _with(snap, toolkits=(_toolkit(cuda),), torch=t)
    flags = _env(s, rows).env["NVCC_APPEND_FLAGS"].split()
    assert flags[:2] == ["-Xcompiler=/Zc:__cplusplus", "-DUSE_CUDA=1"]
    assert all(f"-Xcompiler={f}" in flags for f in present)
    assert not any(f"-Xcompiler={f}" in flags for f in absent)


def test_user_nvcc_append_flags_are_kept_first(snap: SystemSnapshot, rows: Rows) -> None:
    s = _with(snap, env={**snap.env, "NVCC_APPEND_FLAGS": "--threads 4"})
    assert _env(s, rows).env["NVCC_APPEND_FLAGS"].startswith("--threads 4 -Xcompiler=")


def test_embedded_python_is_refused_with_the_copy_hint(snap: SystemSnapshot, rows: Rows) -> None:
    portable = r"C:\ComfyUI_windows_portable\python_embeded"
    dev = PythonDevFiles(include_dir=rf"{portable}\Include", has_python_h=False, libs_dir=rf"{portable}\libs",
                         import_lib="python312.lib", has_import_lib=False, embedded=True)
    with pytest.raises(BuildError) as err:
        _env(_with(snap, python_dev=dev), rows)
    assert "embedded" in err.value.message
    assert "python312.lib" in (err.value.cause or "")
    assert "'include' and 'libs'" in (err.value.hint or "")


def test_no_visual_studio_is_refused(snap: SystemSnapshot, rows: Rows) -> None:
    with pytest.raises(BuildError, match="no Visual Studio"):
        _env(_with(snap, visual_studio=()), rows)


def test_cpu_torch_does_not_crash_the_choice(snap: SystemSnapshot, rows: Rows) -> None:
    cpu = TorchInfo(version="2.8.0+cpu", cuda_version=None, hip_version=None, cxx11_abi=False, arch_list=(),
                    cudnn_version=None, sdpa_flash_available=None, cuda_available=False, triton_version=None)
    assert _env(_with(snap, torch=cpu), rows).toolkit.version == "12.8"


# -- vcvars64 and `set` ------------------------------------------------------------------------------------
def test_set_output_parses_and_passes_the_sanity_checks() -> None:
    env = parse_set_output(win("vcvars64_vcvars_ver_14.39_set.txt"))
    assert env["VCToolsVersion"] == "14.39.33519"
    assert env["VSCMD_ARG_TGT_ARCH"] == "x64"
    assert env["ProgramFiles(x86)"] == r"C:\Program Files (x86)"
    assert not any(k.startswith(("*", "[")) for k in env)
    assert all("\r" not in v for v in env.values())
    assert vc_env_problems(env) == []


@pytest.mark.parametrize(("drop", "problem"), [
    pytest.param("VCToolsVersion", "VCToolsVersion is unset", id="no-toolset"),
    pytest.param("INCLUDE", "INCLUDE is empty", id="no-include"),
    pytest.param("Path", "Hostx64", id="no-cl-on-path"),
    pytest.param("VSCMD_ARG_TGT_ARCH", "expected x64", id="no-target"),
])
def test_vc_env_problems(drop: str, problem: str) -> None:
    env = parse_set_output(win("vcvars64_vcvars_ver_14.39_set.txt"))
    del env[drop]
    assert any(problem in p for p in vc_env_problems(env))


def test_a_missing_toolset_is_a_build_error_with_vcvars_words() -> None:
    with pytest.raises(BuildError) as err:
        parse_set_output(win("vcvars64_missing_toolset_14.39.txt"))
    assert "Toolset directory for version '14.39' was not found" in (err.value.cause or "")


def test_capture_runs_a_batch_file_and_reads_after_the_marker(snap: SystemSnapshot, tmp_path: Path) -> None:
    vs = snap.visual_studio[0]
    text = win("vcvars64_vcvars_ver_14.39_set.txt")
    banner, rest = text.split("'x64'\r\n", 1)
    script = tmp_path / "vcvars_capture.cmd"
    runner = FakeRunner().add(("cmd", "/d", "/c", str(script)),
                              banner + "'x64'\r\n===attnforge-vcvars-set===\r\n" + rest)
    env = capture_vcvars(runner, vs, tmp_path, "14.39")
    assert env["VCToolsVersion"] == "14.39.33519"
    body = script.read_bytes().decode()
    assert '\\VC\\Auxiliary\\Build\\vcvars64.bat" -vcvars_ver=14.39\r\n' in body
    assert body.endswith("set\r\n")


def test_capture_failure_names_the_command_to_try(snap: SystemSnapshot, tmp_path: Path) -> None:
    vs = snap.visual_studio[0]
    runner = FakeRunner().add(("cmd", "/d", "/c", str(tmp_path / "vcvars_capture.cmd")),
                              "The system cannot find the path specified.\r\n", returncode=1)
    with pytest.raises(BuildError) as err:
        capture_vcvars(runner, vs, tmp_path)
    assert vcvars_command_line(vs) in (err.value.hint or "")


def test_merge_env_is_case_insensitive_and_later_wins() -> None:
    merged = merge_env({"Path": "a", "TMP": "x"}, {"PATH": "b"}, {"tmp": "y"})
    assert merged == {"Path": "b", "TMP": "y"}


# -- one decision: the plan's choice is what the build executes -----------------------------------------------
@pytest.mark.parametrize("case", [
    pytest.param(((("12.3", "CUDA_PATH"), ("12.8", "glob")), (("14.44.35207",), ("14.39.33519",))),
                 id="newer-cuda-installed"),
    pytest.param(((("12.3", "CUDA_PATH"),), (("14.44.35207",), ("14.39.33519",))), id="older-toolset"),
])
def test_the_build_executes_the_toolkit_and_toolset_the_plan_chose(
        snap: SystemSnapshot, case: tuple[tuple[tuple[str, str], ...], tuple[tuple[str, ...], ...]]) -> None:
    toolkits, toolsets = case
    s = _with(snap, toolkits=tuple(_toolkit(v, via) for v, via in toolkits), toolsets=toolsets)
    s = dataclasses.replace(s, torch=dataclasses.replace(s.torch, cuda_version="12.4") if s.torch else None)
    catalog = load_catalog()
    decision = plan_build(s, catalog, Request(backend="flash-attn", archs=((8, 0),)))
    assert decision.spec is not None, [c.text() for c in decision.preflight.checks if not c.ok]
    spec = decision.spec
    assert spec.toolkit is not None
    assert catalog.toolchain is not None
    toolchain = choose_windows_toolchain(s, windows=catalog.toolchain.host_compilers, msvc=load_msvc(),
                                         msvc_toolset=spec.msvc_toolset, toolkit=spec.toolkit)
    env = windows_build_env(s, key8=spec.build_root.rsplit("\\", 1)[-1], toolchain=toolchain, msvc=load_msvc(),
                            build_root=spec.build_root)
    assert env.toolkit.path == spec.toolkit.path  # the build never switches to a toolkit the plan did not pick
    assert env.vcvars_ver == spec.msvc_toolset
    assert env.env["CUDA_HOME"] == spec.env["CUDA_HOME"]


def test_the_short_build_root_comes_from_msvc_toml() -> None:
    from attnforge.resolve.windows import short_build_root

    rule = load_msvc().build_root
    assert (rule.short_dir, rule.max_chars) == ("afb", 40)
    assert short_build_root(r"C:\a", "0123abcd") == (r"C:\a\b\0123abcd", None)
    root, why = short_build_root(r"D:\Users\someone-with-a-long-name\AppData\Local\attnforge", "0123abcd")
    assert root == r"D:\afb\0123abcd" and why is not None
