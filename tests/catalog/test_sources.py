"""Catalog sources cite documents in the repository or URLs (issue 32): the research notes the catalog's facts come
from live in ``docs/research/``, and every repository path a source names exists."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "src" / "attnforge" / "catalog" / "data"
_REPO_PATH = re.compile(r"(?<![\w/.:-])((?:docs|tests|src|scripts)/[\w./-]*\w)")
_RESEARCH = re.compile(r"(?<![\w/-])(?:install-anchors|runtime-anchors|toolchain-facts)\b")


def _sources(node: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("sources", "source") and not isinstance(value, dict):
                for text in value if isinstance(value, list) else [value]:
                    if isinstance(text, str):
                        yield f"{where}.{key}", text
            else:
                yield from _sources(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _sources(value, f"{where}[{i}]")


def _all() -> list[tuple[str, str]]:
    return [row for f in sorted(DATA.glob("*.toml")) for row in _sources(tomllib.loads(f.read_text("utf-8")), f.name)]


def test_the_checker_reads_sources() -> None:
    rows = _all()
    assert len(rows) > 200
    assert any("docs/research/install-anchors.md" in text for _, text in rows)


def test_no_source_cites_a_file_outside_the_repository() -> None:
    """No ``shared/...`` (the research workspace, not shipped) and no research note by its bare name: the notes are
    ``docs/research/*.md``, in the data files' comments too (their "§" and "KB-nn" conventions name them)."""
    bad = [f"{where}: {text}" for where, text in _all() if "shared/" in text or _RESEARCH.search(text)]
    assert not bad, "\n".join(bad)
    comments = [f"{f.name}: {line.strip()}" for f in sorted(DATA.glob("*.toml"))
                for line in f.read_text("utf-8").splitlines() if line.lstrip().startswith("#") and "shared/" in line]
    assert not comments, "\n".join(comments)


def test_every_repository_path_a_source_names_exists() -> None:
    missing = [f"{where}: {path}" for where, text in _all() for path in _REPO_PATH.findall(text)
               if not (ROOT / path.rstrip(".")).exists()]
    assert not missing, "\n".join(missing)
