"""The base of :class:`~attnforge.cache.store.Store`: its paths, its writer lock and its SQLite connections.

Writers take ``ROOT/cache.lock`` and a normal (WAL) connection; readers take no lock and create nothing, and
open the database read-only and immutable where the root cannot be written or has no room left (see
``_db.py``). Every SQLite error leaves here as a :class:`CacheError` with a hint.

Every first connection checks that ``cache.db`` is the index of what lies on disk (:meth:`StoreBase.
check_index`): a directory in its place, garbage, another program's database, or a missing or empty index
while entries lie in ``ROOT/artifacts`` is a damaged database (hint: ``attnforge cache repair``), never an
empty store. So ``cache list`` does not show an empty store, ``install`` does not rebuild what is on disk,
and no writer treats the unindexed entries as debris to delete. One a newer attnforge wrote is not damage: readers
and writers alike refuse it with the upgrade as the fix, and nothing here changes it.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import filelock

from attnforge._system.statedb import (
    DamagedDatabaseError,
    connect_reading,
    connect_shared,
    file_problem,
    reject_newer,
    schema_problem,
)
from attnforge.cache._db import check_root, connect_read_only, damaged_db, db_error, writable
from attnforge.cache._files import CopyFn, copy_hashed
from attnforge.errors import CacheError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS artifacts (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    version TEXT NOT NULL,
    filename TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    inputs TEXT NOT NULL,
    provenance TEXT NOT NULL,
    has_log INTEGER NOT NULL,
    created_at REAL NOT NULL,
    last_used_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS artifacts_name ON artifacts(name);
"""
#: ``PRAGMA user_version`` of cache.db (never set so far: 0); a newer one is refused, never moved aside or written
SCHEMA_VERSION = 0
#: the index's schema, public for ``cache repair`` (a file whose tables lack a column of it is damage)
INDEX_SCHEMA = _SCHEMA
#: The table as a connection-private, empty stand-in (readers never write the database).
_EMPTY_TABLE = _SCHEMA.split(";", maxsplit=1)[0].replace("CREATE TABLE IF NOT EXISTS", "CREATE TEMP TABLE")


class StoreBase:
    """The store's root, its writer lock and its SQLite connections (the rest is :class:`Store`).

    Args:
        root: the cache root (tests pass a ``tmp_path``; the CLI passes ``home_dir(os.environ)``).
        clock: Unix time in seconds (injected so ``prune`` can be tested).
        copy_file: writes one artifact file and returns its sha256 (the seam for disk-full tests).
        lock_timeout_s: how long a writer waits for another writer before giving up.
    """

    def __init__(
        self,
        root: Path,
        *,
        clock: Callable[[], float] = time.time,
        copy_file: CopyFn = copy_hashed,
        lock_timeout_s: float = 900.0,
    ) -> None:
        self.root = Path(root)
        self._clock = clock
        self._copy_file = copy_file
        self._lock_timeout_s = lock_timeout_s
        self._schema_ready = False
        self._lock: filelock.FileLock | None = None

    @property
    def db_path(self) -> Path:
        return self.root / "cache.db"

    @property
    def artifacts_dir(self) -> Path:
        return self.root / "artifacts"

    @property
    def quarantine_dir(self) -> Path:
        return self.root / "quarantine"

    # -- locking and the database ---------------------------------------------------------------------------

    def now(self) -> float:
        """The store's clock: Unix time in seconds (injected in tests)."""
        return self._clock()

    @contextmanager
    def writer(self) -> Iterator[None]:
        """The writer lock (``ROOT/cache.lock``), re-entrant within this process; every change happens under it.

        Raises:
            CacheError: another process held it past ``lock_timeout_s``, or the lock file cannot be created.
        """
        check_root(self.root, write=True)
        self._check_lock_file()
        if self._lock is None:  # one instance per store: re-entrant within this process
            self._lock = filelock.FileLock(str(self.root / "cache.lock"), timeout=self._lock_timeout_s)
        try:
            with self._lock:
                yield
        except filelock.Timeout:
            raise CacheError(
                f"another attnforge process has held the cache lock for over {self._lock_timeout_s:.0f} s",
                cause=f"lock file {self.root / 'cache.lock'}",
                hint="wait for the other build or install to finish, then retry",
            ) from None
        except OSError as exc:
            if exc.filename is None or "cache.lock" not in str(exc.filename):
                raise
            raise CacheError(
                f"cannot take the cache's writer lock {self.root / 'cache.lock'}",
                cause=str(exc), hint="make it writable by you, or point ATTNFORGE_HOME elsewhere",
            ) from None

    def _check_lock_file(self) -> None:
        """A ``cache.lock`` that is not a regular file (a directory, a socket) is named with the fix."""
        lock = self.root / "cache.lock"
        try:
            st = os.lstat(lock)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise CacheError(f"cannot read the cache's writer lock {lock}", cause=exc.strerror or str(exc),
                             hint="make it readable by you, or point ATTNFORGE_HOME elsewhere") from None
        if not stat.S_ISREG(st.st_mode):
            what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise CacheError(f"the cache's writer lock {lock} is {what}", cause="something other than attnforge "
                             "created it; attnforge keeps an empty regular file there",
                             hint=f"remove it (`rm -r {lock}`; nothing is stored in it) and run the command again")

    @contextmanager
    def job_lock(self, name: str) -> Iterator[None]:
        """Serialise one job (e.g. "build flash-attn 2.8.3 for this machine") across processes.

        Concurrent installs take it around *look up, else build and put*, so the second process finds the
        first one's entry instead of building again.
        """
        check_root(self.root, write=True)
        locks = self.root / "locks"
        digest = hashlib.sha256(name.encode()).hexdigest()[:32]
        try:
            locks.mkdir(parents=True, exist_ok=True)
            lock = filelock.FileLock(str(locks / f"{digest}.lock"), timeout=-1)
            lock.acquire()
        except OSError as exc:
            raise CacheError(f"cannot take the job lock in {locks}", cause=exc.strerror or str(exc),
                             hint=f"{locks} must be a directory you can write to: remove what is there") from None
        try:
            yield
        finally:
            lock.release()

    def _connect(self) -> sqlite3.Connection:
        check_root(self.root, write=True)
        if not self._schema_ready:
            self._check_db_file()
            reject_newer(self.db_path, version=SCHEMA_VERSION)  # before a read-write open could checkpoint its WAL
        conn = sqlite3.connect(self.db_path, timeout=60.0)
        conn.row_factory = sqlite3.Row
        if not self._schema_ready:
            try:
                with self.writer():
                    self.check_index(conn)
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.executescript(_SCHEMA)
            except BaseException:
                conn.close()
                raise
            self._schema_ready = True
        return conn

    def new_index_locked(self) -> None:
        """Create ``cache.db`` with its (empty) table where there is none; the caller holds :meth:`writer`
        (``repair``, after moving a damaged one aside)."""
        try:
            conn = sqlite3.connect(self.db_path, timeout=60.0)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(_SCHEMA)
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise db_error(exc, self.db_path, "create a new cache database") from None
        self._schema_ready = True

    def _check_db_file(self) -> None:
        problem = file_problem(self.db_path)
        if problem is not None:
            raise damaged_db(self.db_path, problem)
        for folder in (self.artifacts_dir, self.quarantine_dir):
            if folder.exists() and not folder.is_dir():
                raise CacheError(f"the cache's {folder.name} directory {folder} is not a directory",
                                 cause="something other than attnforge put a file there",
                                 hint=f"move it aside (`mv {folder} {folder}.bad`) and run the command again")

    def entry_dirs(self) -> list[Path]:
        """The entry directories on disk (``ROOT/artifacts/<64 hex digits>``), whether ``cache.db`` has their
        rows or not (staging directories are not entries)."""
        if not self.artifacts_dir.is_dir():
            return []
        hexdigits = set("0123456789abcdef")
        return sorted(d for d in self.artifacts_dir.iterdir()
                      if len(d.name) == 64 and set(d.name) <= hexdigits and d.is_dir() and not d.is_symlink())

    def check_index(self, conn: sqlite3.Connection) -> bool:
        """Whether ``cache.db`` open on ``conn`` has its table (False: a new, empty store).

        A damaged index is refused, not repaired on the fly: readers (``cache list``, ``plan``, ``install``'s
        look-up) take no lock and may sit in a home that is read-only to them, and a repair moves files and
        quarantines what fails its checks, which is a change to ask for (``attnforge cache repair``), not a
        side effect of a look-up. So ``install`` stops with that hint instead of rebuilding what is on disk.

        Raises:
            NewerDatabaseError: a newer attnforge wrote it (no reader or writer here uses it; nothing is moved).
            DamagedDatabaseError: it is another program's database, or it has no index (a missing, empty or
                foreign file) while entries lie on disk.
            sqlite3.Error: it is not a database at all (the caller turns it into :func:`db_error`).
        """
        # the entries on disk counted first: an entry appears only once the table exists (Store.put), so entries
        # seen before the table was looked for mean a table is missing; counted after, a reader (no lock) could
        # count the first entry a writer made since it looked ("no table of entries while 1 artifacts lie" in
        # eight concurrent installs into a fresh home, 2026-12-01)
        on_disk = sum(1 for d in self.entry_dirs() if (d / "provenance.json").is_file())  # debris has none
        problem = schema_problem(conn, self.db_path, ours=("artifacts",), version=SCHEMA_VERSION)
        if problem is not None:
            raise damaged_db(self.db_path, problem)
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'artifacts'").fetchone() is not None:
            return True
        if on_disk:
            state = "has no table of entries" if self.db_path.exists() else "is missing"
            raise damaged_db(self.db_path, f"it {state} while {on_disk} artifacts lie in {self.artifacts_dir}")
        return False

    @contextmanager
    def _db(self, doing: str = "update the cache", *, raw: bool = False) -> Iterator[sqlite3.Connection]:
        """A writer's connection (one transaction); SQLite errors become :class:`CacheError` unless ``raw``."""
        check_root(self.root, write=True)
        try:
            conn = self._connect()
            try:
                with conn:
                    yield conn
            finally:
                conn.close()
        except sqlite3.Error as exc:
            if raw:
                raise
            raise db_error(exc, self.db_path, doing) from None

    def drop_row(self, key: str) -> None:
        """Delete the row of ``key`` (for a caller holding :meth:`writer` that moves the entry's files itself)."""
        with self._db("drop a damaged row") as conn:
            conn.execute("DELETE FROM artifacts WHERE key = ?", (key,))

    @contextmanager
    def reader(self, doing: str = "read the cache") -> Iterator[sqlite3.Connection]:
        """A reader's connection: creates nothing, and works on a read-only or full disk (see ``_db.py``)."""
        check_root(self.root, write=False)
        self._check_db_file()
        try:
            conn, empty = self._reading_connection()
            try:
                try:
                    ready = self.check_index(conn)
                except DamagedDatabaseError:
                    if not (empty and self.db_path.exists()):
                        raise
                    # a writer made cache.db, its table and a first entry since this reader found no file (it takes
                    # no lock): the file is read after all, and the entry is not taken for one without a table
                    conn.close()
                    conn, _ = self._reading_connection()
                    ready = self.check_index(conn)
                if not ready:
                    conn.execute(_EMPTY_TABLE)  # a new store, or a writer created the file but not yet its table
                yield conn
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise db_error(exc, self.db_path, doing) from None

    def _reading_connection(self) -> tuple[sqlite3.Connection, bool]:
        """A connection for :meth:`reader`, and whether it is an empty in-memory one (no ``cache.db`` yet)."""
        if not self.db_path.exists():
            conn = sqlite3.connect(":memory:")  # no cache yet: an empty one, without creating a file
            conn.row_factory = sqlite3.Row
            return conn, True
        if self.read_only:
            # a writer that was killed leaves its -wal (uncheckpointed rows): an immutable read missed them, and a
            # read-only home's cache looked empty (CLI fuzz, 2026-12-03); mode=ro reads them where SQLite can use
            # the WAL index the writer left (connect_shared), else immutable as before
            if self.db_path.with_name(self.db_path.name + "-wal").exists():
                return connect_shared(self.db_path, timeout_s=60.0), False
            return connect_read_only(self.db_path), False
        return self._open_for_reading(), False

    def _open_for_reading(self) -> sqlite3.Connection:
        """The reader's rule of both state databases (:func:`~attnforge._system.statedb.connect_reading`: a full
        disk's refused open is read immutable), with rows by column name."""
        reject_newer(self.db_path, version=SCHEMA_VERSION)  # before a read-write open could checkpoint its WAL
        conn = connect_reading(self.db_path, timeout_s=60.0)
        conn.row_factory = sqlite3.Row
        return conn

    @property
    def read_only(self) -> bool:
        """True when this user cannot write the state directory (a shared, read-only cache)."""
        return self.root.exists() and not writable(self.root)
