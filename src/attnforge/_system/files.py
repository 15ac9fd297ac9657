"""Reading a file the user named on the command line: a path that cannot be read is bad input, not a crash."""

from __future__ import annotations

from pathlib import Path

from attnforge.errors import UsageError


def read_user_file(path: Path, *, what: str, hint: str) -> str:
    """The text of ``path`` (UTF-8).

    Args:
        path: the file the user gave.
        what: how the message names it (``"the model config"``), followed by the path.
        hint: what the user can do instead.

    Raises:
        UsageError: the file is missing or cannot be read (the OS's reason is the cause).
    """
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}", cause=exc.strerror, hint=hint) from None
