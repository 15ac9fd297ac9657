"""The places the user named: ``--find-links`` directories and PEP 503 ``--index-url`` pages (parsed, listed
through the one HTTP client, skipped offline, a failure one problem line)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from attnforge._system.net import HostLookup
from attnforge.errors import UsageError
from attnforge.fetch.deadline import NetDeadline
from attnforge.fetch.http import HttpClient
from attnforge.fetch.indexes import list_find_links, list_index, list_wheels, parse_simple_page
from tests.resolve.conftest import WHEELS


def test_find_links_lists_only_wheels() -> None:
    names = [w.filename for w in list_find_links(str(WHEELS / "h200_flash_attn"))]
    assert len(names) == 5
    assert all(n.endswith(".whl") for n in names)


def test_missing_find_links_dir_is_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="find-links"):
        list_find_links(str(tmp_path / "nope"))


PAGE = """<!DOCTYPE html><html><body>
<a
href="../../files/flash_attn-2.8.3+cu13torch2.11cxx11abiTRUE-cp312-cp312-linux_x86_64.whl#sha256=abc123">flash_attn-2.8.3+cu13torch2.11cxx11abiTRUE-cp312-cp312-linux_x86_64.whl</a>
<a href="flash_attn-2.8.3.tar.gz">flash_attn-2.8.3.tar.gz</a>
</body></html>"""


def test_pep503_page() -> None:
    refs = parse_simple_page(PAGE, "https://example.org/simple/flash-attn/")
    assert len(refs) == 1
    assert refs[0].sha256 == "abc123"
    assert refs[0].url == (
        "https://example.org/files/flash_attn-2.8.3+cu13torch2.11cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"
    )


def test_file_index(tmp_path: Path) -> None:
    page_dir = tmp_path / "simple" / "flash-attn"
    page_dir.mkdir(parents=True)
    (page_dir / "index.html").write_text(PAGE)
    refs = list_index((tmp_path / "simple").as_uri(), "flash_attn")
    assert [r.sha256 for r in refs] == ["abc123"]


class _Page(io.BytesIO):
    status = 200
    headers: dict[str, str] = {}  # noqa: RUF012


def _client(opener: Any) -> HttpClient:
    return HttpClient(opener=opener, deadline=NetDeadline(hosts=HostLookup(lookup=lambda host: None)))


def test_offline_skips_http_and_fake_opener_is_used() -> None:
    calls: list[str] = []

    def opener(req: Any, timeout_s: float) -> io.BytesIO:
        calls.append(req.full_url)
        return _Page(PAGE.encode())

    offline = list_wheels([], ["https://example.org/simple"], ["flash-attn"], offline=True, client=_client(opener))
    assert offline.wheels == ()
    assert calls == []
    assert "--offline" in offline.problems[0]
    online = list_wheels(
        [], ["https://example.org/simple"], ["flash-attn", "flash_attn"], offline=False, client=_client(opener)
    )
    assert calls == ["https://example.org/simple/flash-attn/"]
    assert len(online.wheels) == 1


def test_unreachable_index_is_a_problem_not_a_crash() -> None:
    def opener(req: Any, timeout_s: float) -> io.BytesIO:
        raise OSError("connection reset")

    got = list_wheels([], ["https://example.org/simple"], ["flash-attn"], offline=False, client=_client(opener))
    assert got.wheels == ()
    assert "connection reset" in got.problems[0]


def test_bad_index_scheme() -> None:
    with pytest.raises(UsageError):
        list_wheels([], ["ftp://example.org"], ["flash-attn"], offline=False)
