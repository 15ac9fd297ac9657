"""HTTP GET with retries, rate-limit messages and a conditional-request cache of what was fetched.

urllib reads ``https_proxy``/``http_proxy``/``no_proxy`` from the environment by itself. A cached answer is
kept with its fetch time and ETag under ``$ATTNFORGE_HOME/listings/``; the next fetch sends
``If-None-Match`` and a 304 reuses it; offline or on a network failure the cached answer is used and its age
is said.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnforge._system.net import HostLookup, lookup_host

USER_AGENT = "attnforge (+https://github.com/attnforge)"


class FetchError(Exception):
    """A listing could not be fetched; ``str()`` is one line for the plan."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Response:
    body: bytes
    headers: Mapping[str, str]
    fetched_at: str  # ISO 8601, UTC
    from_cache: bool = False


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


def rate_limit_message(code: int, headers: Mapping[str, str], url: str, *, token: bool) -> str | None:
    """The line for a GitHub rate limit (403 with no requests left, or 429), else None."""
    remaining = headers.get("X-RateLimit-Remaining") or headers.get("x-ratelimit-remaining")
    if code != 429 and not (code == 403 and remaining == "0"):
        return None
    reset = headers.get("X-RateLimit-Reset") or headers.get("x-ratelimit-reset")
    when = "later"
    if reset and reset.isdigit():
        when = "at " + _dt.datetime.fromtimestamp(int(reset), _dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    hint = "" if token else "; set GITHUB_TOKEN to a token for 5000 requests/hour instead of 60"
    return f"GitHub API rate limit reached (HTTP {code}) for {url}; it resets {when}{hint}"


def open_url(req: urllib.request.Request, timeout: float) -> Any:
    """``urlopen`` with the proxies the environment has now (``urlopen`` keeps the ones of its first call)."""
    return urllib.request.build_opener().open(req, timeout=timeout)


@dataclass(slots=True, kw_only=True)
class Fetcher:
    """GET with ``retries`` attempts and exponential backoff; ``opener``, ``sleep`` and ``lookup`` (the name
    lookup, ``socket.getaddrinfo``) are seams for tests.

    A host name is looked up first, with a deadline of ``lookup_timeout_s`` (:class:`attnforge._system.net.
    HostLookup`): a resolver that never answers (a machine with no network) costs that once per host, not the
    C library's retries inside every attempt, and a host that did not answer is not asked again by this fetcher.
    """

    timeout_s: float = 30.0
    retries: int = 3
    backoff_s: float = 0.5
    lookup_timeout_s: float = 3.0
    sleep: Callable[[float], None] = time.sleep
    opener: Callable[..., object] = open_url
    lookup: Callable[[str], object] = lookup_host
    _hosts: HostLookup | None = None

    def _check_host(self, url: str) -> None:
        if self._hosts is None:
            self._hosts = HostLookup(timeout_s=self.lookup_timeout_s, lookup=self.lookup)
        problem = self._hosts.problem(url)
        if problem is not None:
            raise FetchError(problem)

    def get(
        self, url: str, headers: Mapping[str, str] | None = None, *, token: bool = False
    ) -> tuple[int, bytes, dict[str, str]]:
        """(status, body, headers); 304 is returned, not raised.

        Raises:
            FetchError: the host has no address within ``lookup_timeout_s``, rate limited, an HTTP error other
                than 304, or the network failed ``retries`` times.
        """
        self._check_host(url)
        req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(headers or {})})  # noqa: S310
        last = ""
        for attempt in range(self.retries):
            if attempt:
                self.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                with self.opener(req, timeout=self.timeout_s) as resp:  # type: ignore[attr-defined]
                    return int(resp.status), resp.read(), dict(resp.headers.items())
            except urllib.error.HTTPError as exc:
                hdrs = dict(exc.headers.items()) if exc.headers else {}
                exc.close()
                if exc.code == 304:
                    return 304, b"", hdrs
                limited = rate_limit_message(exc.code, hdrs, url, token=token)
                if limited:
                    raise FetchError(limited) from None
                last = f"HTTP {exc.code} {exc.reason} from {url}"
                if exc.code < 500:
                    raise FetchError(last) from None
            except (urllib.error.URLError, OSError) as exc:
                last = f"{url}: {getattr(exc, 'reason', None) or exc}"
        raise FetchError(f"{last} (after {self.retries} attempts)")


@dataclass(slots=True, kw_only=True)
class ListingCache:
    """Fetched listings under ``root`` (one JSON file per URL: fetch time, ETag, body)."""

    root: Path

    def _file(self, key: str) -> Path:
        return self.root / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"

    def load(self, key: str) -> dict[str, object] | None:
        try:
            doc = json.loads(self._file(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) and doc.get("key") == key else None

    def save(self, key: str, *, body: object, etag: str | None, fetched_at: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self._file(key).with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": key, "fetched_at": fetched_at, "etag": etag, "body": body}), encoding="utf-8")
        tmp.replace(self._file(key))
