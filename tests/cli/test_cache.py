from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from attnforge.cache import Store
from attnforge.cli import main
from attnforge.cli.cache import parse_duration_s, parse_size_bytes
from attnforge.errors import UsageError
from tests.cache.conftest import put_wheels
from tests.cache.wheelmaker import flip_byte


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


@pytest.fixture
def filled(attnforge_home: Path, tmp_path: Path) -> tuple[Store, list[str]]:
    store = Store(attnforge_home)
    return store, put_wheels(store, tmp_path)


def test_list_json_names_every_entry_with_its_inputs(
    filled: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, keys = filled
    code, doc = run_json(capsys, "cache", "list")
    assert code == 0
    assert doc["schema_version"] == 1
    assert doc["kind"] == "cache.list"
    assert sorted(e["key"] for e in doc["entries"]) == sorted(keys)
    assert all(e["inputs"]["torch_version"] == "2.13.0+cpu" for e in doc["entries"])


def test_list_for_people_shows_a_table(
    filled: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "af-pure-fixture" in out
    assert "2 entries" in out


def test_show_by_prefix_and_rm(filled: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    store, keys = filled
    code, doc = run_json(capsys, "cache", "show", keys[0][:16])
    assert code == 0
    assert doc["key"] == keys[0]
    assert doc["provenance"] == {"host": "test"}
    code, doc = run_json(capsys, "cache", "rm", keys[0])
    assert code == 0
    assert doc["removed"]["key"] == keys[0]
    assert [e.key for e in store.list()] == [keys[1]]


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        pytest.param(["cache", "show", "zz"], 2, "not a cache key", id="bad-key"),
        pytest.param(["cache", "show", "sha256:" + "0" * 64], 1, "no cache entry", id="unknown-key"),
        pytest.param(["cache", "prune", "--older-than", "soon"], 2, "not a duration", id="bad-duration"),
        pytest.param(["cache", "prune", "--max-size", "lots"], 2, "not a size", id="bad-size"),
    ],
)
def test_bad_input_is_an_error_line_not_a_traceback(
    attnforge_home: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str
) -> None:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") or f"error: {message}" in err
    assert "Traceback" not in err


def test_prune_json(filled: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run_json(capsys, "cache", "prune", "--max-size", "1B")
    assert code == 0
    assert len(doc["removed"]) == 2
    assert doc["kept_bytes"] == 0


def test_export_then_import_through_the_cli(
    filled: tuple[Store, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, keys = filled
    code, doc = run_json(capsys, "cache", "export", str(tmp_path / "share"))
    assert code == 0
    assert sorted(doc["exported"]) == sorted(keys)
    assert doc["index_url"].startswith("file://")
    monkeypatch.setenv("ATTNFORGE_HOME", str(tmp_path / "other-home"))
    code, doc = run_json(capsys, "cache", "import", str(tmp_path / "share"))
    assert code == 0
    assert sorted(doc["imported"]) == sorted(keys)


def test_import_with_a_tampered_file_exits_1_and_names_it(
    filled: tuple[Store, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    main(["cache", "export", str(tmp_path / "share"), "--json"])
    capsys.readouterr()
    victim = next((tmp_path / "share" / "artifacts").glob("*/*.whl"))
    flip_byte(victim)
    monkeypatch.setenv("ATTNFORGE_HOME", str(tmp_path / "other-home"))
    assert main(["cache", "import", str(tmp_path / "share")]) == 1
    out = capsys.readouterr().out
    assert "rejected" in out
    assert "fails its hash check" in out


@pytest.mark.parametrize(
    ("text", "seconds"),
    [pytest.param("30d", 30 * 86400, id="days"), pytest.param("12h", 43200, id="hours"),
     pytest.param("2w", 14 * 86400, id="weeks"), pytest.param("90s", 90, id="seconds")],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize(
    ("text", "size"),
    [pytest.param("20GB", 20 * 10**9, id="GB"), pytest.param("8GiB", 8 * 2**30, id="GiB"),
     pytest.param("500mb", 500 * 10**6, id="mb"), pytest.param("1.5TB", 15 * 10**11, id="fraction")],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size_bytes(text) == size


@pytest.mark.parametrize("text", ["", "20", "GB", "-1GB", "20XB",
                                  # a float made this infinite (OverflowError, an internal error) and 0.5b zero: a
                                  # prune to 0 bytes, every entry removed (CLI fuzz, 2026-12-03)
                                  "9" * 400 + "GB", "0.5b", "0.0001kB", "9223372036854775808B"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_size_bytes(text)
    assert len(err.value.message) < 200 and err.value.hint


def test_sizes_are_exact_decimals() -> None:
    assert parse_size_bytes("1.001kB") == 1001 and parse_size_bytes("0") == 0 and parse_size_bytes("1b") == 1
    assert parse_size_bytes("9223372036854775807B") == 2**63 - 1


def test_a_time_no_calendar_holds_is_shown_not_a_crash() -> None:
    """A row's timestamp edited to 1e300 crashed ``cache list`` and ``cache show`` with OverflowError."""
    from attnforge.cli.cache import _iso

    assert _iso(1e300) == "invalid time 1e+300" and _iso(0.0) == "1970-01-01T00:00:00+00:00"


@pytest.mark.parametrize("as_json", [False, True], ids=["people", "json"])
def test_export_with_a_corrupt_entry_exits_1_in_both_output_modes(
    filled: tuple[Store, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str], as_json: bool,
) -> None:
    store, keys = filled
    flip_byte(Path(store.show(keys[0]).path))
    code = main(["cache", "export", str(tmp_path / "share"), *(["--json"] if as_json else [])])
    out = capsys.readouterr().out
    assert code == 1  # the exit code says the same whatever the output format
    if as_json:
        doc = json.loads(out)
        assert len(doc["errors"]) == 1 and keys[0] in doc["errors"][0]
        assert doc["exported"] == [keys[1]]
    else:
        assert "entries were not exported" in out


@pytest.mark.parametrize("as_json", [False, True], ids=["people", "json"])
def test_verify_with_a_damaged_entry_exits_1_in_both_output_modes(
    filled: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str], as_json: bool,
) -> None:
    store, keys = filled
    flip_byte(Path(store.show(keys[1]).path))
    code = main(["cache", "verify", *(["--json"] if as_json else [])])
    out = capsys.readouterr().out
    assert code == 1
    assert keys[1][:19] in out
    assert [e.key for e in store.list()] == [keys[0]]  # the damaged one went to quarantine
