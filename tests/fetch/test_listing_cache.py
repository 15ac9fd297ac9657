"""The listing cache keeps what was fetched for offline use, and never fails a command over it."""

from __future__ import annotations

from pathlib import Path

from attnforge.fetch.listings import ListingCache


def test_a_saved_listing_loads_back(tmp_path: Path) -> None:
    cache = ListingCache(root=tmp_path / "listings")
    cache.save("https://example.invalid/simple/x/", body="<a>x</a>", etag='"e1"', fetched_at="2026-11-26T16:00:00Z")
    doc = cache.load("https://example.invalid/simple/x/")
    assert doc is not None and (doc["body"], doc["etag"]) == ("<a>x</a>", '"e1"')
    assert [p.suffix for p in (tmp_path / "listings").iterdir()] == [".json"]  # no temp file left behind


def test_a_home_that_cannot_keep_listings_keeps_none_and_raises_nothing(tmp_path: Path) -> None:
    """A shared read-only home (here the cache folder is a file, which stops root too): the listing just fetched
    is used anyway; nothing is kept."""
    blocked = tmp_path / "listings"
    blocked.write_text("not a folder", encoding="utf-8")
    cache = ListingCache(root=blocked)
    cache.save("https://example.invalid/simple/x/", body="b", etag=None, fetched_at="2026-11-26T16:00:00Z")
    assert cache.load("https://example.invalid/simple/x/") is None
