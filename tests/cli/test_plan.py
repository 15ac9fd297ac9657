"""``attnforge plan`` through ``main([...])`` and once as a subprocess."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from attnforge.cli import main

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
H200 = str(FIXTURES / "snapshots" / "h200_torch2.11_cu130.json")
CPU = str(FIXTURES / "snapshots" / "cpu_dev_torch2.13_cpu.json")
WINDOWS = str(FIXTURES / "snapshots" / "windows_vs17.10_cuda12.3_torch2.5_cu124.json")


def test_h200_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", "flash-attn", "--snapshot", H200, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert doc["kind"] == "plan"
    assert doc["viable"] is True
    build = doc["chosen"]["build"]
    assert build["env"]["FLASH_ATTN_CUDA_ARCHS"] == "90"
    assert build["env"]["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE"
    jobs, threads = int(build["env"]["MAX_JOBS"]), int(build["env"]["NVCC_THREADS"])
    assert jobs * threads <= 16
    assert build["archs"] == [[9, 0]]


def test_cpu_machine_is_not_viable(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", "flash-attn", "--snapshot", CPU])
    out = capsys.readouterr().out
    assert rc == 1
    assert "CPU-only build" in out
    assert "nothing is viable" in out


def test_windows_text_names_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", "flash-attn", "--snapshot", WINDOWS])
    out = capsys.readouterr().out
    assert rc == 1
    assert "-vcvars_ver=14.39" in out


def test_find_links_and_arch(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "plan",
            "flash-attn==2.8.3",
            "--snapshot",
            H200,
            "--find-links",
            str(FIXTURES / "wheels" / "h200_flash_attn"),
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert doc["chosen"]["kind"] == "wheel"
    assert doc["chosen"]["wheel"]["filename"].startswith("flash_attn-2.8.3+cu13torch2.11cxx11abiTRUE-cp312")
    rc = main(["plan", "flash-attn", "--snapshot", H200, "--arch", "9.0,12.0", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["chosen"]["build"]["env"]["FLASH_ATTN_CUDA_ARCHS"] == "90;120"


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        pytest.param(["plan", "flash-atn", "--snapshot", H200], "known backends", id="unknown-backend"),
        pytest.param(
            ["plan", "flash-attn", "--snapshot", "/nonexistent/snap.json"],
            "attnforge probe --json",
            id="missing-snapshot",
        ),
        pytest.param(
            ["plan", "flash-attn", "--snapshot", H200, "--arch", "hopper"], "--arch 9.0", id="bad-arch"
        ),
        pytest.param(["plan", "flash-attn[x]", "--snapshot", H200], "BACKEND==VERSION", id="extras"),
        pytest.param(
            ["plan", "flash-attn", "--snapshot", H200, "--find-links", "/nonexistent/dir"],
            "directory",
            id="missing-find-links",
        ),
    ],
)
def test_bad_input_exits_2_with_hint(capsys: pytest.CaptureFixture[str], argv: list[str], hint: str) -> None:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert "error:" in err
    assert hint in err
    assert "Traceback" not in err


def test_subprocess(cli_env: dict[str, str], attnforge_argv: list[str]) -> None:
    proc = subprocess.run(
        [*attnforge_argv, "plan", "flash-attn", "--snapshot", H200, "--json"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["chosen"]["build"]["env"]["FLASH_ATTN_CUDA_ARCHS"] == "90"
