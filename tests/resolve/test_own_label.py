"""A wheel attnforge built (its own local label, :mod:`attnforge.types.local_label`) is understood when it comes
back through a find-links page, an index or a team's releases: torch major.minor, CUDA and archs from the label."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnforge.catalog import load_catalog
from attnforge.cli import main
from attnforge.resolve.wheels import read_wheel
from attnforge.types.cc import ComputeCapability

SNAPSHOTS = Path(__file__).resolve().parent.parent / "fixtures" / "snapshots"
BUILT = "flash_attn_3-3.0.0b1+cu130torch2.11.cxx11abitrue.sm90-cp39-abi3-linux_x86_64.whl"


def test_the_label_is_read_back() -> None:
    facts = read_wheel(BUILT, load_catalog())
    assert facts.label is not None and facts.label.grammar == "attnforge"
    assert facts.label.torch == "2.11" and facts.label.cuda is not None and facts.label.cuda.text() == "13.0"
    assert [t.cc for t in facts.archs] == [ComputeCapability(9, 0)]


@pytest.mark.parametrize(("wheel", "accepted", "reason"), [
    pytest.param(BUILT, True, None, id="same-torch"),
    pytest.param(BUILT.replace("torch2.11", "torch2.12"), False, "2.12", id="other-torch"),
    pytest.param(BUILT.replace(".sm90", ".sm80"), False, "sm_80", id="other-arch"),
])
def test_plan_on_the_h200_snapshot(wheel: str, accepted: bool, reason: str | None, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "wh").mkdir()
    (tmp_path / "wh" / wheel).write_bytes(b"")  # planning reads the file name only
    main(["plan", "flash-attn-3", "--snapshot", str(SNAPSHOTS / "h200_torch2.11_cu130.json"),
          "--find-links", str(tmp_path / "wh"), "--offline", "--json"])
    doc = json.loads(capsys.readouterr().out)
    cands = [c for c in doc["candidates"] if wheel in c["description"]]
    assert len(cands) == 1
    assert cands[0]["accepted"] is accepted, cands[0]
    if reason is not None:
        assert any(reason in r for r in cands[0]["reasons"]), cands[0]["reasons"]
