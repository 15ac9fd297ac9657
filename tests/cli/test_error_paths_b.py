"""Edges of `cache prune`/`cache show`, `cargo-env --crate-version` and `diagnose` on an empty log."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from attnforge.cache import CacheKey, Store
from attnforge.cli import main
from tests.cache.conftest import inputs_for, put_wheels
from tests.cache.wheelmaker import make_wheel
from tests.conftest import REPO

CPU_SNAPSHOT = REPO / "tests" / "fixtures" / "snapshots" / "cpu_dev_torch2.13_cpu.json"


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def test_prune_max_size_0_empties_the_cache(
    attnforge_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = put_wheels(Store(attnforge_home), tmp_path)
    code, doc = run_json(capsys, "cache", "prune", "--max-size", "0")
    assert code == 0
    assert sorted(e["key"] for e in doc["removed"]) == sorted(keys)
    assert doc["kept_bytes"] == 0
    assert Store(attnforge_home).list() == []


def test_a_bare_size_other_than_0_asks_for_a_unit(attnforge_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "prune", "--max-size", "5"]) == 2
    err = capsys.readouterr().err
    assert "error: not a size: '5'" in err and "0 needs no unit" in err


def test_the_prune_help_says_what_0_does(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "prune", "--help"]) == 0
    assert "0 removes every entry" in " ".join(capsys.readouterr().out.split())


def test_a_too_short_key_prefix_lists_the_entries_it_matches(
    attnforge_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = put_wheels(Store(attnforge_home), tmp_path)
    prefix = keys[0][7:9]
    assert main(["cache", "show", prefix]) == 2
    err = capsys.readouterr().err
    assert f"error: the key prefix '{prefix}' is too short: give at least 4 hex digits" in err
    assert f"hint: give more digits of one of: {keys[0][:19]} (af_pure_fixture-0.0-py3-none-any.whl)" in err
    assert "Traceback" not in err


def test_an_ambiguous_key_prefix_lists_its_candidates(
    attnforge_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two entries whose keys share their first 4 hex digits (inputs found by trying glibc versions: ~300 tries)."""
    wheel = make_wheel(tmp_path / "dist")
    seen: dict[str, Any] = {}
    for i in range(20_000):
        inputs = inputs_for(wheel, glibc=f"2.{i}")
        head = CacheKey.of(inputs).digest[:4]
        if head in seen:
            pair = (seen[head], inputs)
            break
        seen[head] = inputs
    else:
        pytest.fail("no two keys with the same first 4 digits")
    store = Store(attnforge_home)
    keys = sorted(store.put(wheel, inputs).entry.key for inputs in pair)
    assert main(["cache", "show", keys[0][7:11]]) == 2
    err = capsys.readouterr().err
    assert f"error: the key prefix '{keys[0][7:11]}' matches 2 entries" in err
    assert all(key[:19] in err for key in keys), err
    code, doc = run_json(capsys, "cache", "show", keys[1][:24])  # enough digits: the one entry
    assert code == 0 and doc["key"] == keys[1]


@pytest.mark.parametrize("version", ["latest", "../../etc", "", "0.9.1-mine"])
def test_cargo_env_refuses_a_crate_version_that_is_not_one(
    version: str, capsys: pytest.CaptureFixture[str], attnforge_home: Path
) -> None:
    code = main(["cargo-env", "candle-flash-attn", "--crate-version", version, "--print",
                 "--snapshot", str(CPU_SNAPSHOT)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"error: not a crate version: {version!r}" in err
    assert "hint: give the version Cargo.lock pins, e.g. --crate-version 0.9.1" in err
    assert not (attnforge_home / "cargo").exists(), "nothing was planned or created"


def test_diagnose_an_empty_log_says_so_and_exits_like_no_failure(
    tmp_path: Path, cli_env: dict[str, str], attnforge_argv: list[str]
) -> None:
    log = tmp_path / "empty.log"
    log.write_text("\n  \n", encoding="utf-8")
    argv = [*attnforge_argv, "diagnose", str(log), "--snapshot", str(CPU_SNAPSHOT)]
    done = subprocess.run(argv, capture_output=True, text=True, env=cli_env, timeout=120)
    assert done.returncode == 0, done.stderr  # as for a log that shows no failure (the documented exit codes)
    assert "the log is empty: nothing to diagnose" in done.stdout
    done = subprocess.run([*argv, "--json"], capture_output=True, text=True, env=cli_env, timeout=120)
    doc = json.loads(done.stdout)
    assert (done.returncode, doc["known"], doc["cause"]) == (0, False, "the log is empty: nothing to diagnose")


def test_a_prefix_that_matches_only_a_damaged_row_says_so(
    attnforge_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A row whose key column is not a key (found by a CLI fuzz, 2026-12-03): `cache show` / `cache rm` of a prefix it
    matched stopped with an internal error (ValueError: not a cache key); `cache verify` moves such a row aside."""
    import sqlite3

    keys = put_wheels(Store(attnforge_home), tmp_path)
    with sqlite3.connect(attnforge_home / "cache.db") as conn:
        conn.execute("UPDATE artifacts SET key = ? WHERE key = ?", (keys[0][:11], keys[0]))
    conn.close()
    for verb in ("show", "rm"):
        assert main(["cache", verb, keys[0][7:11]]) == 1
        err = capsys.readouterr().err
        assert f"error: the only row that starts with '{keys[0][7:11]}' is damaged: '{keys[0][:11]}'" in err
        assert "cache verify` moves it aside" in err and "internal error" not in err
    assert main(["cache", "show", keys[1][7:19]]) == 0  # the healthy entry is still found by its prefix
    assert keys[1] in capsys.readouterr().out


DEEP_JSON = "[" * 5000 + "]" * 5000


@pytest.mark.parametrize("argv", [
    ("doctor", "--snapshot", "{deep}"),
    ("plan", "flash-attn", "--offline", "--model", "{deep}"),
    ("warmup", "--device", "cpu", "--model", "{deep}"),
], ids=["doctor-snapshot", "plan-model", "warmup-model"])
def test_json_nested_too_deeply_is_a_bad_input_not_an_internal_error(
        argv: tuple[str, ...], attnforge_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A JSON input nested thousands deep (found by a CLI fuzz, 2026-12-03): Python's parser raises RecursionError,
    which each command reported as an internal error (exit 1); now the file's own "not valid" error."""
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP_JSON)
    code = main([a.format(deep=deep) for a in argv])
    err = capsys.readouterr().err
    assert code in (1, 2) and "internal error" not in err and "nested too deeply" in err, err


def test_a_provenance_nested_too_deeply_is_one_bad_entry_not_a_failed_verify(
        attnforge_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One entry's provenance.json nested thousands deep: `cache verify` names that entry (the others are checked)
    and `cache export` goes on; each stopped the whole command with an internal error (RecursionError)."""
    keys = put_wheels(Store(attnforge_home), tmp_path)
    (attnforge_home / "artifacts" / keys[0][7:] / "provenance.json").write_text(DEEP_JSON)
    assert main(["cache", "verify"]) == 1
    captured = capsys.readouterr()
    assert "internal error" not in captured.err and "nested too deeply" in captured.out + captured.err
    main(["cache", "export", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert "internal error" not in captured.err, captured.err
    assert any((tmp_path / "out").rglob(f"*{keys[1][7:19]}*")) or any((tmp_path / "out").rglob("*.whl"))


@pytest.mark.parametrize("argv", [("doctor", "--snapshot", "/dev/zero"), ("plan", "flash-attn", "--offline")],
                         ids=["snapshot", "extra-wheel-sources"])
def test_an_endless_input_file_is_refused_not_read_until_memory_runs_out(
        argv: tuple[str, ...], attnforge_home: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``/dev/zero`` as a snapshot or as a team's wheel sources file (found by a CLI fuzz, 2026-12-03: read whole, 23
    GiB before the OOM killer); now refused past 64 MiB, as a model config or a lock file is."""
    monkeypatch.setenv("ATTNFORGE_EXTRA_WHEEL_SOURCES", "/dev/zero")
    monkeypatch.delenv("ATTNFORGE_WHEEL_SOURCES", raising=False)  # on (the suite turns them off), --offline
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert "64 MiB" in err and "internal error" not in err, err


def test_a_looping_link_in_a_find_links_folder_leaves_its_wheels_listed(tmp_path: Path) -> None:
    """One looping symlink beside the wheels (found by a CLI fuzz, 2026-12-03): the folder was "unreadable" (ELOOP
    from the entry's is_file(), blamed on the folder)."""
    from attnforge.fetch.indexes import list_find_links

    wheel = make_wheel(tmp_path / "links")
    (tmp_path / "links" / "loop").symlink_to(tmp_path / "links" / "loop")
    (tmp_path / "links" / "loop.whl").symlink_to(tmp_path / "links" / "loop.whl")
    assert [w.filename for w in list_find_links(str(tmp_path / "links"))] == [wheel.name]


def test_a_source_that_is_a_device_is_named_as_such(attnforge_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--source /dev/zero`` (found by a CLI fuzz, 2026-12-03): "has no subdirectory None"."""
    assert main(["build", "flash-attn", "--offline", "--arch", "9.0", "--source", "/dev/zero"]) == 2
    err = capsys.readouterr().err
    assert "/dev/zero is neither a folder nor an sdist archive" in err and "None" not in err
