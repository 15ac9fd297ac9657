"""List the prebuilt wheels every known source publishes for one backend.

GitHub releases come from the REST API, ``GET {GITHUB_API_URL}/repos/{owner}/{repo}/releases?per_page=100``,
following the ``Link: <...>; rel="next"`` header, with ``Authorization: Bearer $GITHUB_TOKEN`` when set. PEP 503
pages are read with :func:`attnforge.fetch.indexes.parse_simple_page`. Every request goes through
:class:`attnforge.fetch.http.HttpClient` (one per listing, so the sources share the command's deadline and its
dead hosts). Each listing is cached with its fetch time and ETag under ``$ATTNFORGE_HOME/listings/``
(:class:`ListingCache`): the next fetch sends ``If-None-Match`` and a 304 reuses it; offline, unreachable or out
of network budget the cached listing is used and its age is said. A source that cannot be listed is one line
in the plan and never fails it.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from attnforge import _serde
from attnforge._system.files import write_atomic
from attnforge._system.urls import url_problem
from attnforge.fetch.http import FetchError, HttpClient
from attnforge.fetch.indexes import Listing, parse_simple_page
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.sources import (
    SourceKind,
    WheelSource,
    WheelSources,
    index_url,
    wheels_from_releases,
    with_implied,
)
from attnforge.resolve.types import WheelRef

GITHUB_API = "https://api.github.com"
_NEXT = re.compile(r'<([^>]+)>\s*;\s*rel="next"')
MAX_PAGES = 20


def list_sources(
    backend: str,
    snapshot: SystemSnapshot,
    ws: WheelSources,
    *,
    home: Path,
    offline: bool,
    environ: Mapping[str, str] | None = None,
    fetcher: HttpClient | None = None,
) -> Listing:
    """Wheels of ``backend`` from every source that serves it, and one line per source that gave none."""
    env = os.environ if environ is None else environ
    fetcher = fetcher or HttpClient()
    cache = ListingCache(root=home / "listings")
    wheels: list[WheelRef] = []
    problems: list[str] = []
    for source in ws.for_backend(backend):
        try:
            got, note = _list_one(source, snapshot, cache=cache, offline=offline, env=env, fetcher=fetcher)
        except FetchError as exc:
            problems.append(f"wheel source {source.id}: {exc}; skipped")
            continue
        wheels.extend(got)
        if note:
            problems.append(f"wheel source {source.id}: {note}")
    return Listing(wheels=tuple(wheels), problems=tuple(problems))


def _list_one(
    source: WheelSource,
    snapshot: SystemSnapshot,
    *,
    cache: ListingCache,
    offline: bool,
    env: Mapping[str, str],
    fetcher: HttpClient,
) -> tuple[list[WheelRef], str | None]:
    if source.kind is SourceKind.GITHUB_RELEASES:
        url = f"{github_api(env)}/repos/{source.repo}/releases?per_page=100"
        token = env.get("GITHUB_TOKEN") or None
        body, fetched_at, note = _cached(url, cache, offline, lambda etag: _github_pages(url, etag, token, fetcher))
        releases = body if isinstance(body, list) else []
        return wheels_from_releases(releases, source, listed_at=fetched_at), note
    base = index_url(source, snapshot)
    if base is None:
        return [], "torch here has no CUDA, so there is no per-CUDA index to read"
    page_url = base
    if source.kind is SourceKind.PEP503:
        page_url = f"{base.rstrip('/')}/{canonicalize_name(source.distributions[0])}/"
    body, fetched_at, note = _cached(page_url, cache, offline, lambda etag: _page(page_url, etag, fetcher))
    refs = parse_simple_page(str(body or ""), page_url)
    wanted = {canonicalize_name(d) for d in source.distributions}
    refs = [r for r in refs if canonicalize_name(r.filename.split("-", 1)[0]) in wanted]
    return with_implied(refs, source, snapshot, fetched_at), note


def _cached(url: str, cache: ListingCache, offline: bool, fetch: Any) -> tuple[object, str, str | None]:
    """(body, fetch time, note) from the network, or from the cache when offline, unchanged or unreachable."""
    old = cache.load(url)
    if offline:
        if old is None:
            raise FetchError("--offline and no listing was ever fetched")
        at = str(old["fetched_at"])
        return old["body"], at, f"--offline: used the listing fetched {at} ({age_text(at)})"
    try:
        status, body, etag = fetch(old.get("etag") if old else None)
    except FetchError as exc:
        if old is None:
            raise
        at = str(old["fetched_at"])
        return old["body"], at, f"{exc}; used the listing fetched {at} ({age_text(at)})"
    if status == 304 and old is not None:
        at = now_iso()
        cache.save(url, body=old["body"], etag=etag or old.get("etag"), fetched_at=at)  # type: ignore[arg-type]
        return old["body"], at, None
    at = now_iso()
    cache.save(url, body=body, etag=etag, fetched_at=at)
    return body, at, None


def github_api(env: Mapping[str, str]) -> str:
    """The GitHub API base (``GITHUB_API_URL``, else api.github.com), without a trailing slash.

    Raises:
        FetchError: ``GITHUB_API_URL`` is not an http(s) URL (the source is skipped with that line).
    """
    api = (env.get("GITHUB_API_URL") or GITHUB_API).rstrip("/")
    if url_problem(api, ("http", "https")) is not None:
        raise FetchError(f"GITHUB_API_URL={api!r} is not an http(s):// URL (e.g. https://api.github.com, or "
                         "https://HOST/api/v3 for GitHub Enterprise)")
    return api


def _github_pages(url: str, etag: str | None, token: str | None, fetcher: HttpClient,
                  ) -> tuple[int, list[Any], str | None]:
    headers = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    first = dict(headers, **({"If-None-Match": etag} if etag else {}))
    answer = fetcher.get(url, first, token=bool(token))
    status, body, hdrs = answer.status, answer.body, answer.headers
    if status == 304:
        return 304, [], etag
    new_etag = hdrs.get("ETag") or hdrs.get("etag")
    releases: list[Any] = []
    for page in range(MAX_PAGES):
        try:
            doc = _serde.loads(body)
        except ValueError:
            raise FetchError(f"{url}: the answer is not JSON") from None
        if not isinstance(doc, list):
            raise FetchError(f"{url}: expected a list of releases, got {type(doc).__name__}")
        releases.extend(doc)
        m = _NEXT.search(hdrs.get("Link") or hdrs.get("link") or "")
        if m is None or page == MAX_PAGES - 1:
            break
        answer = fetcher.get(m.group(1), headers, token=bool(token))
        body, hdrs = answer.body, answer.headers
    return 200, releases, new_etag


def _page(url: str, etag: str | None, fetcher: HttpClient) -> tuple[int, str, str | None]:
    answer = fetcher.get(url, {"If-None-Match": etag} if etag else None)
    if answer.status == 304:
        return 304, "", etag
    return 200, answer.body.decode("utf-8", errors="replace"), answer.headers.get("ETag") or answer.headers.get("etag")


def wheel_sources_on(environ: Mapping[str, str]) -> bool:
    """Whether ``ATTNFORGE_WHEEL_SOURCES`` lets attnforge ask the known prebuilt-wheel sources.

    Raises:
        UsageError: any other value (``disabled`` and ``false`` were read as on until 2026-12-03: a CLI fuzz).
    """
    from attnforge._system.switches import OFF, ON

    text = environ.get("ATTNFORGE_WHEEL_SOURCES", "").strip().lower()
    if text in OFF:
        return False
    if not text or text in ON:  # unset or empty: on
        return True
    from attnforge.errors import UsageError

    raise UsageError(f"ATTNFORGE_WHEEL_SOURCES={environ['ATTNFORGE_WHEEL_SOURCES']!r} is neither on nor off",
                     hint="set it to off (or 0, false, no) to skip the prebuilt-wheel sources, or unset it")


def known_source_wheels(
    backend: str,
    snapshot: SystemSnapshot,
    *,
    offline: bool,
    from_source: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Listing:
    """:func:`list_sources` as the CLI calls it: off with ``ATTNFORGE_WHEEL_SOURCES=off`` or ``--from-source``."""
    from attnforge._system.paths import home_dir
    from attnforge.resolve.sources import load_wheel_sources

    env = os.environ if environ is None else environ
    if from_source or not wheel_sources_on(env):
        return Listing(wheels=())
    ws = load_wheel_sources()
    extra = env.get("ATTNFORGE_EXTRA_WHEEL_SOURCES")
    if extra:  # a team's own sources: added to the shipped ones, an equal id replaces the shipped entry
        from dataclasses import replace

        ws = replace(ws, sources={**ws.sources, **load_wheel_sources(extra).sources})
    return list_sources(backend, snapshot, ws, home=home_dir(env), offline=offline, environ=env)


def merged(*listings: Listing) -> Listing:
    return Listing(
        wheels=tuple(w for li in listings for w in li.wheels),
        problems=tuple(p for li in listings for p in li.problems),
    )


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def age_text(fetched_at: str, now: _dt.datetime | None = None) -> str:
    """``"3 h old"``, ``"2 days old"`` for an ISO time."""
    try:
        then = _dt.datetime.fromisoformat(fetched_at)
    except ValueError:
        return "of unknown age"
    secs = max(0.0, ((now or _dt.datetime.now(_dt.timezone.utc)) - then).total_seconds())
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if secs >= size:
            return f"{secs / size:.0f} {unit} old"
    return f"{secs:.0f} s old"


@dataclass(slots=True, kw_only=True)
class ListingCache:
    """Fetched listings under ``root`` (one JSON file per URL: fetch time, ETag, body)."""

    root: Path

    def _file(self, key: str) -> Path:
        return self.root / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"

    def load(self, key: str) -> dict[str, object] | None:
        try:
            doc = _serde.loads(self._file(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) and doc.get("key") == key else None

    def save(self, key: str, *, body: object, etag: str | None, fetched_at: str) -> None:
        """Keep a fetched listing for offline and unreachable use. Best effort: a home that cannot be written (a
        shared read-only one) keeps nothing, and the listing just fetched is used all the same."""
        doc = json.dumps({"key": key, "fetched_at": fetched_at, "etag": etag, "body": body}).encode("utf-8")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            write_atomic(self._file(key), doc)  # a fresh temp name: two commands saving at once do not collide
        except OSError:
            return
