"""The candle kernel cache: keys, Cargo.lock, the environment, restore/store through the real artifact store,
and the Windows lib.exe step (replayed through the FakeRunner)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnforge.cache import ArtifactKind, Store
from attnforge.cache.share import export, import_
from attnforge.cargo.candle import (
    BUILD_DIR_VAR,
    COMPUTE_CAP_VAR,
    LIBRARY,
    CargoEnv,
    KernelKey,
    archive_objects_windows,
    cache_inputs,
    find_cargo_lock,
    plan_cargo_env,
    read_cargo_lock,
    restore,
    store_library,
)
from attnforge.errors import BuildError, UsageError
from attnforge.probe.snapshot import SystemSnapshot
from tests._fakes import FIXTURES, FakeRunner

H200 = FIXTURES / "snapshots" / "h200_torch2.11_cu130.json"
WINDOWS = FIXTURES / "snapshots" / "windows_rtx5090_torch2.8_cu128.json"
CPU = FIXTURES / "snapshots" / "cpu_dev_torch2.13_cpu.json"


@given(
    version=st.from_regex(r"[0-9]{1,2}\.[0-9]{1,2}\.[0-9]{1,2}(-alpha\.[0-9])?", fullmatch=True),
    cuda=st.sampled_from(["11.8", "12.8", "13.0"]),
    cc=st.tuples(st.integers(7, 12), st.integers(0, 9)),
    cxx=st.sampled_from(["gcc-12.2.0", "g++-13.3.0", "cl-19.44.35207", "msvc-14.39.33519", "clang-18.1.8"]),
    os=st.sampled_from(["linux", "windows"]),
)
def test_kernel_key_round_trips(version: str, cuda: str, cc: tuple[int, int], cxx: str, os: str) -> None:
    key = KernelKey(crate="candle-flash-attn", version=version, cuda_version=cuda,
                    compute_capability=cc, host_compiler=cxx, os=os)
    assert KernelKey.parse(str(key)) == key
    assert len(key.digest) == 16


@pytest.mark.parametrize("field", ["version", "cuda_version", "compute_capability", "host_compiler", "os"])
def test_every_field_changes_the_directory(field: str) -> None:
    key = KernelKey(crate="candle-flash-attn", version="0.9.1", cuda_version="12.8",
                    compute_capability=(9, 0), host_compiler="gcc-12.2.0", os="linux")
    other = {"version": "0.9.2", "cuda_version": "13.0", "compute_capability": (12, 0),
             "host_compiler": "gcc-13.3.0", "os": "windows"}[field]
    assert dataclasses.replace(key, **{field: other}).digest != key.digest


@pytest.mark.parametrize("bad", ["", "candle-flash-attn==0.9.1", "candle-flash-attn==0.9.1;cuda=12;cc=9.0;"
                                 "cxx=gcc-12;os=linux"])
def test_kernel_key_parse_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="not a kernel key"):
        KernelKey.parse(bad)


def test_cargo_lock_gives_version_and_checksum(tmp_path: Path) -> None:
    locked = read_cargo_lock(FIXTURES / "cargo" / "Cargo.lock")
    assert locked.version == "0.9.1"
    assert locked.checksum is not None
    assert len(locked.checksum) == 64
    nested = tmp_path / "ws" / "crates" / "app"
    nested.mkdir(parents=True)
    (tmp_path / "ws" / "Cargo.lock").write_text((FIXTURES / "cargo" / "Cargo.lock").read_text())
    assert find_cargo_lock(nested) == tmp_path / "ws" / "Cargo.lock"


@pytest.mark.parametrize(("text", "message"), [
    pytest.param('version = 4\n[[package]]\nname = "candle-core"\nversion = "0.9.1"\n', "is not in",
                 id="absent"),
    pytest.param('[[package]]\nname = "candle-flash-attn"\nversion = "0.8.0"\n'
                 '[[package]]\nname = "candle-flash-attn"\nversion = "0.9.1"\n', "more than once",
                 id="twice"),
    pytest.param("[[package]\n", "not valid TOML", id="garbage"),
])
def test_cargo_lock_problems_are_usage_errors(tmp_path: Path, text: str, message: str) -> None:
    lock = tmp_path / "Cargo.lock"
    lock.write_text(text)
    with pytest.raises(UsageError, match=message):
        read_cargo_lock(lock)


def test_plan_from_the_h200_snapshot(tmp_path: Path) -> None:
    plan = plan_cargo_env(SystemSnapshot.load(H200), home=tmp_path, crate_version="0.9.1")
    assert plan.key.compute_capability == (9, 0)
    assert plan.key.cuda_version == "13.0"
    assert plan.key.host_compiler == "g++-13.3.0"
    assert plan.env == {BUILD_DIR_VAR: str(plan.build_dir), COMPUTE_CAP_VAR: "90"}
    assert plan.build_dir == tmp_path / "cargo" / "candle-flash-attn" / plan.key.digest
    assert plan.library.name == LIBRARY


def test_plan_on_windows_uses_msvc_and_the_rtx5090(tmp_path: Path) -> None:
    plan = plan_cargo_env(SystemSnapshot.load(WINDOWS), home=tmp_path, crate_version="0.9.1")
    assert plan.env[COMPUTE_CAP_VAR] == "120"
    assert plan.key.host_compiler == "msvc-14.44.35207"
    assert plan.key.os == "windows"
    assert cache_inputs(plan, "AMD64").platform_tag == "win_amd64"


@pytest.mark.parametrize(("kw", "environ", "cap"), [
    pytest.param({"compute_capability": (8, 6)}, {COMPUTE_CAP_VAR: "90"}, "86", id="argument-wins"),
    pytest.param({}, {COMPUTE_CAP_VAR: "89"}, "89", id="environment"),
])
def test_compute_capability_order(tmp_path: Path, kw: dict[str, object], environ: dict[str, str],
                                  cap: str) -> None:
    plan = plan_cargo_env(SystemSnapshot.load(H200), home=tmp_path, crate_version="0.9.1", environ=environ,
                          **kw)  # type: ignore[arg-type]
    assert plan.env[COMPUTE_CAP_VAR] == cap


def test_no_gpu_and_no_compute_cap_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no GPU") as err:
        plan_cargo_env(SystemSnapshot.load(CPU), home=tmp_path, crate_version="0.9.1")
    assert "--compute-cap" in (err.value.hint or "")


def test_bad_compute_cap_variable_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=COMPUTE_CAP_VAR):
        plan_cargo_env(SystemSnapshot.load(CPU), home=tmp_path, crate_version="0.9.1",
                       environ={COMPUTE_CAP_VAR: "ninety"})


# -- restore / store through the real artifact store ------------------------------------------------------
def _plan(tmp_path: Path, home: str = "home") -> CargoEnv:
    return plan_cargo_env(SystemSnapshot.load(H200), home=tmp_path / home, crate_version="0.9.1",
                          checksum="ab" * 32)


def test_store_then_restore_into_an_empty_build_dir(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    plan = _plan(tmp_path)
    assert restore(plan, store, "x86_64") is False
    assert plan.build_dir.is_dir()
    plan.library.write_bytes(b"!<arch>\nfake archive")
    put = store_library(plan, store, "x86_64")
    assert put.stored
    assert put.entry.kind is ArtifactKind.STATIC_LIB
    assert put.entry.inputs.archs == ((9, 0),)
    assert put.entry.provenance["kernel_key"] == str(plan.key)
    assert store_library(plan, store, "x86_64").stored is False

    other = _plan(tmp_path, "second-home")  # same key, another machine's empty build dir
    assert restore(other, store, "x86_64") is True
    assert other.library.read_bytes() == b"!<arch>\nfake archive"


def test_export_and_import_carry_the_library(tmp_path: Path) -> None:
    first = Store(tmp_path / "a")
    plan = _plan(tmp_path)
    restore(plan, first, "x86_64")
    plan.library.write_bytes(b"!<arch>\nkernels")
    store_library(plan, first, "x86_64")
    export(first, tmp_path / "export")
    second = Store(tmp_path / "b")
    import_(second, tmp_path / "export")
    fresh = _plan(tmp_path, "third-home")
    assert restore(fresh, second, "x86_64") is True
    assert fresh.library.read_bytes() == b"!<arch>\nkernels"


def test_storing_without_a_library_says_so(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    plan.build_dir.mkdir(parents=True)
    with pytest.raises(BuildError, match=r"left no libflashattention\.a"):
        store_library(plan, Store(tmp_path / "store"), "x86_64")


# -- Windows: lib.exe /OUT:libflashattention.a *.o --------------------------------------------------------
def _windows_plan(tmp_path: Path) -> CargoEnv:
    plan = plan_cargo_env(SystemSnapshot.load(WINDOWS), home=tmp_path, crate_version="0.9.1")
    plan.build_dir.mkdir(parents=True)
    for name in ("flash_api.o", "flash_fwd_hdim128_bf16_sm80.o"):
        (plan.build_dir / name).write_bytes(b"obj")
    return plan


class LibExe(FakeRunner):
    """Records the call and writes the archive, as lib.exe would."""

    def run(self, argv, *, cwd=None, env=None, timeout_s=None):  # type: ignore[no-untyped-def]
        res = super().run(argv, cwd=cwd, env=env, timeout_s=timeout_s)
        if res.ok and cwd is not None:
            (Path(cwd) / LIBRARY).write_bytes(b"!<arch>\n")
        return res


def test_windows_archives_the_objects_with_lib_exe(tmp_path: Path) -> None:
    plan = _windows_plan(tmp_path)
    runner = LibExe()
    runner.add(("lib", "/NOLOGO", f"/OUT:{LIBRARY}", "flash_api.o", "flash_fwd_hdim128_bf16_sm80.o"))
    assert archive_objects_windows(plan, runner) is True
    argv = ("lib", "/NOLOGO", f"/OUT:{LIBRARY}", "flash_api.o", "flash_fwd_hdim128_bf16_sm80.o")
    assert runner.calls == [argv]
    assert plan.library.is_file()
    assert archive_objects_windows(plan, runner) is False  # the library exists now: nothing to do
    assert len(runner.calls) == 1


def test_windows_lib_exe_missing_is_a_build_error_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match=r"lib\.exe") as err:
        archive_objects_windows(_windows_plan(tmp_path), FakeRunner())
    assert "vcvars64" in (err.value.hint or "")


def test_linux_never_runs_lib_exe(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    plan.build_dir.mkdir(parents=True)
    (plan.build_dir / "kernel.o").write_bytes(b"obj")
    runner = FakeRunner()
    assert archive_objects_windows(plan, runner) is False
    assert runner.calls == []
