"""The OS side of reaching a host: which proxy the environment names for a URL, and a host name lookup with a
deadline (the guard in front of every HTTP request of :class:`attnforge.fetch.http.HttpClient`).

Proxies are read as urllib and pip read them (``https_proxy``/``http_proxy``/``no_proxy``, either case,
``urllib.request.getproxies`` and ``proxy_bypass``), at the time of the request.

On a machine with no network whose DNS resolver never answers (a lent GPU machine), ``getaddrinfo`` blocks for
the C library's whole retry schedule inside every attempt, and no socket timeout covers it: ``plan`` once spent
21 s that way. :class:`HostLookup` asks in a daemon thread, waits ``timeout_s``, and remembers a host that did
not answer, so the rest of the command does not wait for it again.
"""

from __future__ import annotations

import socket
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field

from attnforge._system.urls import url_problem


def lookup_host(host: str) -> object:
    """The addresses of ``host`` (``socket.getaddrinfo``): the real lookup :class:`HostLookup` guards."""
    return socket.getaddrinfo(host, None)


def proxy_for(url: str) -> str | None:
    """The proxy URL the environment names for ``url`` (None: direct, or its host is in ``no_proxy``)."""
    import urllib.request  # only when a request is made: the CLI starts without it

    parts = urllib.parse.urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or not parts.hostname or urllib.request.proxy_bypass(parts.hostname):
        return None
    proxy = proxy if "://" in proxy else f"http://{proxy}"
    problem = url_problem(proxy)  # HTTPS_PROXY=http://[::1 raised ValueError from every request until 2026-12-03
    if problem is not None:
        from attnforge.errors import UsageError

        variable = f"{parts.scheme.upper()}_PROXY"
        raise UsageError(f"the proxy {variable} names is not a URL: {proxy[:80]!r}", cause=problem,
                         hint=f"set {variable} to a proxy URL such as http://proxy.example:3128, or unset it")
    return proxy


def first_hop(url: str) -> str:
    """``host:port`` that a request for ``url`` connects to: its proxy when it has one, else its own host.

    This is what is remembered as dead when it does not answer (``""`` for a URL without a host).
    """
    parts = urllib.parse.urlsplit(proxy_for(url) or url)
    if not parts.hostname:
        return ""
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.hostname}:{port or (443 if parts.scheme == 'https' else 80)}"


@dataclass(slots=True, kw_only=True)
class HostLookup:
    """Checks that the host of a URL (or of the proxy that serves it) has an address within ``timeout_s``.

    Attributes:
        timeout_s: how long one lookup may take, in seconds.
        lookup: the name lookup (``socket.getaddrinfo``); tests pass one that blocks.
    """

    timeout_s: float = 3.0
    lookup: Callable[[str], object] = lookup_host
    _unreachable: dict[str, str] = field(default_factory=dict)

    def problem(self, url: str, *, timeout_s: float | None = None) -> str | None:
        """Why the host of ``url`` cannot be reached (no answer in time, or no such name), else None.

        ``timeout_s`` (at most :attr:`timeout_s`) is what is left of the caller's own deadline.
        """
        parts = urllib.parse.urlsplit(url)
        host = urllib.parse.urlsplit(proxy_for(url) or url).hostname
        if not host or parts.scheme not in ("http", "https"):
            return None
        if host in self._unreachable:
            return self._unreachable[host]
        wait_s = self.timeout_s if timeout_s is None else max(0.0, min(self.timeout_s, timeout_s))
        outcome: list[BaseException | None] = []

        def ask() -> None:
            try:
                self.lookup(host)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=ask, name=f"lookup {host}", daemon=True)
        thread.start()
        thread.join(wait_s)
        if not outcome:
            why = (f"{host}: no answer to the name lookup within {wait_s:g} s (no network or DNS?); "
                   "the source is unreachable")
            if wait_s < self.timeout_s:  # the caller's deadline cut it short: not proof the host is dead
                return why
        elif isinstance(outcome[0], OSError):
            why = f"{host}: the name does not resolve ({outcome[0]}); the source is unreachable"
        else:
            return None
        self._unreachable[host] = why
        return why
