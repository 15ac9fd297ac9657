"""The SQLite files of attnforge's state (``records.db``, ``cache.db``): opened read-only where they cannot be
written, and told apart from a damaged or foreign file before anything is read from or written into them.

The state directory may be a shared read-only team home, owned by another user, or damaged (a truncated or
garbled file, a directory where the file should be, another program's SQLite database), or shared with a newer
attnforge (a file at a schema this one does not know: :class:`NewerDatabaseError`, never damage). Both stores ask
the same questions here:

- :func:`file_problem`: is the path a regular file at all?
- :func:`schema_problem`: is an open database one of ours (its tables), and not a newer one (``PRAGMA
  user_version``)?
- :func:`sqlite_kind`: what does a ``sqlite3`` error mean (disk full, disk or permissions, locked, damaged)?
- :func:`reject_newer`: is the file a newer attnforge's (asked read-only, before any read-write open)?
- :func:`connect_read_only`: a connection that writes nothing, takes no lock and creates no file;
- :func:`connect_reading`: a reader's connection that still reads where a write would fail (a read-only home, a
  full disk);
- :func:`move_aside`: a damaged file renamed out of the way (never deleted), with its ``-wal``/``-shm``; never a
  newer one.

Facts: SQLite's URI parameters ``mode=ro`` and ``immutable=1`` (https://www.sqlite.org/uri.html); the error
texts are those of ``sqlite3_errstr`` (https://www.sqlite.org/rescode.html).
"""

from __future__ import annotations

import datetime as _dt
import errno
import os
import sqlite3
import stat
from collections.abc import Collection
from pathlib import Path
from urllib.parse import quote

from attnforge import __version__
from attnforge._compat import StrEnum
from attnforge.errors import CacheError

#: Phrases of SQLite errors that mean the disk (not the database) is the problem.
_DISK_PHRASES = ("database or disk is full", "disk i/o error", "unable to open database file")
_READ_ONLY_PHRASES = ("readonly", "read-only")
#: the sidecar files SQLite keeps next to a database (WAL mode, rollback journal)
SIDECARS = ("-wal", "-shm", "-journal")


class DamagedDatabaseError(CacheError):
    """A state database that is not a sound one of this attnforge (damaged, foreign, a directory): the CLI names
    the file and ``attnforge cache repair``; ``repair`` moves exactly these aside. A newer attnforge's file is
    not damage (:class:`NewerDatabaseError`)."""


#: the fix for a state database a newer attnforge wrote, said wherever it is met
NEWER_FIX = "upgrade attnforge (pip install -U attnforge) or use another ATTNFORGE_HOME"


class NewerDatabaseError(CacheError):
    """A state database written by a newer attnforge (its ``PRAGMA user_version`` above the one this attnforge
    knows): another release's data, not damage. This attnforge never moves it aside, writes, migrates or deletes
    it: ``cache repair`` leaves it in place, readers refuse it, the runtime serves as from an empty home. Not a
    :class:`DamagedDatabaseError`, so no ``except DamagedDatabaseError`` takes it for damage.

    Attributes:
        path: the file; found: its ``user_version``; known: the newest this attnforge reads.
    """

    path: Path | None = None
    found: int = 0
    known: int = 0

    @classmethod
    def of(cls, db: Path, *, found: int, known: int) -> NewerDatabaseError:
        """The error for ``db`` at schema ``found`` where this attnforge reads up to ``known``."""
        err = cls(f"{db} was written by a newer attnforge (schema {found}; this one reads up to {known})",
                  cause=f"attnforge {__version__} does not know that schema, so it leaves the file as it is "
                  "(moving it aside would lose the newer release's data)", hint=NEWER_FIX)
        err.path, err.found, err.known = db, found, known
        return err


class SqliteKind(StrEnum):
    """What a ``sqlite3`` error means for the user."""

    FULL = "full"  # no space left: free some
    DISK = "disk"  # I/O error, read-only mount, permissions, cannot open: the disk or the directory
    LOCKED = "locked"  # another process holds the database past the busy timeout
    DAMAGED = "damaged"  # not a database, malformed, an unexpected schema: move it aside and rebuild


def sqlite_kind(exc: BaseException) -> SqliteKind:
    """The meaning of a ``sqlite3.Error`` (or an ``OSError`` met while opening one)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return SqliteKind.FULL
    if isinstance(exc, OSError) and exc.errno in (errno.EIO, errno.EROFS, errno.EACCES, errno.EPERM):
        return SqliteKind.DISK
    text = str(exc).lower()
    if "database or disk is full" in text:
        return SqliteKind.FULL
    if "locked" in text or "busy" in text:
        return SqliteKind.LOCKED
    if any(p in text for p in (*_DISK_PHRASES, *_READ_ONLY_PHRASES)) or isinstance(exc, OSError):
        return SqliteKind.DISK
    return SqliteKind.DAMAGED


def file_problem(db: Path) -> str | None:
    """Why ``db`` cannot be a database file (a directory, a socket, a symlink loop, unreadable metadata), or None (a
    regular file, or nothing there yet)."""
    try:
        st = os.stat(db)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"it is a symlink loop ({exc.strerror})"
        return f"it cannot be read ({exc.strerror or exc})"
    if stat.S_ISDIR(st.st_mode):
        return "it is a directory, not a database file"
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    return None


def home_problem(db: Path) -> str | None:
    """Why the directory of ``db`` can never hold it (it, or a directory above it, is a file or a symlink loop, or
    cannot be reached), or None (it is a directory, or does not exist yet and can be created)."""
    for parent in db.parents:
        try:
            st = os.stat(parent)
        except (FileNotFoundError, NotADirectoryError):  # not there yet, or under a file (found further up)
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return f"{parent} is a symlink loop (its links point back at themselves: {exc.strerror})"
            return f"{parent} cannot be reached ({exc.strerror or exc})"
        return None if stat.S_ISDIR(st.st_mode) else f"{parent} is a file, not a directory"
    return None


def schema_problem(conn: sqlite3.Connection, db: Path, *, ours: Collection[str], version: int) -> str | None:
    """Why the database ``db`` open on ``conn`` is damage (another program's), or None; a newer attnforge's file
    is raised, never returned: it is not damage, and no caller may move it aside.

    Args:
        ours: the store's table names; a database with tables but none of these is another program's.
        version: the newest ``PRAGMA user_version`` this attnforge knows (0: files from before versions).

    Raises:
        NewerDatabaseError: its ``user_version`` is above ``version`` (checked first: nothing else is read).
        sqlite3.Error: the file is not a database or is malformed (the caller classifies it).
    """
    found = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if found > version:
        raise NewerDatabaseError.of(db, found=found, known=version)
    tables = sorted(str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
    tables = [t for t in tables if not t.startswith("sqlite_")]
    if tables and not set(tables) & set(ours):
        return f"it is not an attnforge database (its tables: {', '.join(tables[:6])})"
    return None


def lacking_columns(conn: sqlite3.Connection, schema: str, *, optional: frozenset[str] = frozenset()) -> list[str]:
    """``table.column`` of every column ``schema`` (its ``CREATE TABLE`` statements) gives a table that the database
    open on ``conn`` has without it (a table it lacks whole is not counted: a store creates its tables on its first
    write); ``optional``: columns a later version added, which an older file may lack. ``PRAGMA quick_check`` passes
    such a file, so ``cache repair`` kept a ``cache.db`` or ``records.db`` whose every read said "damaged, run cache
    repair" (CLI fuzz, 2026-12-03)."""
    model = sqlite3.connect(":memory:")
    try:
        model.executescript(schema)
        tables = [str(r[0]) for r in model.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        want = {t: [str(r[1]) for r in model.execute(f"PRAGMA table_info({t})")] for t in tables}
    finally:
        model.close()
    out: list[str] = []
    for table, columns in want.items():
        have = {str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")}
        if have:
            out += [f"{table}.{c}" for c in columns if c not in have and c not in optional]
    return out


def connect_read_only(db: Path, *, timeout_s: float = 60.0, immutable: bool = True) -> sqlite3.Connection:
    """A read-only connection that writes nothing.

    ``immutable`` (the default) takes no locks and creates no ``-shm``/``-wal`` file, so it works on a full disk
    and in any directory this user can read; it does not see a WAL that was never checkpointed (a writer
    checkpoints when its last connection closes, so only a writer running right now can be missed). Without
    it, ``mode=ro`` takes the shared lock, so a file another user is writing is read consistently; SQLite
    then needs the WAL index, and the first query fails where it cannot be opened: :func:`connect_shared`.
    """
    uri = f"file:{quote(str(db.resolve()))}?mode=ro" + ("&immutable=1" if immutable else "")
    conn = sqlite3.connect(uri, uri=True, timeout=timeout_s)
    conn.row_factory = sqlite3.Row
    return conn


def connect_shared(db: Path, *, timeout_s: float) -> sqlite3.Connection:
    """Read a database in a home this user cannot write (a team's shared home): ``mode=ro`` with locks where
    SQLite can open its WAL index there, else immutable (:func:`connect_read_only`)."""
    conn = connect_read_only(db, timeout_s=timeout_s, immutable=False)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as exc:
        conn.close()
        if sqlite_kind(exc) is SqliteKind.LOCKED:
            raise
        return connect_read_only(db, timeout_s=timeout_s)
    return conn


def reject_newer(db: Path, *, version: int) -> None:
    """Raise :class:`NewerDatabaseError` when ``db``'s ``PRAGMA user_version`` is above ``version``, read through a
    read-only connection (``mode=ro``) before any read-write open: a newer attnforge's file keeps its bytes and its
    ``-wal`` (the last read-write connection to close checkpoints the WAL into the file and deletes it; review,
    2026-12-02). Nothing there yet, or a file this open cannot read, is left to the caller's own open, which
    classifies it; the read-write check under the write lock stays the guard against a migration that races this one.

    Raises:
        NewerDatabaseError: the file is a newer attnforge's.
    """
    if not db.is_file():
        return
    # with no -wal the file holds everything: read it immutable (no lock, no sidecar made); with one, the version
    # may be in it, so mode=ro, which reads the WAL (SQLite may make the -shm index: it holds no data)
    wal = db.with_name(db.name + "-wal").exists()
    try:
        conn = connect_read_only(db, immutable=not wal)
        try:
            found = int(conn.execute("PRAGMA user_version").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return
    if found > version:
        raise NewerDatabaseError.of(db, found=found, known=version)


def connect_reading(db: Path, *, timeout_s: float) -> sqlite3.Connection:
    """A reader's connection to an existing ``db`` that works wherever the file can be read: a normal one where this
    user may write it (it sees a running writer's WAL), else :func:`connect_shared`; a normal open that the disk
    refuses (no room for the ``-shm`` file on a full disk, an I/O error, a sidecar that cannot be opened) is read
    immutable instead (:func:`connect_read_only`). A damaged or locked file still raises.

    Raises:
        sqlite3.Error: the file is not a database, is locked past ``timeout_s``, or cannot be read at all.
    """
    if not can_write(db):
        return connect_shared(db, timeout_s=timeout_s)
    conn = sqlite3.connect(db, timeout=timeout_s)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # opens the WAL index now
    except sqlite3.OperationalError as exc:
        conn.close()
        if sqlite_kind(exc) not in (SqliteKind.DISK, SqliteKind.FULL):
            raise
        return connect_read_only(db, timeout_s=timeout_s)
    return conn


def can_write(db: Path) -> bool:
    """True when this user may write ``db`` and create its sidecars (the directory is writable too)."""
    folder = db.parent
    if not (folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)):
        return False
    return not db.exists() or os.access(db, os.R_OK | os.W_OK)


def move_aside(db: Path, now_s: float) -> Path:
    """Rename a damaged ``db`` (and its sidecars) to ``<name>.damaged-<UTC time>``; returns the new path.

    Nothing is deleted: the file can still be inspected or handed to ``sqlite3 .recover``.

    Raises:
        OSError: the rename failed (read-only directory, another owner).
    """
    stamp = _dt.datetime.fromtimestamp(now_s, tz=_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    dest = db.with_name(f"{db.name}.damaged-{stamp}")
    n = 1
    while dest.exists():
        n += 1
        dest = db.with_name(f"{db.name}.damaged-{stamp}-{n}")
    os.replace(db, dest)
    for suffix in SIDECARS:
        side = db.with_name(db.name + suffix)
        if side.exists():
            os.replace(side, dest.with_name(dest.name + suffix))
    return dest
