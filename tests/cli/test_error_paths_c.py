"""Edges of every verb's input and output: a user file that is not UTF-8, an ``--index-url`` that is not one, a
closed stdout (``>&-``) and a pipe whose reader left first (``| head``). Each ends in ``error:`` + ``hint:`` with
its exit code, or in the exit code of a command cut short; never an internal error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge.cli import PIPE_CLOSED_EXIT, main
from tests.conftest import REPO

H100 = str(REPO / "tests" / "fixtures" / "snapshots" / "h100_torch2.8_cu128.json")
CPU_SNAPSHOT = str(REPO / "tests" / "fixtures" / "snapshots" / "cpu_dev_torch2.13_cpu.json")


def _not_utf8(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.write_bytes(b"\xff\xfe{}")
    return str(path)


@pytest.mark.parametrize(("argv", "message"), [
    pytest.param(["bench", "--shapes", "model", "--model", "{config.json}"], "cannot read the model config",
                 id="bench-model"),
    pytest.param(["warmup", "--model", "{config.json}"], "cannot read the model config", id="warmup-model"),
    pytest.param(["cargo-env", "candle-flash-attn", "--print", "--compute-cap", "9.0", "--cargo-lock",
                  "{Cargo.lock}", "--snapshot", H100], "cannot read the lock file", id="cargo-env-lock"),
])
def test_a_user_file_that_is_not_utf8_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    argv = [_not_utf8(tmp_path, a[1:-1]) if a.startswith("{") else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "internal error" not in err
    assert f"error: {message}" in err
    assert "cause: it is not UTF-8 text (byte 0xff at offset 0)" in err
    assert "hint: " in err


def test_extra_wheel_sources_that_are_not_utf8_are_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ATTNFORGE_WHEEL_SOURCES", "on")
    monkeypatch.setenv("ATTNFORGE_EXTRA_WHEEL_SOURCES", _not_utf8(tmp_path, "sources.toml"))
    assert main(["plan", "flash-attn", "--offline", "--snapshot", H100]) == 2
    err = capsys.readouterr().err
    assert "error: sources.toml is not valid TOML" in err
    assert "it is not UTF-8 text" in err and "hint: " in err


@pytest.mark.parametrize("url", ["http://[::1", "https://[bad/simple", "http://"])
def test_an_index_url_that_is_not_one_is_bad_usage(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "flash-attn", "--offline", "--index-url", url, "--snapshot", CPU_SNAPSHOT]) == 2
    err = capsys.readouterr().err
    assert f"error: not an index URL: {url}" in err and "hint: " in err


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_closed_stream_is_no_error_in_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stream: str
) -> None:
    monkeypatch.setattr(sys, stream, None)  # what Python makes of a descriptor closed at start-up
    assert main(["cache", "list"]) == 0



@pytest.mark.parametrize("argv", [
    pytest.param(["cache", "list"], id="cache-list"),
    pytest.param(["doctor", "--snapshot", CPU_SNAPSHOT], id="doctor"),
    pytest.param(["probe"], id="probe"),
])
def test_a_closed_stdout_runs_the_command_as_usual(cli_env: dict[str, str], argv: list[str]) -> None:
    """``attnforge doctor >&-`` (a cron job): the same exit code as with stdout read, nothing on stderr of it."""
    read = subprocess.run([sys.executable, "-m", "attnforge", *argv], env=cli_env, capture_output=True, text=True,
                          timeout=120, check=False)
    closed = subprocess.run(["bash", "-c", 'exec "$@" >&-', "attnforge", sys.executable, "-m", "attnforge", *argv],
                            env=cli_env, stdout=None, stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    assert "internal error" not in closed.stderr and "Traceback" not in closed.stderr, closed.stderr
    assert closed.returncode == read.returncode, closed.stderr


def _into_closed_pipe(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run attnforge with stdout a pipe whose reader has already gone (``attnforge ... | true``, deterministic)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "attnforge", *argv], env=env, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("argv", [
    pytest.param(["cache", "list"], id="cache-list"),
    pytest.param(["doctor", "--snapshot", CPU_SNAPSHOT], id="doctor"),
    pytest.param(["doctor", "--snapshot", CPU_SNAPSHOT, "--json"], id="doctor-json"),
    pytest.param(["plan", "sdpa-math", "--snapshot", CPU_SNAPSHOT], id="plan"),
])
def test_a_reader_that_left_ends_the_command_as_sigpipe_would(cli_env: dict[str, str], argv: list[str]) -> None:
    done = _into_closed_pipe(argv, cli_env)
    assert done.returncode == PIPE_CLOSED_EXIT == 141, done.stderr
    assert done.stderr == "", "quiet: no error, no 'Exception ignored ... BrokenPipeError' at exit"


@pytest.mark.parametrize("argv", [
    pytest.param(["--help"], id="help"),
    pytest.param(["doctor", "--help"], id="verb-help"),
    pytest.param(["--version"], id="version"),
    pytest.param([], id="bare"),
    pytest.param(["cache"], id="bare-group"),
])
def test_help_into_a_closed_pipe_exits_0(cli_env: dict[str, str], argv: list[str]) -> None:
    done = _into_closed_pipe(argv, cli_env)
    assert (done.returncode, done.stderr) == (0, "")


def test_an_error_under_json_into_a_closed_pipe_keeps_its_exit_code_and_stderr(cli_env: dict[str, str]) -> None:
    done = _into_closed_pipe(["plan", "no-such-backend", "--json", "--snapshot", CPU_SNAPSHOT], cli_env)
    assert done.returncode == 2
    assert "error: unknown backend 'no-such-backend'" in done.stderr and "hint: " in done.stderr
    assert "Exception ignored" not in done.stderr


def test_plan_model_reads_a_config_as_bench_and_warmup_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """plan --model read its config with its own wording (the OS error inline, no cause line)."""
    bad = tmp_path / "config.json"
    bad.write_bytes(b"\xff\xfe{}")
    assert main(["plan", "flash-attn-3", "--model", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "cannot read the model config" in err and "it is not UTF-8 text (byte 0xff at offset 0)" in err
