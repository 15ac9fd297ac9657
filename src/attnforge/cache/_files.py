"""File primitives of the store: hashed copies, atomic writes, and the disk-full translation.

``copy_hashed`` is the seam through which every artifact byte is written, so tests can inject ``ENOSPC``
without filling a disk (``Store(copy_file=...)``).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from attnforge.errors import CacheError

_CHUNK_BYTES = 1 << 20

#: ``copy_file(src, dst) -> sha256 hex`` of the bytes written; must fsync ``dst`` before returning.
CopyFn = Callable[[Path, Path], str]

#: errno values that mean "no room left" (disk full, quota exceeded).
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open_nofollow(path) as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def copy_hashed(src: Path, dst: Path) -> str:
    """Copy ``src`` to a new file ``dst``, fsync it, and return the sha256 of what was written.

    ``dst`` is created exclusively (``O_EXCL``: an existing file or symlink there is an error) and ``src`` is
    opened with ``O_NOFOLLOW`` where the platform has it, so neither side follows a symlink.
    """
    digest = hashlib.sha256()
    with open_nofollow(src) as fin, dst.open("xb") as fout:
        while chunk := fin.read(_CHUNK_BYTES):
            digest.update(chunk)
            fout.write(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    return digest.hexdigest()


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


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (a no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_tree(path: Path) -> None:
    """Remove a directory tree if it exists; never raises for a missing path."""
    shutil.rmtree(path, ignore_errors=True)


def is_no_space(exc: BaseException) -> bool:
    """True for "disk full" from the OS or from SQLite."""
    if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
        return True
    return "database or disk is full" in str(exc)


def no_space_error(what: str, where: Path, exc: BaseException) -> CacheError:
    """The error raised when the cache's disk is full; nothing partial is left behind by the caller."""
    return CacheError(
        f"not enough disk space to {what}",
        cause=f"{where}: {exc}",
        hint="free space there, run `attnforge cache prune --max-size 20GB`, or point ATTNFORGE_HOME at a "
        "bigger disk",
    )
