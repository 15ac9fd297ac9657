"""A host name lookup with a deadline, the guard in front of every HTTP request attnforge makes itself.

On a machine with no network whose DNS resolver never answers (a lent GPU machine), ``getaddrinfo`` blocks for
the C library's whole retry schedule inside every attempt, and no socket timeout covers it: ``plan`` once spent
21 s that way. :class:`HostLookup` asks in a daemon thread, waits ``timeout_s``, and remembers a host that did
not answer, so the rest of the run does not wait for it again.
"""

from __future__ import annotations

import socket
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field


def lookup_host(host: str) -> object:
    """The addresses of ``host`` (``socket.getaddrinfo``): the real lookup :class:`HostLookup` guards."""
    return socket.getaddrinfo(host, None)


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

    def problem(self, url: str) -> str | None:
        """Why the host of ``url`` cannot be reached (no answer in time, or no such name), else None."""
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
        proxy = urllib.request.getproxies().get(parts.scheme)
        if host and proxy and not urllib.request.proxy_bypass(host):
            host = urllib.parse.urlsplit(proxy).hostname
        if not host or parts.scheme not in ("http", "https"):
            return None
        if host in self._unreachable:
            return self._unreachable[host]
        outcome: list[BaseException | None] = []

        def ask() -> None:
            try:
                self.lookup(host)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=ask, name=f"lookup {host}", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if not outcome:
            why = (f"{host}: no answer to the name lookup within {self.timeout_s:g} s (no network or DNS?); "
                   "the source is unreachable")
        elif isinstance(outcome[0], OSError):
            why = f"{host}: the name does not resolve ({outcome[0]}); the source is unreachable"
        else:
            return None
        self._unreachable[host] = why
        return why
