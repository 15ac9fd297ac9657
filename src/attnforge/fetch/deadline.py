"""One network deadline per command: a budget of seconds shared by every request, the places that are dead.

``plan flash-attn`` behind a proxy that accepts connections and never answers once took 275 s (a 30 s socket
timeout x 3 attempts x 3 wheel sources, the dead proxy never remembered, nothing said). Now every request of a
command draws on one :class:`NetDeadline`:

- a **budget** (``ATTNFORGE_NET_BUDGET_S``, default 20 s): the seconds the command may spend waiting for
  answers (name lookups, connections, response headers, listing bodies; a download's body, once it flows, is
  not charged). When it is spent, further requests fail at once and the callers fall back (cached listings
  with their age, a source build);
- **dead places**: a host or proxy (``host:port`` of the first hop) that timed out or refused the connection
  is not asked again by the same command;
- a **waiting notice**: after 2 s without an answer, ``on_wait`` gets one line saying what is waited for (the
  CLI prints it on stderr; the library never prints).

The CLI opens one per command (:func:`command_deadline`); library code takes :func:`current_deadline`, which
outside a command is a fresh deadline per call.
"""

from __future__ import annotations

import contextvars
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from attnforge._system.net import HostLookup, first_hop
from attnforge.errors import UsageError

#: The variable that sets the budget, and its default (seconds).
BUDGET_VARIABLE = "ATTNFORGE_NET_BUDGET_S"
DEFAULT_BUDGET_S = 20.0
#: After this many seconds without an answer, ``on_wait`` says what is waited for.
NOTICE_AFTER_S = 2.0

T = TypeVar("T")


class DeadlineError(Exception):
    """No answer within the time allowed; ``str()`` is one line naming the place and the wait."""


def budget_from(environ: Mapping[str, str]) -> float:
    """The budget ``ATTNFORGE_NET_BUDGET_S`` sets (seconds, ``0`` = no network wait at all), else the default.

    Raises:
        UsageError: the value is not a finite number >= 0.
    """
    text = environ.get(BUDGET_VARIABLE, "").strip()
    if not text:
        return DEFAULT_BUDGET_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{BUDGET_VARIABLE}={text!r} is not a number of seconds",
                         hint=f"set it to seconds >= 0 (default {DEFAULT_BUDGET_S:g}), or unset it")
    return value


@dataclass(slots=True, kw_only=True)
class NetDeadline:
    """The network budget of one command (see the module docstring). Thread-safe.

    Attributes:
        budget_s: seconds of waiting allowed in all (the command's requests together).
        on_wait: gets one line per request still unanswered after ``notice_after_s``.
        notice_after_s: seconds before that line.
        hosts: the name lookups of this command (a host that did not answer is not asked again).
    """

    budget_s: float = DEFAULT_BUDGET_S
    on_wait: Callable[[str], None] | None = None
    notice_after_s: float = NOTICE_AFTER_S
    hosts: HostLookup = field(default_factory=HostLookup)
    clock: Callable[[], float] = time.monotonic
    _spent_s: float = 0.0
    _dead: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def remaining_s(self) -> float:
        with self._lock:
            return max(0.0, self.budget_s - self._spent_s)

    def charge(self, seconds: float) -> None:
        """Count ``seconds`` of waiting against the budget."""
        with self._lock:
            self._spent_s += max(0.0, seconds)

    def spent_line(self) -> str:
        return (f"the network budget of this command ({self.budget_s:g} s, {BUDGET_VARIABLE}) is spent")

    def dead(self, place: str) -> str | None:
        """Why ``place`` (``host:port``) is not asked again in this command, or None."""
        with self._lock:
            return self._dead.get(place)

    def dead_for(self, url: str) -> str | None:
        """Why a request for ``url`` would not be made (its host or proxy is dead in this command), or None.

        For a client other than attnforge's own (pip) that would wait for the same dead proxy.
        """
        return self.dead(first_hop(url))

    def mark_dead(self, place: str, why: str) -> None:
        if place:
            with self._lock:
                self._dead.setdefault(place, why)

    def wait_for(self, what: str, work: Callable[[], T], *, timeout_s: float,
                 abandon: Callable[[T], None] | None = None) -> T:
        """``work()`` run in a daemon thread, waited for at most ``timeout_s`` and what is left of the budget.

        The wait is charged to the budget. After :attr:`notice_after_s`, :attr:`on_wait` gets "waiting for
        {what} ...". A result that arrives after the wait was given up is passed to ``abandon`` (to close it).

        Raises:
            DeadlineError: no result in time (the thread is left to its own socket timeout).
            BaseException: whatever ``work()`` raised.
        """
        limit_s = max(0.0, min(timeout_s, self.remaining_s()))
        box: list[tuple[bool, object]] = []
        gave_up = threading.Event()
        lock = threading.Lock()

        def run() -> None:
            try:
                outcome: tuple[bool, object] = (True, work())
            except BaseException as exc:  # handed to the waiting thread
                outcome = (False, exc)
            with lock:
                box.append(outcome)
                late = gave_up.is_set()
            if late and outcome[0] and abandon is not None:
                abandon(outcome[1])  # type: ignore[arg-type]

        start = self.clock()
        thread = threading.Thread(target=run, name=f"net {what}", daemon=True)
        thread.start()
        try:
            first_s = min(limit_s, self.notice_after_s)
            thread.join(first_s)
            if thread.is_alive() and limit_s > first_s:
                if self.on_wait is not None:
                    self.on_wait(f"waiting for {what}: up to {limit_s - first_s:.0f} s more of the "
                                 f"{self.budget_s:g} s network budget ({BUDGET_VARIABLE})")
                thread.join(limit_s - first_s)
        finally:
            self.charge(self.clock() - start)
        with lock:
            if not box:
                gave_up.set()
                raise DeadlineError(f"no answer from {what} within {round(limit_s, 1):g} s")
        ok, value = box[0]
        if not ok:
            raise value  # type: ignore[misc]
        return value  # type: ignore[return-value]


_CURRENT: contextvars.ContextVar[NetDeadline | None] = contextvars.ContextVar("attnforge_net_deadline",
                                                                              default=None)


def current_deadline(environ: Mapping[str, str] | None = None) -> NetDeadline:
    """The deadline of the command running now; outside one, a fresh deadline (budget from the environment)."""
    found = _CURRENT.get()
    if found is not None:
        return found
    return NetDeadline(budget_s=budget_from(os.environ if environ is None else environ))


@contextmanager
def command_deadline(deadline: NetDeadline) -> Iterator[NetDeadline]:
    """Make ``deadline`` the one every request inside the ``with`` block draws on (one command)."""
    token = _CURRENT.set(deadline)
    try:
        yield deadline
    finally:
        _CURRENT.reset(token)
