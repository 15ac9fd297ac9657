"""An sdist carried in a --find-links wheelhouse becomes the build's source (the offline path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnforge.fetch.indexes import find_sdist, with_local_sdist
from attnforge.resolve.types import Request, SourceKind, SourceSpec


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    for name in ("flash_attn-2.8.3.post2.tar.gz", "flash_attn-2.7.4.tar.gz",
                 "flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl", "xformers-0.0.35.zip", "not-an-sdist.tar.gz",
                 "README.txt"):
        (tmp_path / name).write_bytes(b"")
    return tmp_path


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param("", "flash_attn-2.8.3.post2.tar.gz", id="newest"),
        pytest.param("<2.8", "flash_attn-2.7.4.tar.gz", id="older-by-spec"),
        pytest.param("==2.8.3.post2", "flash_attn-2.8.3.post2.tar.gz", id="pinned"),
        pytest.param(">=3", None, id="none-fits"),
    ],
)
def test_find_sdist(wheelhouse: Path, spec: str, expected: str | None) -> None:
    found = find_sdist([str(wheelhouse)], ["flash-attn"], spec)
    assert (found.name if found else None) == expected


def test_request_takes_the_local_sdist_only_without_a_source_of_its_own(wheelhouse: Path) -> None:
    req = with_local_sdist(Request(backend="flash-attn", find_links=(str(wheelhouse),)), ["flash-attn"])
    assert req.source == SourceSpec(kind=SourceKind.PATH, location=str(wheelhouse / "flash_attn-2.8.3.post2.tar.gz"),
                                    version="2.8.3.post2")
    own = SourceSpec(kind=SourceKind.GIT, location="https://example.invalid/x.git")
    assert with_local_sdist(Request(backend="flash-attn", find_links=(str(wheelhouse),), source=own),
                            ["flash-attn"]).source == own
    assert with_local_sdist(Request(backend="flash-attn"), ["flash-attn"]).source is None
    assert find_sdist([str(wheelhouse / "missing")], ["flash-attn"]) is None
