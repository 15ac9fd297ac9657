"""The one HTTP client of attnforge: every request it makes itself goes through :class:`HttpClient`.

Wheel listings (GitHub API, PEP 503 pages, ``--index-url`` pages), wheel and sdist downloads, and the fleet's
index server (pages and uploads) all use it, so they share:

- **proxies** as pip reads them (``https_proxy``/``http_proxy``/``no_proxy``, either case, read at the time of
  the request: :func:`attnforge._system.net.proxy_for`);
- **the command's network deadline** (:mod:`attnforge.fetch.deadline`): one budget of waiting for the whole
  command, a host or proxy that timed out or refused remembered as dead, a "waiting for ..." line after 2 s;
- **a name lookup with a deadline** in front of every request (:class:`attnforge._system.net.HostLookup`);
- **retries** with exponential backoff for what may pass (HTTP 5xx, a reset connection), never for a timeout,
  a refusal or a 4xx;
- **basic auth** from the URL's ``user:password@`` or from the caller (the fleet's ``ATTNFORGE_INDEX_USER``);
  credentials never appear in a message (:func:`shown`).

Failures are :class:`FetchError` (one line); each caller turns it into its own stage's error or a plan note.
"""

from __future__ import annotations

import base64
import datetime as _dt
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from attnforge._system.net import first_hop, proxy_for
from attnforge.fetch.deadline import DeadlineError, NetDeadline, current_deadline

USER_AGENT = "attnforge (+https://github.com/attnforge)"


class FetchError(Exception):
    """A request failed; ``str()`` is one line (the URL without credentials and the cause)."""


class HttpStatusError(FetchError):
    """The server answered with an HTTP error status (``code``, ``headers``)."""

    def __init__(self, message: str, *, code: int, headers: Mapping[str, str]) -> None:
        super().__init__(message)
        self.code = code
        self.headers = dict(headers)


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """A whole answer: status, body, headers (a 304 has an empty body)."""

    status: int
    body: bytes
    headers: Mapping[str, str]


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


class _NoCredentialsAcrossHosts(urllib.request.HTTPRedirectHandler):
    """Follows redirects, but drops ``Authorization`` when one leads to another host (as pip and requests do):
    an index's password or a GitHub token is never sent to the storage host a file redirects to."""

    def redirect_request(  # noqa: PLR0917 - urllib calls it with these six positional arguments
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


def open_url(req: urllib.request.Request, timeout: float) -> Any:
    """urllib's opener with the proxies the environment has now (``urlopen`` keeps the ones of its first call)
    and no credentials carried across hosts on a redirect."""
    return urllib.request.build_opener(_NoCredentialsAcrossHosts).open(req, timeout=timeout)


def basic_auth(user: str, password: str) -> str:
    """The ``Authorization`` header value of HTTP basic auth."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def split_credentials(url: str) -> tuple[str, str | None]:
    """(``url`` without ``user:password@``, the basic auth header they make or None)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return url, None
    netloc = parts.netloc.rsplit("@", 1)[1]
    user, password = urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), basic_auth(user, password)


def shown(url: str) -> str:
    """``url`` as a message may show it: without credentials."""
    return split_credentials(url)[0]


def _close(response: object) -> None:
    close = getattr(response, "close", None)
    if callable(close):
        close()


@dataclass(slots=True, kw_only=True)
class HttpClient:
    """GET (or POST) under the command's deadline, with retries; ``opener`` and ``sleep`` are seams for tests.

    Attributes:
        deadline: the command's budget, dead places and waiting notice (default: :func:`current_deadline`).
        answer_timeout_s: how long one attempt may wait for an answer (less when less budget is left).
        read_timeout_s: the socket timeout while a body streams (a download stalled that long fails).
        retries: attempts for what may pass on a second try (HTTP 5xx, a reset connection).
        backoff_s: the first pause between attempts, doubled each time.
        opener: ``(urllib Request, timeout_s) -> response`` (urllib's, with the environment's proxies).
    """

    deadline: NetDeadline = field(default_factory=current_deadline)
    answer_timeout_s: float = 10.0
    read_timeout_s: float = 30.0
    retries: int = 3
    backoff_s: float = 0.5
    sleep: Callable[[float], None] = time.sleep
    opener: Callable[[urllib.request.Request, float], Any] = open_url

    def get(self, url: str, headers: Mapping[str, str] | None = None, *, token: bool = False) -> Answer:
        """The whole answer to a GET; a 304 is returned, not raised.

        Raises:
            FetchError: the deadline, a dead host or proxy, a rate limit (its reset time), an HTTP error other
                than 304 (:class:`HttpStatusError`), or the network failed ``retries`` times.
        """
        try:
            answer = self._send(url, headers=headers, read=True)
        except HttpStatusError as exc:
            if exc.code == 304:
                return Answer(status=304, body=b"", headers=exc.headers)
            limited = rate_limit_message(exc.code, exc.headers, shown(url), token=token)
            if limited:
                raise FetchError(limited) from None
            raise
        assert isinstance(answer, Answer)  # noqa: S101 - read=True
        return answer

    def open(
        self, url: str, *, headers: Mapping[str, str] | None = None, data: bytes | None = None,
        auth: str | None = None, bounded: bool = True,
    ) -> Any:
        """The response to a GET (a POST of ``data``) once its headers arrived; the caller reads the body
        (a context manager, each read bounded by :attr:`read_timeout_s`).

        ``bounded=False`` (an upload, whose answer comes only after the whole body was sent) waits without
        drawing on the budget, bounded by :attr:`read_timeout_s` per socket operation; dead places still apply.

        Raises:
            FetchError: as :meth:`get` (the HTTP status as :class:`HttpStatusError`).
        """
        return self._send(url, headers=headers, data=data, auth=auth, bounded=bounded, read=False)

    def _send(
        self, url: str, *, headers: Mapping[str, str] | None, read: bool, data: bytes | None = None,
        auth: str | None = None, bounded: bool = True,
    ) -> Any:
        target, url_auth = split_credentials(url)
        scheme = urllib.parse.urlsplit(target).scheme
        if scheme not in ("http", "https", "file"):
            raise FetchError(f"{target!r} is not an http(s):// or file: URL")
        all_headers = {"User-Agent": USER_AGENT, **(headers or {})}
        if auth or url_auth:
            all_headers["Authorization"] = auth or url_auth or ""
        req = urllib.request.Request(target, data=data, headers=all_headers,  # noqa: S310 - scheme checked
                                     method="POST" if data is not None else "GET")
        if scheme == "file":
            return self._attempt(req, read=read, what=target, bounded=False)
        place = self._check_place(target, bounded=bounded)
        last = ""
        for attempt in range(self.retries):
            if attempt:
                pause_s = min(self.backoff_s * 2 ** (attempt - 1), self.deadline.remaining_s())
                self.sleep(pause_s)
                self.deadline.charge(pause_s)
            if bounded and self.deadline.remaining_s() <= 0:
                raise FetchError(f"{target}: not asked; {self.deadline.spent_line()}" +
                                 (f" (before that: {last})" if last else ""))
            cut_by_budget = self.deadline.remaining_s() < self.answer_timeout_s
            try:
                return self._attempt(req, read=read, what=_what(target), bounded=bounded)
            except DeadlineError as exc:
                if cut_by_budget:  # the place may be fine: the command has no time left to wait for it
                    raise FetchError(f"{exc}; {self.deadline.spent_line()}") from None
                raise FetchError(self._dead(target, place, str(exc), "did not answer")) from None
            except HttpStatusError as exc:
                if exc.code < 500:
                    raise
                last = str(exc)
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", None) or exc
                if isinstance(reason, (ConnectionRefusedError, TimeoutError)):
                    verb = "refused the connection" if isinstance(reason, ConnectionRefusedError) else "timed out"
                    raise FetchError(self._dead(target, place, f"{_what(target)}: {reason}", verb)) from None
                last = f"{target}: {reason}"
        raise FetchError(f"{last} (after {self.retries} attempts)")

    def _check_place(self, target: str, *, bounded: bool) -> str:
        """The first hop of ``target`` once it is known alive and its name resolves (else FetchError)."""
        place = first_hop(target)
        dead = self.deadline.dead(place)
        if dead is not None:
            raise FetchError(f"{target}: not asked: {dead}")
        if bounded and self.deadline.remaining_s() <= 0:
            raise FetchError(f"{target}: not asked; {self.deadline.spent_line()}")
        start = time.monotonic()
        problem = self.deadline.hosts.problem(target, timeout_s=self.deadline.remaining_s() if bounded else None)
        if bounded:
            self.deadline.charge(time.monotonic() - start)
        if problem is not None:
            raise FetchError(problem)
        return place

    def _attempt(self, req: urllib.request.Request, *, read: bool, what: str, bounded: bool) -> Any:
        def work() -> Any:
            try:
                resp = self.opener(req, self.read_timeout_s)
            except urllib.error.HTTPError as exc:
                hdrs = dict(exc.headers.items()) if exc.headers else {}
                exc.close()
                raise HttpStatusError(f"HTTP {exc.code} {exc.reason} from {req.full_url}", code=exc.code,
                                      headers=hdrs) from None
            if not read:
                return resp
            with resp:
                return Answer(status=int(resp.status or 200), body=resp.read(),  # a file: answer has none
                              headers=dict(resp.headers.items()))

        if not bounded:
            return work()
        return self.deadline.wait_for(what, work, timeout_s=self.answer_timeout_s, abandon=_close)

    def _dead(self, target: str, place: str, cause: str, verb: str) -> str:
        """Remember ``place`` as dead for the command; the line that says so."""
        kind = "the proxy " if proxy_for(target) is not None else ""
        self.deadline.mark_dead(place, f"{kind}{place} {verb} earlier in this command")
        return f"{cause}; {kind}{place} is not asked again in this command"


def _what(target: str) -> str:
    proxy = proxy_for(target)
    return f"{target} (through the proxy {first_hop(target)})" if proxy else target
