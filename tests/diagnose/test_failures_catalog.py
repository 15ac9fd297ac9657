"""The failure-signature data files: the packaged ones load, and a bad file reports every bad dotted path."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attnforge.catalog.failures import DATA_DIR, load_failures
from attnforge.errors import CatalogError


def test_packaged_signatures_load_with_sources() -> None:
    catalog = load_failures()
    assert len(catalog.signatures) >= 25
    assert all(s.sources and s.patterns and s.cause for s in catalog.signatures)
    assert len({s.id for s in catalog.signatures}) == len(catalog.signatures)


def _write(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(text, encoding="utf-8")


def test_a_bad_file_lists_every_problem_with_its_dotted_path(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "failures.toml",
        """
schema_version = 1
[signatures.bad]
title = "bad"
stage = "linking"
patterns = ['(unclosed', 'fine (?P<arch>x)']
when = ["torch-gpu"]
cause = "uses {arch} and {nope}"
fix = ["{also_nope"]
colour = "red"
""",
    )
    with pytest.raises(CatalogError) as info:
        load_failures(tmp_path)
    problems = "\n".join(info.value.problems)
    for expected in (
        "signatures.bad.stage: expected one of",
        "signatures.bad.patterns[0]: not a valid regex",
        "signatures.bad.when[0]: unknown condition 'torch-gpu'",
        "signatures.bad.cause: unknown placeholder {nope}",
        "signatures.bad.fix[0]: bad placeholder syntax",
        "signatures.bad.colour: unknown field",
        "signatures.bad.sources: missing",
    ):
        assert expected in problems
    assert "{arch}" not in problems, "a pattern group is a valid placeholder"


def test_extra_files_add_signatures_after_the_main_one_and_may_not_redefine(tmp_path: Path) -> None:
    shutil.copy(DATA_DIR / "failures.toml", tmp_path / "failures.toml")
    _write(
        tmp_path,
        "failures_windows.toml",
        """
schema_version = 1
[signatures.windows-only]
title = "w"
stage = "compile"
patterns = ['some windows error']
cause = "c"
fix = []
sources = ["a test"]
""",
    )
    catalog = load_failures(tmp_path)
    assert catalog.signatures[-1].id == "windows-only"
    assert catalog.signatures[-1].origin == "failures_windows.toml"

    _write(
        tmp_path,
        "failures_windows.toml",
        """
schema_version = 1
[signatures.out-of-memory]
title = "again"
stage = "compile"
patterns = ['x']
cause = "c"
fix = []
sources = ["a test"]
""",
    )
    with pytest.raises(CatalogError) as info:
        load_failures(tmp_path)
    assert "signatures.out-of-memory: already defined in failures.toml" in info.value.problems


def test_wrong_schema_version_is_reported(tmp_path: Path) -> None:
    _write(tmp_path, "failures.toml", "schema_version = 2\n[signatures]\n")
    with pytest.raises(CatalogError, match="bad field"):
        load_failures(tmp_path)
