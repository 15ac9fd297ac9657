"""`attnforge doctor` and `attnforge probe` through main() and as a real subprocess."""

from __future__ import annotations

import json
import subprocess
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

from attnforge.cli import main
from tests._fakes import FIXTURES

H200 = FIXTURES / "snapshots" / "h200_torch2.11_cu130.json"
CPU = FIXTURES / "snapshots" / "cpu_dev_torch2.13_cpu.json"
SCHEMA = json.loads(resources.files("attnforge").joinpath("schemas/doctor.schema.json").read_text())


@pytest.mark.usefixtures("attnforge_home")
@pytest.mark.parametrize(("snapshot", "code"), [pytest.param(H200, 0, id="h200"), pytest.param(CPU, 1, id="cpu")])
def test_doctor_json_validates_against_its_schema(capsys: pytest.CaptureFixture[str], snapshot: Path,
                                                   code: int) -> None:
    assert main(["doctor", "--json", "--snapshot", str(snapshot)]) == code
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    assert {r["backend"] for r in doc["report"]["rows"]} >= {"flash-attn", "flash-attn-4", "xformers", "sdpa-cudnn"}


def test_schema_rejects_a_wrong_document() -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"schema_version": 1, "kind": "doctor"}, SCHEMA)


@pytest.mark.usefixtures("attnforge_home")
def test_doctor_table_for_h200(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--snapshot", str(H200)]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H200, compute capability 9.0" in out
    assert "attnforge install flash-attn" in out
    assert "fastest now:" in out and "to go faster:" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(None, "cannot read snapshot", id="missing"),
        pytest.param("{not json", "not valid JSON", id="not-json"),
        pytest.param('{"schema_version": 1, "created_at": "x"}', "does not fit the schema", id="incomplete"),
    ],
)
def test_bad_snapshot_is_exit_2_with_a_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            content: str | None, message: str) -> None:
    path = tmp_path / "snap.json"
    if content is not None:
        path.write_text(content)
    assert main(["doctor", "--snapshot", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert "hint: " in err and "Traceback" not in err


def test_unknown_verb_and_bad_option_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == 2
    assert main(["doctor", "--no-such-option"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from attnforge import __version__

    assert main(["--version"]) == 0
    assert __version__ in capsys.readouterr().out


@pytest.mark.integration
@pytest.mark.slow
def test_real_probe_and_doctor_on_this_machine(attnforge_argv: list[str], cli_env: dict[str, str]) -> None:
    """The first README command's facts on the dev/CI machine: no GPU, CPU torch, nvcc 13.0, gcc 12."""
    probe = subprocess.run([*attnforge_argv, "probe", "--json"], env=cli_env, capture_output=True, text=True,
                           timeout=120, check=True)
    snap = json.loads(probe.stdout)
    assert snap["gpus"] == []
    if snap["torch"] is not None:  # CI installs torch 2.13.0+cpu before the tests
        assert snap["torch"]["cuda_version"] is None
    assert any(t["version"] == "13.0" for t in snap["cuda_toolkits"])
    assert any(c["kind"] == "gcc" and c["version"].startswith("12.") for c in snap["compilers"])

    doctor = subprocess.run([*attnforge_argv, "doctor"], env=cli_env, capture_output=True, text=True, timeout=120)
    assert doctor.returncode == 1, doctor.stderr  # only the CPU fallback runs here
    out = doctor.stdout
    assert "GPU: none found" in out
    assert "nvcc 13.0" in out and "gcc 12" in out
    if snap["torch"] is not None:
        assert "is a CPU build" in out
    assert "cannot be built here" in out  # why flash-attn cannot be built on this machine
    assert "Traceback" not in doctor.stderr


def test_a_misspelt_backend_gets_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "flash-atn", "--snapshot", str(H200)]) == 2
    err = capsys.readouterr().err
    assert "error: unknown backend 'flash-atn'" in err
    assert "hint: did you mean 'flash-attn'?" in err


def test_doctor_says_where_the_compile_caches_are_and_that_the_users_win(
        attnforge_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/srv/inductor")
    main(["doctor", "--json", "--snapshot", str(H200)])
    settings = {s["variable"]: s for s in json.loads(capsys.readouterr().out)["compile_caches"]["settings"]}
    assert settings["TORCHINDUCTOR_CACHE_DIR"] == {"variable": "TORCHINDUCTOR_CACHE_DIR", "value": "/srv/inductor",
                                                   "source": "user"}
    assert settings["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"]["value"] == str(
        attnforge_home / "compile" / "flash-attn-cute")
    main(["doctor", "--snapshot", str(H200)])
    assert "TORCHINDUCTOR_CACHE_DIR=/srv/inductor (user)" in capsys.readouterr().out
