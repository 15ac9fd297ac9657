"""The one error tree of attnforge.

Every error carries a ``message`` (what went wrong), a ``cause`` (why, when known) and a ``hint`` (what to do).
The CLI turns them into ``error:`` / ``hint:`` lines and an exit code; the library never prints.
"""

from __future__ import annotations


class AttnforgeError(Exception):
    """Base class of every error attnforge raises on purpose.

    Attributes:
        message: one sentence saying what went wrong.
        cause: why it went wrong, when known ("built for X, you have Y").
        hint: the next step for the user, ideally a command.
        exit_code: the CLI exit code: 1 when the thing asked for is not possible here, 2 for bad input.
    """

    exit_code: int = 1

    def __init__(self, message: str, *, cause: str | None = None, hint: str | None = None) -> None:
        # not super().__init__(message): torch.compile's Dynamo cannot trace that call ("Attempted to call a super()
        # attribute"), so a traced check could neither raise nor catch an attnforge error (torch 2.11-2.13); ``args``
        # (what pickling and repr read) set here instead, a message passed by keyword included
        self.args = (message,)
        self.message = message
        self.cause = cause
        self.hint = hint

    def __str__(self) -> str:
        parts = [self.message]
        if self.cause:
            parts.append(f"cause: {self.cause}")
        if self.hint:
            parts.append(f"hint: {self.hint}")
        return "\n".join(parts)


class UsageError(AttnforgeError):
    """Bad usage or bad input (an unknown backend, an unreadable snapshot file)."""

    exit_code = 2


class ProbeError(AttnforgeError):
    """Reading the machine failed in a way that leaves no usable snapshot (a bad snapshot file)."""

    exit_code = 2


class CatalogError(AttnforgeError):
    """A catalog data file is malformed; ``problems`` lists every bad dotted path."""

    exit_code = 2

    def __init__(
        self, message: str, *, problems: tuple[str, ...] = (), cause: str | None = None, hint: str | None = None
    ) -> None:
        super().__init__(message, cause=cause, hint=hint)
        self.problems = problems

    def __str__(self) -> str:
        return "\n".join([super().__str__(), *(f"  - {p}" for p in self.problems)])


class ResolveError(AttnforgeError):
    """Nothing viable for a request; the plan with every rejection reason is attached by the caller."""


class BuildError(AttnforgeError):
    """A source build failed; ``log_path`` points at the full log when there is one."""

    def __init__(
        self, message: str, *, log_path: str | None = None, cause: str | None = None, hint: str | None = None
    ) -> None:
        super().__init__(message, cause=cause, hint=hint)
        self.log_path = log_path


class CacheError(AttnforgeError):
    """The artifact store refused an operation (corrupt entry, hash mismatch, disk full)."""


class InstallError(AttnforgeError):
    """pip install of an artifact failed, or would have touched a package attnforge must not touch."""


class VerifyError(AttnforgeError):
    """A backend failed its native import or numerical check."""


class DispatchError(AttnforgeError):
    """``attention()`` could not serve a call (unknown or unsupported forced backend, bad shapes)."""

    exit_code = 2
