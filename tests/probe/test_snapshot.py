"""SystemSnapshot: JSON round-trip, strict decoding, compute-capability spelling."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnforge.errors import ProbeError
from attnforge.probe import SystemSnapshot
from attnforge.types.cc import format_cc, parse_cc
from tests._fakes import FIXTURES

SNAPSHOTS = sorted((FIXTURES / "snapshots").glob("*.json"))


@pytest.mark.parametrize("path", SNAPSHOTS, ids=[p.stem for p in SNAPSHOTS])
def test_fixture_snapshots_round_trip(path: Path) -> None:
    snap = SystemSnapshot.load(path)
    again = SystemSnapshot.from_json(snap.to_json())
    assert again == snap
    assert json.loads(again.to_json()) == json.loads(path.read_text())


def test_h200_fixture_facts() -> None:
    snap = SystemSnapshot.load(FIXTURES / "snapshots" / "h200_torch2.11_cu130.json")
    assert snap.compute_capabilities == ((9, 0),)
    assert snap.torch is not None and snap.torch.is_cuda_build and snap.torch.base_version == "2.11.0"
    assert snap.primary_toolkit is not None and snap.primary_toolkit.version == "13.0"


@pytest.mark.parametrize(
    ("mutate", "path_in_error"),
    [
        pytest.param(lambda d: d["platform"].__setitem__("cores", "sixteen"), "platform.cores", id="wrong-type"),
        pytest.param(lambda d: d["gpus"].append({"index": 0}), "gpus[0]", id="missing-field"),
        pytest.param(lambda d: d.__setitem__("bogus", 1), "bogus", id="unknown-field"),
        pytest.param(lambda d: d["gpus"].append({"index": 0, "name": "X", "compute_capability": [9],
                                                  "memory_bytes": None, "driver_version": None,
                                                  "cuda_driver_version": None, "source": "x"}),
                     "gpus[0].compute_capability", id="short-tuple"),
    ],
)
def test_bad_snapshot_names_the_dotted_path(mutate, path_in_error: str) -> None:  # type: ignore[no-untyped-def]
    data = json.loads((FIXTURES / "snapshots" / "cpu_dev_torch2.13_cpu.json").read_text())
    mutate(data)
    with pytest.raises(ProbeError) as info:
        SystemSnapshot.from_json(json.dumps(data))
    assert path_in_error in info.value.message
    assert info.value.hint


def test_newer_schema_version_is_refused_with_a_hint() -> None:
    data = json.loads((FIXTURES / "snapshots" / "cpu_dev_torch2.13_cpu.json").read_text())
    data["schema_version"] = 99
    with pytest.raises(ProbeError, match="schema version 99"):
        SystemSnapshot.from_json(json.dumps(data))


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", "null"])
def test_not_a_snapshot(text: str) -> None:
    with pytest.raises(ProbeError):
        SystemSnapshot.from_json(text)


def test_missing_file_is_a_probe_error(tmp_path: Path) -> None:
    with pytest.raises(ProbeError, match="cannot read snapshot"):
        SystemSnapshot.load(tmp_path / "nope.json")


@given(st.integers(min_value=1, max_value=20), st.integers(min_value=0, max_value=9))
def test_cc_spellings_round_trip(major: int, minor: int) -> None:
    cc = (major, minor)
    assert parse_cc(format_cc(cc)) == cc
    assert parse_cc(f"sm_{major}{minor}") == cc
    assert parse_cc(f"sm_{major}{minor}a") == cc
    assert parse_cc(f"{major}{minor}") == cc


@pytest.mark.parametrize("text", ["", "x", "9.x", "sm_", "1234", "9..0"])
def test_bad_cc_is_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="compute capability"):
        parse_cc(text)


def test_snapshot_is_frozen() -> None:
    snap = SystemSnapshot.load(FIXTURES / "snapshots" / "h200_torch2.11_cu130.json")
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.torch = None  # type: ignore[misc]
