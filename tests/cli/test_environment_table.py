"""Every ``ATTNFORGE_*`` variable the source reads is in the one table ``attnforge --help`` renders, so a new
variable cannot be forgotten (``ATTNFORGE_WHEEL_SOURCES=off`` once was)."""

from __future__ import annotations

import re

import pytest

from attnforge.cli import ENVIRONMENT, main
from tests.conftest import SRC

NAME = re.compile(r"\bATTNFORGE_[A-Z][A-Z0-9_]*[A-Z0-9]\b")


def _names_in_source() -> set[str]:
    return {m for path in (SRC / "attnforge").rglob("*.py") for m in NAME.findall(path.read_text("utf-8"))}


def test_every_attnforge_variable_in_the_source_is_in_the_table() -> None:
    found = _names_in_source()
    assert {"ATTNFORGE_HOME", "ATTNFORGE_WHEEL_SOURCES", "ATTNFORGE_NET_BUDGET_S"} <= found  # the grep works
    missing = sorted(found - {row.name for row in ENVIRONMENT})
    assert missing == [], f"add these to ENVIRONMENT in src/attnforge/cli/__init__.py: {missing}"


def test_the_table_names_no_variable_the_source_does_not_read() -> None:
    stale = sorted({row.name for row in ENVIRONMENT if row.name.startswith("ATTNFORGE_")} - _names_in_source())
    assert stale == []


def test_help_shows_every_row_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # the meanings wrap
    for row in ENVIRONMENT:
        assert row.name in text
        if row.default != "unset":
            assert f"(default: {row.default})" in text, row.name
    assert "ATTNFORGE_WHEEL_SOURCES off: do not ask the known prebuilt-wheel sources" in text
    assert "ATTNFORGE_NET_BUDGET_S seconds one command may wait for the network" in text
