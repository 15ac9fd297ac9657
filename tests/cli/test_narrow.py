"""Human output wraps rather than cuts on a narrow terminal: the doctor table at 80 columns keeps every next step."""

from __future__ import annotations

import re

import pytest

from attnforge.cli import main
from tests.conftest import REPO

SNAPSHOT = REPO / "tests" / "fixtures" / "snapshots" / "rtx5090_torch2.8_cu128_nvcc12.4.json"


def flatten(text: str) -> str:
    return " ".join(re.sub(r"[│┃┏┓┗┛┡┩└┘├┤┼╇╈╋━─┳┻╭╮╰╯]", " ", text).split())


@pytest.mark.parametrize("columns", [80, 100])
def test_doctor_at_narrow_widths_wraps_every_next_step(
    columns: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    main(["doctor", "--snapshot", str(SNAPSHOT)])
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= columns
    flat = flatten(out)
    assert "not installed -> attnforge install flash-attn-4" in flat
    assert "sm_120 needs nvcc >= 12.8" in flat
    assert "attnforge install xformers --index-url" in flat


def test_doctor_wide_keeps_the_seven_columns(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    main(["doctor", "--snapshot", str(SNAPSHOT)])
    out = capsys.readouterr().out
    assert "this GPU" in out
    assert "not installed -> attnforge install flash-attn-4" in flatten(out)
