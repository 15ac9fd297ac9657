"""``attnforge build`` and ``attnforge diagnose`` from the command line (the build replays real logs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnforge.cli import main
from attnforge.cli.build import run_build
from attnforge.provision.build import with_options
from attnforge.resolve.types import SourceKind, SourceSpec
from tests._fakes import FIXTURES
from tests.build._helpers import FA_LOG, OOM_LOG, ReplayLauncher, copy_fixture, fixture_spec

CPU_SNAPSHOT = FIXTURES / "snapshots" / "cpu_dev_torch2.13_cpu.json"


def test_jobs_option_caps_parallelism_to_n_processes(tmp_path: Path) -> None:
    spec = with_options(
        fixture_spec(tmp_path, tmp_path, env={"MAX_JOBS": "8", "NVCC_THREADS": "4"}),
        jobs=1,
        use_sccache=True,
        name=None,
    )
    assert (spec.max_jobs, spec.nvcc_threads) == (1, 1)
    assert (spec.env["MAX_JOBS"], spec.env["NVCC_THREADS"]) == ("1", "1")
    assert spec.use_sccache


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        pytest.param(["build"], 2, "name a backend or give --source", id="nothing-to-build"),
        pytest.param(
            ["build", "--source", ".", "--arch", "ninety", "--snapshot", str(CPU_SNAPSHOT)],
            2,
            "not a compute capability",
            id="bad-arch",
        ),
        pytest.param(
            [
                "build",
                "--source",
                str(FIXTURES / "cuda_ext_pkg"),  # ext_pkg is C++-only: it builds on a CPU torch
                "--arch",
                "9.0",
                "--snapshot",
                str(CPU_SNAPSHOT),
            ],
            1,
            "CPU-only build",
            id="preflight-cpu-torch",
        ),
    ],
)
def test_build_refusals(
    argv: list[str], code: int, message: str, capsys: pytest.CaptureFixture[str], attnforge_home: Path
) -> None:
    assert main(argv) == code
    assert message in capsys.readouterr().err


def test_plain_progress_and_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = fixture_spec(copy_fixture(tmp_path / "src"), tmp_path / "b")
    code = run_build(
        spec,
        home=tmp_path / "home",
        snapshot=None,
        keep_build_dir=False,
        quiet=False,
        as_json=False,
        launcher=ReplayLauncher(FA_LOG),
    )
    out, err = capsys.readouterr()
    assert code == 0
    assert "attnforge: fetch:" in err
    assert "attnforge: build:" in err
    assert "[73/73] 100%" in err
    assert "flash_api.cpp" in err
    assert "built af_ext_fixture-0.1.0" in out
    assert "73 compile steps" in out
    assert "pip install --no-deps" in out


def test_failed_build_prints_cause_evidence_fix_and_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = fixture_spec(copy_fixture(tmp_path / "src"), tmp_path / "b")
    code = run_build(
        spec,
        home=tmp_path / "home",
        snapshot=None,
        keep_build_dir=False,
        quiet=True,
        as_json=False,
        launcher=ReplayLauncher(OOM_LOG, returncode=1),
    )
    err = capsys.readouterr().err
    assert code == 1
    assert "cause: the compiler ran out of memory" in err
    assert "virtual memory exhausted" in err
    assert "--jobs 1" in err
    assert "log: " in err
    assert str(tmp_path / "home" / "logs") in err


def test_failed_build_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = fixture_spec(copy_fixture(tmp_path / "src"), tmp_path / "b")
    code = run_build(
        spec,
        home=tmp_path / "home",
        snapshot=None,
        keep_build_dir=False,
        quiet=True,
        as_json=True,
        launcher=ReplayLauncher(OOM_LOG, returncode=1),
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    assert (doc["schema_version"], doc["kind"], doc["ok"]) == (1, "build", False)
    assert doc["diagnosis"]["signature"] == "out-of-memory"


def test_diagnose_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", str(OOM_LOG), "--name", "af_ext_fixture"]) == 0
    out = capsys.readouterr().out
    assert "out of memory" in out
    assert f"{OOM_LOG}:30" in out
    assert "attnforge build af_ext_fixture --jobs 1" in out


def test_diagnose_json_with_a_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "x.log"
    log.write_text(
        "OSError: CUDA_HOME environment variable is not set. Please set it to your CUDA install root.\n",
        encoding="utf-8",
    )
    assert main(["diagnose", str(log), "--snapshot", str(CPU_SNAPSHOT), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "diagnosis"
    assert doc["signature"] == "cuda-home-cpu-torch"
    assert doc["evidence"][0]["line"] == 1


@pytest.mark.slow
def test_diagnose_unknown_success_and_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    odd = tmp_path / "odd.log"
    odd.write_text("step 1\nfatal: the flux capacitor is cold\n", encoding="utf-8")
    assert main(["diagnose", str(odd)]) == 1
    out = capsys.readouterr().out
    assert "unrecognised" in out
    assert f"{odd}:2" in out
    assert main(["diagnose", str(FA_LOG)]) == 0
    assert "no failure" in capsys.readouterr().out
    assert main(["diagnose", str(tmp_path / "nope.log")]) == 2


# -- --allow-unsupported-compiler on Linux ----------------------------------------------------------------------
H200 = FIXTURES / "snapshots" / "h200_torch2.11_cu130.json"


def _h200_with_gcc(tmp_path: Path, version: str, python: str) -> Path:
    """The real H200 snapshot with another gcc (nvcc 13.0 accepts gcc 6-15) and build interpreter."""
    doc = json.loads(H200.read_text(encoding="utf-8"))
    for compiler in doc["compilers"]:
        compiler["banner"] = compiler["banner"].replace(compiler["version"], version)
        compiler["version"] = version
    doc["platform"]["python_executable"] = python
    path = tmp_path / f"h200_gcc{version}.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_gcc_outside_nvccs_range_is_refused_and_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], attnforge_home: Path
) -> None:
    snap = _h200_with_gcc(tmp_path, "16.1.0", "/nonexistent/python3")
    assert main(["build", "flash-attn", "--snapshot", str(snap)]) == 1
    err = capsys.readouterr().err
    assert "unsupported GNU version" in err
    assert "--allow-unsupported-compiler" in err


def test_allow_unsupported_compiler_builds_past_the_preflight_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], attnforge_home: Path
) -> None:
    # the snapshot's interpreter does not exist here, so the build stops right after the preflight passed
    snap = _h200_with_gcc(tmp_path, "16.1.0", "/nonexistent/python3")
    assert main(["build", "flash-attn", "--allow-unsupported-compiler", "--snapshot", str(snap)]) == 1
    err = capsys.readouterr().err
    assert "warning: building with nvcc -allow-unsupported-compiler, at your own risk" in err
    assert "g++ 16.1.0 is outside what nvcc 13.0 accepts" in err
    assert "/nonexistent/python3 does not exist" in err
    assert "unsupported GNU version'; fix" not in err


@pytest.mark.parametrize(("gcc", "user_flags", "expected"), [
    pytest.param("16.1.0", None, "-allow-unsupported-compiler", id="gcc16-added"),
    pytest.param("16.1.0", "--threads 2", "--threads 2 -allow-unsupported-compiler", id="gcc16-after-user"),
    pytest.param("13.3.0", None, None, id="gcc13-inside-not-added"),
])
def test_allow_unsupported_compiler_reaches_the_build_only_when_gcc_is_outside(
    tmp_path: Path, gcc: str, user_flags: str | None, expected: str | None
) -> None:
    import dataclasses
    import sys

    from attnforge.build import execute
    from attnforge.catalog import load_catalog
    from attnforge.cli.build import unsupported_compiler_warning
    from attnforge.probe.snapshot import SystemSnapshot
    from attnforge.resolve import build_spec
    from attnforge.resolve.types import Request

    snap = SystemSnapshot.load(_h200_with_gcc(tmp_path, gcc, sys.executable))
    if user_flags:
        snap = dataclasses.replace(snap, env={**snap.env, "NVCC_APPEND_FLAGS": user_flags})
    spec = build_spec(snap, load_catalog(), Request(backend="flash-attn", allow_unsupported_compiler=True),
                      home=str(tmp_path / "home"))
    spec = dataclasses.replace(spec, source=SourceSpec(kind=SourceKind.PATH,
                                                       location=str(copy_fixture(tmp_path / "src"))))
    launcher = ReplayLauncher(FA_LOG)
    execute(spec, home=tmp_path / "home", launcher=launcher, environ={"PATH": "/usr/bin:/bin"})
    assert launcher.env.get("NVCC_APPEND_FLAGS") == expected
    warning = unsupported_compiler_warning(spec) or ""
    assert ("at your own risk" in warning) and (("outside what nvcc" in warning) is (expected is not None))
