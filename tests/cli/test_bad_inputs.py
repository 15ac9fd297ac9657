"""A sweep of bad inputs over every verb: each ends in ``error:`` + ``hint:`` and exit 2 (bad input) or 1 (not
possible here), never a traceback; under ``--json`` the error is a JSON document on stdout too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnforge.cli import main
from tests.conftest import REPO

CPU_SNAPSHOT = str(REPO / "tests" / "fixtures" / "snapshots" / "cpu_dev_torch2.13_cpu.json")
MISSING = "/nonexistent/attnforge-test/none"


def files(tmp: Path) -> dict[str, str]:
    """Bad files a user might pass: broken JSON, a JSON list, a binary blob, a directory, an empty file."""
    (tmp / "bad.json").write_text("{not json")
    (tmp / "list.json").write_text("[1, 2]")
    (tmp / "blob.bin").write_bytes(bytes(range(256)) * 4)
    (tmp / "empty").write_text("")
    (tmp / "dir").mkdir()
    (tmp / "loop-a").symlink_to(tmp / "loop-b")
    (tmp / "loop-b").symlink_to(tmp / "loop-a")
    return {"BAD": str(tmp / "bad.json"), "LIST": str(tmp / "list.json"), "BLOB": str(tmp / "blob.bin"),
            "DIR": str(tmp / "dir"), "EMPTY": str(tmp / "empty"), "LOOP": str(tmp / "loop-a")}


# argv (with {BAD}-style placeholders), expected exit code
CASES: list[tuple[str, int]] = [
    ("nosuchverb", 2),
    ("doctor --bogus", 2),
    ("doctor --snapshot " + MISSING, 2),
    ("doctor --snapshot {BAD}", 2),
    ("doctor --snapshot {LIST}", 2),
    ("doctor --snapshot {BLOB}", 2),
    ("doctor --snapshot {DIR}", 2),
    ("probe --snapshot x", 2),
    ("plan", 2),
    ("plan no-such-backend --snapshot " + CPU_SNAPSHOT, 2),
    ("plan flash-attn==not.a.version! --snapshot " + CPU_SNAPSHOT, 2),
    ("plan flash-attn>=3,<2 --snapshot " + CPU_SNAPSHOT, 2),  # no version fits (planned as any request before)
    ("plan flash-attn==2.8.3,<2.8 --snapshot " + CPU_SNAPSHOT, 2),
    ("plan flash-attn==2.8.3,!=2.8.3 --snapshot " + CPU_SNAPSHOT, 2),  # a pin its own clauses refuse (CLI fuzz)
    ("plan flash-attn===2.8.3,==2.8.4 --snapshot " + CPU_SNAPSHOT, 2),
    ("plan flash-attn --arch 99x --snapshot " + CPU_SNAPSHOT, 2),
    ("plan flash-attn --arch sm_ --snapshot " + CPU_SNAPSHOT, 2),
    ("plan flash-attn --snapshot {EMPTY}", 2),
    ("plan flash-attn --find-links " + MISSING + " --snapshot " + CPU_SNAPSHOT, 2),
    ("build --source " + MISSING + " --snapshot " + CPU_SNAPSHOT, 2),
    ("build --source {DIR} --snapshot " + CPU_SNAPSHOT, 2),  # neither setup.py nor pyproject.toml
    ("build --source {BLOB} --snapshot " + CPU_SNAPSHOT, 2),  # a file that is not an sdist
    ("install --source {EMPTY}", 2),
    ("plan --source {DIR}", 2),
    ("build no-such-backend --snapshot " + CPU_SNAPSHOT, 2),
    ("build flash-attn --jobs 0 --snapshot " + CPU_SNAPSHOT, 2),
    ("build flash-attn --arch 1.x --snapshot " + CPU_SNAPSHOT, 2),
    ("diagnose " + MISSING, 2),
    ("diagnose {DIR}", 2),
    ("diagnose {BLOB} --snapshot {BAD}", 2),
    ("install no-such-backend", 2),
    ("install flash-attn==bad!version", 2),
    ("install flash-attn --arch nope", 2),
    ("verify --device tpu", 2),
    ("bench --shapes nope", 2),
    ("bench --dtype int3", 2),
    ("cache show 0000deadbeef", 1),
    ("cache rm 0000deadbeef", 1),
    ("cache import " + MISSING, 2),
    ("cache import {BLOB}", 2),
    ("cache prune --max-size lots", 2),
    # a symlink loop: Path.resolve() raised RuntimeError, an internal error (a CLI fuzz, 2026-12-03)
    ("cache export {LOOP}", 2),
    ("plan --source {LOOP} --offline", 2),
    ("build --source {LOOP} --snapshot " + CPU_SNAPSHOT, 2),
    ("cache prune --older-than yesterday", 2),
    ("cargo-env no-such-crate", 2),
    ("cargo-env candle-flash-attn --compute-cap x --print --crate-version 0.9.1 --snapshot " + CPU_SNAPSHOT, 2),
    ("cargo-env candle-flash-attn --cargo-lock " + MISSING + " --print --snapshot " + CPU_SNAPSHOT, 2),
]


def check(code: int, err: str, expected: int) -> None:
    assert "Traceback" not in err, err
    assert code == expected, err
    assert "error:" in err, err
    assert "hint:" in err, err


@pytest.mark.parametrize(("line", "expected"), CASES, ids=[c[0][:60] for c in CASES])
def test_bad_input_is_an_error_with_a_hint(
    line: str, expected: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = line.format(**files(tmp_path)).split()
    code = main(argv)
    check(code, capsys.readouterr().err, expected)


@pytest.mark.parametrize("option", ["--dtype", "--head-dim"])
def test_a_slim_option_that_names_nothing_is_a_usage_error(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--dtype ""`` asked for a slim build of every dtype that dropped FA3's optional features, silently; ``--head-dim
    ""`` was ignored (a CLI fuzz, 2026-12-03)."""
    snapshot = str(REPO / "tests" / "fixtures" / "snapshots" / "h200_torch2.11_cu130.json")
    code = main(["plan", "flash-attn-3", "--offline", "--snapshot", snapshot, option, ""])
    err = capsys.readouterr().err
    check(code, err, 2)
    assert f"{option} '' names nothing" in err


@pytest.mark.parametrize("argv", [["cache", "export", ""], ["cache", "export", "  "], ["cache", "import", ""]])
def test_an_empty_path_is_a_usage_error_not_the_current_directory(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """click reads "" as the current directory: `cache export ""` wrote artifacts/ and simple/ where the shell stood,
    exit 0 (a CLI fuzz, 2026-12-03)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    code = main(argv)
    check(code, capsys.readouterr().err, 2)
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize(
    "line",
    ["doctor --snapshot {BAD} --json", "plan no-such-backend --json --snapshot " + CPU_SNAPSHOT,
     "cargo-env no-such-crate --json", "diagnose " + MISSING + " --json"],
)
def test_under_json_the_error_is_json_on_stdout(line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(line.format(**files(tmp_path)).split())
    out, err = capsys.readouterr()
    check(code, err, 2)
    doc = json.loads(out)
    assert doc["schema_version"] == 1
    assert doc["kind"] == "error"
    assert set(doc["error"]) >= {"message", "cause", "hint"}
    assert doc["error"]["hint"]


@pytest.mark.parametrize("line", ["cache list", "cache list --json", "cache export {DIR}/out", "cache prune",
                                  "cache import {DIR}", "install flash-attn --find-links {DIR} --offline"])
def test_attnforge_home_being_a_file_is_bad_input(
    line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home-is-a-file"
    home.write_text("")
    monkeypatch.setenv("ATTNFORGE_HOME", str(home))
    code = main(line.format(**files(tmp_path)).split())
    err = capsys.readouterr().err
    check(code, err, 2)
    assert "ATTNFORGE_HOME" in err


def _boom(*args: object, **kwargs: object) -> None:
    raise RuntimeError("kaboom from a bug")


@pytest.mark.parametrize("verbose", [False, True])
def test_an_unexpected_exception_is_an_internal_error_with_a_log(
    verbose: bool, attnforge_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("attnforge.catalog.load_catalog", _boom)  # doctor imports it when it runs
    code = main(["doctor", "--snapshot", CPU_SNAPSHOT, *(["-v"] if verbose else [])])
    err = capsys.readouterr().err
    assert code == 1
    assert "error: internal error: RuntimeError: kaboom from a bug" in err
    assert "hint: please report it at" in err
    [log] = (attnforge_home / "logs").glob("internal-error-*.log")
    assert "Traceback" in log.read_text() and "kaboom" in log.read_text()
    assert str(log) in err
    assert ("Traceback (most recent call last)" in err) is verbose


def test_an_internal_error_under_json_is_json(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("attnforge.catalog.load_catalog", _boom)  # doctor imports it when it runs
    assert main(["doctor", "--snapshot", CPU_SNAPSHOT, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["message"].startswith("internal error")
    assert "report" in doc["error"]["hint"]


def test_help_names_the_environment_and_verbose(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("ATTNFORGE_HOME", "ATTNFORGE_AUTOTUNE", "GITHUB_API_URL", "GITHUB_TOKEN", "--verbose"):
        assert name in out


@pytest.mark.parametrize("argv", [[], ["cache"]])
def test_no_command_prints_the_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "Usage: attnforge" in out
    assert "error:" not in err


# issue 31 item 9: numbers that used to end as internal errors (NaN/inf through click.FloatRange, int(COLUMNS))
NUMBER_CASES = ["verify --timeout nan sdpa-math", "verify --timeout inf sdpa-math", "verify --timeout -inf sdpa-math",
                "verify --timeout 1e12 sdpa-math", "verify --timeout abc sdpa-math", "verify --timeout 0 sdpa-math",
                "bench --timeout nan sdpa-math", "bench --timeout inf sdpa-math", "bench --rounds nan sdpa-math",
                "bench --max-noise nan sdpa-math", "bench --max-noise 0 sdpa-math", "warmup --budget nan",
                "warmup --budget inf", "warmup --budget 0",
                "bench --rounds 0 sdpa-math", "build flash-attn --jobs nan --snapshot " + CPU_SNAPSHOT,
                "build flash-attn --jobs -1 --snapshot " + CPU_SNAPSHOT, "verify --seed nan sdpa-math",
                "bench --batch nan --shapes model --heads 2 --head-dim 16 --seqlen 16 sdpa-math"]


@pytest.mark.parametrize("line", NUMBER_CASES)
def test_a_bad_number_is_a_usage_error_naming_the_option(line: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(line.split())
    err = capsys.readouterr().err
    check(code, err, 2)
    assert "internal error" not in err
    option = next(a for a in line.split() if a.startswith("--"))  # each line names the bad option first
    assert option in err


@pytest.mark.parametrize("columns", ["abc", "-5", "1e9", " "])
def test_a_bad_columns_is_ignored_with_a_note_and_the_output_still_printed(
    columns: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    assert main(["doctor", "--snapshot", CPU_SNAPSHOT]) in (0, 1)  # 1: nothing fast on a CPU machine
    out, err = capsys.readouterr()
    assert "this machine" in out  # COLUMNS=-5 once printed nothing at all
    assert "internal error" not in err
    assert ("is not a width in columns" in err) is bool(columns.strip())


@pytest.mark.parametrize("line", ["doctor", "cache list --json", "warmup --shapes 1x8x128x64"])
def test_an_unknown_autotune_setting_is_a_usage_error_naming_the_accepted_values(
    line: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ATTNFORGE_AUTOTUNE=banana`` was read as the default without a word; now every verb refuses it (exit 2),
    while ``--help`` and ``--version`` still work."""
    monkeypatch.setenv("ATTNFORGE_AUTOTUNE", " Banana ")
    code = main(line.split())
    captured = capsys.readouterr()
    text = captured.out if "--json" in line else captured.err
    assert code == 2, text
    assert "ATTNFORGE_AUTOTUNE='banana' is not a setting" in text and "background" in text
    assert main(["--version"]) == 0 and main(["doctor", "--help"]) == 0


@pytest.mark.parametrize("value", ["banana", "disabled"])
def test_an_unknown_wheel_sources_setting_is_a_usage_error(value: str, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Anything but an on or off spelling was read as on (``disabled`` still asked GitHub; a CLI fuzz, 2026-12-03)."""
    monkeypatch.setenv("ATTNFORGE_WHEEL_SOURCES", value)
    snapshot = str(REPO / "tests" / "fixtures" / "snapshots" / "h200_torch2.11_cu130.json")
    code = main(["plan", "flash-attn", "--offline", "--snapshot", snapshot])
    err = capsys.readouterr().err
    check(code, err, 2)
    assert "ATTNFORGE_WHEEL_SOURCES" in err


@pytest.mark.parametrize(("value", "on"), [("", True), (" ON ", True), ("1", True), ("false", False), ("0", False),
                                           ("Off", False), ("no", False)])
def test_the_wheel_sources_setting_reads_every_accepted_spelling(value: str, on: bool) -> None:
    from attnforge.fetch.listings import wheel_sources_on

    assert wheel_sources_on({"ATTNFORGE_WHEEL_SOURCES": value}) is on


@pytest.mark.parametrize(("value", "want"), [("", "default"), (" OFF ", "off"), ("0", "off"), ("yes", "on"),
                                             ("1", "on"), ("Background", "background")])
def test_the_autotune_setting_reads_every_accepted_spelling(value: str, want: str) -> None:
    from attnforge.dispatch.autotune_env import setting

    assert setting({"ATTNFORGE_AUTOTUNE": value}) == want


def test_attention_warns_once_for_an_unknown_autotune_setting_and_serves(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The runtime never raises over the setting: one warning, then the default (a forward pass is not taken down)."""
    import warnings

    import torch

    import attnforge
    from attnforge.dispatch import autotune_env, runtime
    from attnforge.records import RecordStore

    monkeypatch.setenv("ATTNFORGE_AUTOTUNE", "sometimes")
    monkeypatch.setattr(autotune_env, "_WARNED", set())
    previous = runtime.set_dispatcher(runtime.Dispatcher(records=RecordStore(tmp_path / "home")))
    try:
        q = torch.randn(1, 2, 3, 8)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                out = attnforge.attention(q, q, q)
                assert out.shape == q.shape
        assert autotune_env.lenient() == "default"
    finally:
        runtime.set_dispatcher(previous)
    ours = [w for w in caught if "ATTNFORGE_AUTOTUNE" in str(w.message)]
    assert len(ours) == 1 and "'sometimes' is not a setting" in str(ours[0].message)


@pytest.mark.parametrize(("verb", "version"), [("verify", 2), ("bench", 3), ("doctor", 1), ("plan", 1)])
def test_the_json_help_names_the_schema_version_the_verb_prints(verb: str, version: int,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """verify printed schema_version 2 and bench 3 while their --json help said 1."""
    assert main([verb, "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"Print machine-readable JSON (schema_version {version})." in help_text
