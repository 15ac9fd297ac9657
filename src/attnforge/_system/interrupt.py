"""SIGTERM as an exception: a long command (a build, a bench) stopped by ``kill`` or a job scheduler's time limit
cleans up and keeps what it finished, as it does on Ctrl-C, instead of dying between two statements.

:class:`Interrupted` is a :class:`KeyboardInterrupt`, so ``except Exception`` skips it and the CLI reports it as it
does Ctrl-C: a message, no traceback, exit code ``128 + signum`` (143 for SIGTERM, 130 for Ctrl-C).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Interrupted(KeyboardInterrupt):
    """The command was stopped by a signal (SIGTERM); ``signum`` gives the exit code ``128 + signum``."""

    def __init__(self, message: str, *, signum: int = signal.SIGTERM) -> None:
        super().__init__(message)
        self.signum = int(signum)


def install_sigterm() -> object:
    """Make SIGTERM raise :class:`Interrupted` in the main thread; returns the previous handler for
    :func:`restore_sigterm` (None off the main thread, where Python cannot set handlers: a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: object) -> None:
        raise Interrupted(f"stopped by signal {signum}", signum=signum)

    return signal.signal(signal.SIGTERM, handler)


def restore_sigterm(previous: object) -> None:
    """Put back the handler :func:`install_sigterm` replaced."""
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)  # type: ignore[arg-type]


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Interrupted` (main thread only)."""
    previous = install_sigterm()
    try:
        yield
    finally:
        restore_sigterm(previous)
