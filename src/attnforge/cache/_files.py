"""File primitives of the store: hashed copies and the disk-full translation (atomic writes and no-follow
reads are :mod:`attnforge._system.files`', re-exported here for the store's modules).

``copy_hashed`` is the seam through which every artifact byte is written, so tests can inject ``ENOSPC``
without filling a disk (``Store(copy_file=...)``).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from attnforge._system.files import open_nofollow
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

