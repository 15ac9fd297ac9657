"""The shared value types: compute capability, versions and the device key round-trip and sort right."""

from __future__ import annotations

import pytest
from packaging.version import Version

from attnforge._serde import from_jsonable, to_jsonable
from attnforge.types import ComputeCapability, DeviceKey, device_key, loose_version, newest_first, parse_version
from attnforge.types.cc import parse_cc_list


@pytest.mark.parametrize(("text", "cc"), [
    ("9.0", (9, 0)), ("90", (9, 0)), ("sm_90", (9, 0)), ("sm_90a", (9, 0)), ("compute_120f", (12, 0)),
    ("12.0", (12, 0)), (" 8.6 ", (8, 6)), ("100", (10, 0)),
])
def test_cc_parses_every_spelling(text: str, cc: tuple[int, int]) -> None:
    got = ComputeCapability.parse(text)
    assert got == cc
    assert ComputeCapability.parse(str(got)) == got
    assert got.sm == f"sm_{cc[0]}{cc[1]}"


@pytest.mark.parametrize("text", ["", "9", "sm_", "nine.oh", "1234", "9.x"])
def test_cc_rejects_nonsense(text: str) -> None:
    with pytest.raises(ValueError, match="not a compute capability"):
        ComputeCapability.parse(text)


def test_cc_is_a_tuple_and_round_trips_through_json() -> None:
    cc = ComputeCapability(9, 0)
    assert cc < (10, 0) and cc > ComputeCapability(8, 9)
    assert str(cc) == "9.0"
    data = to_jsonable({"cc": cc})
    assert data == {"cc": [9, 0]}
    back = from_jsonable(ComputeCapability, [12, 0])
    assert isinstance(back, ComputeCapability) and back == (12, 0)


def test_cc_list_is_the_one_arch_parser() -> None:
    assert parse_cc_list(("9.0,12.0", "sm_90;8.0")) == ((9, 0), (12, 0), (8, 0))
    assert parse_cc_list(()) == ()
    with pytest.raises(ValueError, match="bogus"):
        parse_cc_list(("9.0,bogus",))


def test_versions_final_before_prerelease_and_short_vs_long() -> None:
    versions = ["2.8.3rc1", "2.8.3", "2.8", "2.8.3.post1", "2.7.4"]
    ordered = newest_first(versions, Version)
    assert ordered == ["2.8.3.post1", "2.8.3", "2.8.3rc1", "2.8", "2.7.4"]


def test_newest_first_breaks_ties_by_the_tiebreak() -> None:
    rows = [("2.8", "b"), ("2.8.0", "a"), ("2.9", "z")]
    assert newest_first(rows, lambda r: Version(r[0]), lambda r: (r[1],)) == [("2.9", "z"), ("2.8.0", "a"),
                                                                              ("2.8", "b")]


def test_loose_and_strict_version_reading() -> None:
    assert parse_version("not a version") is None
    assert parse_version("2.11.0+cu130") == Version("2.11.0+cu130")
    assert loose_version("v12.8") == Version("12.8")
    assert loose_version("17.14.36310.24") > loose_version("17.9.1")
    assert loose_version("nothing") == Version("0")
    assert loose_version("CUDA_PATH_V12_10") > loose_version("CUDA_PATH_V12_8") > loose_version("CUDA_PATH_V12_6")


@pytest.mark.parametrize(("name", "cc", "torch", "text"), [
    ("NVIDIA H200", (9, 0), "2.11.0+cu130", "NVIDIA H200|9.0|torch 2.11.0+cu130"),
    ("cpu", None, "2.13.0+cpu", "cpu|torch 2.13.0+cpu"),
])
def test_device_key_round_trip(name: str, cc: tuple[int, int] | None, torch: str, text: str) -> None:
    assert device_key(name, cc, torch) == text
    key = DeviceKey.parse(text)
    assert key == DeviceKey.of(name, cc, torch)
    assert str(key) == text


@pytest.mark.parametrize("text", ["", "H200", "H200|9.0|2.11", "|torch 2.1", "a|b|c|torch 2"])
def test_device_key_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a"):
        DeviceKey.parse(text)


def test_types_is_a_leaf() -> None:
    """types/ imports nothing from attnforge but ``_compat`` (the Python 3.10 shims, which import nothing)."""
    import ast
    from pathlib import Path

    import attnforge.types as pkg

    for f in Path(pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attnforge."):
                allowed = ("attnforge.types", "attnforge._compat")
                assert node.module.startswith(allowed), f"{f.name} imports {node.module}"
