"""The store's SQLite connections: read-only when the state dir cannot be written, errors as CacheError.

Readers never need to write anything: not a lock file, not the WAL's ``-shm`` file, not the schema. That is
what lets ``cache list``, ``export`` and installs from the cache work from a read-only ``ATTNFORGE_HOME``
(a team's shared cache) and lets ``cache list/prune/rm`` run on a full disk, where they are the remedy.

- A writable root opens ``cache.db`` normally (WAL; the schema is created by the first writer).
- A root that cannot be written, or a normal open that fails for lack of space or I/O, opens it as
  ``file:...?mode=ro&immutable=1``: SQLite then takes no locks and creates no files. (An immutable reader
  does not see a WAL that was never checkpointed; a writer checkpoints when its last connection closes, so
  only a writer that is running right now can be missed.)

Every ``sqlite3`` error is turned into :class:`CacheError` with what to do (:func:`db_error`), so a damaged
or full database never shows a traceback; a damaged, foreign or empty ``cache.db`` while artifacts are on disk
is a :class:`~attnforge._system.statedb.DamagedDatabaseError` whose hint is ``attnforge cache repair``
(:func:`damaged_db`).
"""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
from pathlib import Path

from attnforge._system.statedb import DamagedDatabaseError, SqliteKind, sqlite_kind
from attnforge._system.statedb import connect_read_only as connect_read_only  # noqa: PLC0414 - the store's readers
from attnforge.errors import CacheError

#: Phrases of SQLite errors that mean the disk (not the database) is the problem.
_DISK_PHRASES = ("database or disk is full", "disk i/o error", "unable to open database file")


def check_root(root: Path, *, write: bool) -> None:
    """Raise :class:`CacheError` when ``root`` cannot serve as the state directory (for reading or writing).

    A missing root is fine for readers (an empty cache); writers create it.
    """
    try:
        st = os.stat(root)
    except FileNotFoundError:
        if not write:
            return
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise unusable_root(root, f"it cannot be created: {exc.strerror or exc}") from None
        return
    except OSError as exc:
        raise unusable_root(root, f"it cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        err = unusable_root(root, "it is a file, not a directory")
        err.exit_code = 2  # ATTNFORGE_HOME names a file: bad input, not a limit of this machine
        raise err
    if write and not os.access(root, os.W_OK | os.X_OK):
        raise unusable_root(root, "this user cannot write to it (read-only mount or another owner)",
                            readonly=True)


def unusable_root(root: Path, why: str, *, readonly: bool = False) -> CacheError:
    extra = " (listing, exporting and installing from it still work)" if readonly else ""
    return CacheError(
        f"the attnforge state directory {root} cannot be used for this{extra}",
        cause=why,
        hint="point ATTNFORGE_HOME at a directory you can write to (e.g. `export ATTNFORGE_HOME=$HOME/.af`)",
    )


def writable(root: Path) -> bool:
    return root.is_dir() and os.access(root, os.W_OK | os.X_OK)


def is_disk_problem(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS):
        return True
    text = str(exc).lower()
    return any(p in text for p in _DISK_PHRASES)


def db_error(exc: sqlite3.Error, db: Path, doing: str) -> CacheError:
    """The user-facing error for a SQLite failure while ``doing`` something with ``db``."""
    text = str(exc)
    if "database or disk is full" in text.lower() or (isinstance(exc, OSError) and exc.errno == errno.ENOSPC):
        return CacheError(
            f"not enough disk space to {doing}",
            cause=f"{db}: {text}",
            hint="free space there (`attnforge cache prune --max-size 20GB` works on a full disk), or point "
            "ATTNFORGE_HOME at a bigger disk",
        )
    if is_disk_problem(exc) or "readonly" in text.lower() or "read-only" in text.lower():
        return CacheError(
            f"the cache database could not be written or read to {doing}",
            cause=f"{db}: {text}",
            hint="check the disk under it (free space, `dmesg` for I/O errors, a read-only mount); "
            "`attnforge cache list` still reads a read-only cache",
        )
    if sqlite_kind(exc) is SqliteKind.LOCKED:
        return CacheError(f"the cache database is locked; could not {doing}", cause=f"{db}: {text}",
                          hint="another attnforge process is writing it; retry when it has finished")
    return damaged_db(db, f"{type(exc).__name__}: {text} ({doing} failed)")


def damaged_db(db: Path, why: str) -> DamagedDatabaseError:
    """The error for a ``cache.db`` that is damaged, foreign, or has no index of the artifacts on disk."""
    return DamagedDatabaseError(
        f"the cache database {db} is damaged",
        cause=why,
        hint="the artifacts themselves are intact: `attnforge cache repair` (run by the home's owner where it is "
        "read-only to you) moves the database aside and indexes every artifact whose key and sha256 still check "
        "out (no rebuild)",
    )


def os_error_as_cache_error(exc: OSError) -> CacheError | None:
    """The user-facing error for "no space left", "quota exceeded" or "read-only file system" from anywhere
    (the CLI's last line of defence: a log, an index page or a temp file written on a full disk); None for
    any other OSError."""
    where = exc.filename or "a file attnforge was writing"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return CacheError(
            "not enough disk space to finish", cause=f"{where}: {exc.strerror}",
            hint="free space there (`attnforge cache prune --max-size 20GB` works on a full disk), or point "
            "ATTNFORGE_HOME (or the export directory) at a bigger disk",
        )
    if exc.errno == errno.EROFS:
        return CacheError(
            "a file could not be written: the file system is read-only", cause=f"{where}: {exc.strerror}",
            hint="point ATTNFORGE_HOME (or the export directory) at a writable disk",
        )
    return None
