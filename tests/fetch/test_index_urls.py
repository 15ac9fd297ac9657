"""An ``--index-url`` that is not one is bad usage (exit 2 with a hint), refused before any network: never a
traceback (``http://[::1``), never three retries of a URL that names no host (``http://``)."""

from __future__ import annotations

from typing import Any

import pytest

from attnforge.errors import UsageError
from attnforge.fetch.http import HttpClient
from attnforge.fetch.indexes import check_index_url, list_wheels


def _no_network(req: Any, timeout_s: float) -> Any:
    raise AssertionError(f"a bad index URL reached the network: {req.full_url}")


@pytest.mark.parametrize(("url", "cause"), [
    pytest.param("http://[::1", "Invalid IPv6 URL", id="unbalanced-bracket"),
    pytest.param("https://[bad/simple", "Invalid IPv6 URL", id="bracket-in-host"),
    pytest.param("http://", "it names no host", id="no-host"),
    pytest.param("https:///simple", "it names no host", id="empty-host"),
    pytest.param("http://example.org:port/simple", "Port could not be cast", id="bad-port"),
    pytest.param("ftp://example.org", "unknown scheme 'ftp'", id="ftp"),
    pytest.param("example.org/simple", "it has no scheme", id="no-scheme"),
])
@pytest.mark.parametrize("offline", [True, False], ids=["offline", "online"])
def test_a_malformed_index_url_is_bad_usage_before_any_request(url: str, cause: str, offline: bool) -> None:
    with pytest.raises(UsageError) as info:
        list_wheels([], [url], ["flash-attn"], offline=offline, client=HttpClient(opener=_no_network))
    error = info.value
    assert error.exit_code == 2
    assert error.message == f"not an index URL: {url}"
    assert error.cause is not None and cause in error.cause
    assert error.hint is not None and "https://HOST/simple" in error.hint


def test_a_refused_url_never_shows_its_password() -> None:
    with pytest.raises(UsageError) as info:
        check_index_url("https://user:secret@[bad/simple")
    assert "secret" not in str(info.value)


@pytest.mark.parametrize(("url", "scheme"), [
    ("https://user:pw@example.org/simple", "https"),
    ("http://[::1]:8080/simple", "http"),
    ("file:///srv/simple", "file"),
])
def test_good_index_urls_pass(url: str, scheme: str) -> None:
    assert check_index_url(url) == scheme
