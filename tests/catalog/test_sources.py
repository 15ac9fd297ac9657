"""Catalog sources cite documents in the repository or URLs (issue 32): the research notes the catalog's facts come
from live in ``docs/research/``, every source names a repository path or a URL, and every repository path a source
names exists. attnforge's own estimates and choices cite ``docs/research/own-figures.md``."""

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
_URL = re.compile(r"\bhttps?://[\w.-]+\.[a-z]{2,}\S*")
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


def test_every_source_names_a_repository_document_or_a_url() -> None:
    """A bare ``KB-01``, ``§3.2``, ``owner/repo#12`` or "estimate" is not a citation a reader can open: each source
    names a file of this repository (``docs/research/install-anchors.md §10 KB-01``) or a URL."""
    bare = [f"{where}: {text}" for where, text in _all() if not _URL.search(text) and not _REPO_PATH.search(text)]
    assert not bare, f"{len(bare)} sources cite neither a repository file nor a URL:\n" + "\n".join(bare)


def test_the_citation_checker_tells_a_citation_from_free_text() -> None:
    for cited in ("docs/research/toolchain-facts.md §1.1", "https://github.com/Dao-AILab/flash-attention/issues/948"):
        assert _URL.search(cited) or _REPO_PATH.search(cited)
    for free in ("KB-01", "§3.2 (CUDA release notes)", "Dao-AILab/flash-attention#948", "estimate, not measured",
                 "torch/utils/cpp_extension.py", "developer.nvidia.com/cuda-gpus"):
        assert not _URL.search(free) and not _REPO_PATH.search(free), free
