"""Files: reading (and resolving) one the user named (a path that cannot be read is bad input, not a crash), and
writing and reading state safely in directories others may share (atomic, exclusive temp files, no symlink followed):
the store (:mod:`attnforge.cache`) and the probe memo (:mod:`attnforge.probe.memo`) use the same primitives."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO

from attnforge.errors import CacheError, UsageError

#: the most :func:`read_user_file` reads: a model config or a lock file is kilobytes (a Cargo.lock of a large
#: workspace ~1 MB); ``/dev/zero`` given for one was read until memory ran out (CLI fuzz, 2026-12-03)
MAX_USER_FILE_BYTES = 64 << 20


def read_user_file(path: Path, *, what: str, hint: str, limit_bytes: int = MAX_USER_FILE_BYTES) -> str:
    """The text of ``path`` (UTF-8), at most ``limit_bytes`` of it.

    Args:
        path: the file the user gave.
        what: how the message names it (``"the model config"``), followed by the path.
        hint: what the user can do instead.
        limit_bytes: a longer file (or an endless one: a device, a FIFO) is refused.

    Raises:
        UsageError: the file is missing or cannot be read (the OS's reason is the cause), is not UTF-8 text, or is
            longer than ``limit_bytes``.
    """
    try:
        with path.open("rb") as f:
            data = f.read(limit_bytes + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}", cause=exc.strerror, hint=hint) from None
    if len(data) > limit_bytes:
        raise UsageError(f"cannot read {what} {path}: it is longer than {limit_bytes >> 20} MiB", hint=hint)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"cannot read {what} {path}", cause=not_utf8(exc), hint=hint) from None


def resolve_user_path(path: Path, *, what: str, hint: str) -> Path:
    """``path`` made absolute with its links followed (``Path.resolve()``).

    Raises:
        UsageError: ``path`` or a folder above it is a symlink loop (``resolve()`` raises ``RuntimeError`` for one
            on Python 3.11-3.12 and ``OSError`` on 3.13; both surfaced as internal errors of ``cache export`` and
            ``--source`` until a CLI fuzz found them, 2026-12-03), or cannot be resolved at all.
    """
    try:
        return path.expanduser().resolve()
    except RuntimeError:
        raise UsageError(f"cannot use {what} {path}: it is a symlink loop",
                         cause="its links point back at themselves", hint=hint) from None
    except OSError as exc:
        raise UsageError(f"cannot use {what} {path}", cause=exc.strerror, hint=hint) from None


def not_utf8(exc: UnicodeDecodeError) -> str:
    """Why a file is not text (the cause of every "not UTF-8" error): the first byte that is not UTF-8, and where."""
    return f"it is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a fresh temp file next to ``path``, fsync, then ``os.replace`` it into place.

    The temp file has an unpredictable name and is created exclusively (``mkstemp``: ``O_CREAT | O_EXCL``,
    which never follows a symlink), so another user who can write to the directory cannot redirect the write
    by planting a symlink; ``os.replace`` then swaps the name itself, never what a symlink there points to.
    """
    refuse_symlinked_dir(path.parent)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; an index is meant to be read by the web server
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def refuse_symlinked_dir(path: Path) -> None:
    """Raise :class:`CacheError` when ``path`` is a symlink (checked with ``lstat``) or not a directory.

    Writers call it on each directory of a shared tree they create files in, so a symlink planted there by
    someone else cannot make them write elsewhere.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise CacheError(
            f"refusing to write into {path}: it is {'a symlink' if stat.S_ISLNK(st.st_mode) else 'not a directory'}",
            cause="a shared directory whose entries others can replace could redirect the write",
            hint="remove it (or choose a directory only you can write to) and run the command again",
        )


def open_nofollow(path: Path) -> BinaryIO:
    """Open a regular file for reading without following a symlink (``OSError`` ``ELOOP`` if it is one)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
