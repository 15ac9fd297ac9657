"""``cache``: the artifact store as the verbs see it: list, show, rm, prune, export, import, verify, repair.

Each function opens the store under ``$ATTNFORGE_HOME`` (``environ``; the process environment when None) and runs
one operation of :mod:`attnforge.cache` on it; ``attnforge cache <verb>`` is parse -> one call here -> render. The
results are the store's own typed values (re-exported here, so a renderer imports nothing below this package).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnforge._system.statedb import NewerDatabaseError as NewerDatabaseError  # noqa: PLC0414 - repair names it
from attnforge.cache import Store
from attnforge.cache.entry import Entry as Entry  # noqa: PLC0414 - the values verbs render
from attnforge.cache.key import CacheKeyInputs
from attnforge.cache.prune import PruneResult as PruneResult  # noqa: PLC0414
from attnforge.cache.repair import RepairResult as RepairResult  # noqa: PLC0414
from attnforge.cache.share import ExportResult as ExportResult  # noqa: PLC0414
from attnforge.cache.share import ImportResult as ImportResult  # noqa: PLC0414
from attnforge.cache.verify import VerifyReport as VerifyReport  # noqa: PLC0414
from attnforge.errors import CacheError


def open_store(environ: Mapping[str, str] | None = None) -> Store:
    """The store under ``$ATTNFORGE_HOME`` of ``environ`` (else the platformdirs user cache); nothing is read or
    created until an operation runs."""
    from attnforge.cache import open_store as open_

    return open_(environ)


@dataclass(frozen=True, slots=True, kw_only=True)
class Listing:
    """``cache list``: every entry, newest first.

    Attributes:
        root: the store's directory.
        entries: its entries, newest first.
    """

    root: Path
    entries: tuple[Entry, ...]


def list_entries(environ: Mapping[str, str] | None = None) -> Listing:
    """Every entry of the store, newest first.

    Raises:
        CacheError: the store cannot be read (a damaged database: the hint names ``attnforge cache repair``).
    """
    store = open_store(environ)
    return Listing(root=store.root, entries=tuple(store.list()))


def show(key: str, environ: Mapping[str, str] | None = None) -> Entry:
    """The entry whose key is ``key`` or starts with it (``sha256:`` optional).

    Raises:
        UsageError: no entry, or more than one, matches ``key``.
    """
    return open_store(environ).show(key)


def remove(key: str, environ: Mapping[str, str] | None = None) -> Entry:
    """Delete the entry ``key`` names (a unique prefix is enough); returns what was removed.

    Raises:
        UsageError: no entry, or more than one, matches ``key``.
        CacheError: the store cannot be written.
    """
    return open_store(environ).remove(key)


def prune(*, older_than_s: float | None = None, max_size_bytes: int | None = None,
          environ: Mapping[str, str] | None = None) -> PruneResult:
    """Remove entries unused for ``older_than_s`` seconds, then the least recently used ones until the store holds
    at most ``max_size_bytes``, and the debris of writers that died (:func:`attnforge.cache.prune.prune`).

    Raises:
        CacheError: the store cannot be written, or its database is damaged (nothing is removed then).
    """
    from attnforge.cache.prune import prune as run

    return run(open_store(environ), older_than_s=older_than_s, max_size_bytes=max_size_bytes)


def export(dest: Path, environ: Mapping[str, str] | None = None) -> ExportResult:
    """Write every intact entry and a PEP 503 index into ``dest`` (:func:`attnforge.cache.share.export`).

    Raises:
        CacheError: the disk under ``dest`` is full, a symlink was planted there, or another export holds its lock.
    """
    from attnforge.cache.share import export as run

    return run(open_store(environ), dest)


def import_(source: Path, environ: Mapping[str, str] | None = None) -> ImportResult:
    """Merge an export directory or another cache root into the store; every key and hash is checked
    (:func:`attnforge.cache.share.import_`).

    Raises:
        UsageError: ``source`` holds neither an export nor a cache.
        CacheError: the store cannot be written or its disk is full.
    """
    from attnforge.cache.share import import_ as run

    return run(open_store(environ), source)


def verify(environ: Mapping[str, str] | None = None) -> VerifyReport:
    """Re-hash every entry and re-check its key; quarantine what fails unless the store is read-only
    (:func:`attnforge.cache.verify.verify`).

    Raises:
        CacheError: the database cannot be read at all.
    """
    from attnforge.cache.verify import verify as run

    return run(open_store(environ))


@dataclass(frozen=True, slots=True, kw_only=True)
class Repaired:
    """``cache repair``: the artifact index rebuilt, where a damaged ``records.db`` went, and which database a
    newer attnforge wrote (left as it is).

    Attributes:
        cache: what :func:`attnforge.cache.repair.repair` did (None: ``cache.db`` is a newer attnforge's, so
            nothing was indexed, moved or quarantined).
        records_moved_to: where a damaged ``records.db`` was moved (None: it was sound, absent, or newer).
        left_in_place: each state database a newer attnforge wrote, with its schema, ours and the fix; this
            attnforge never moves, writes or migrates such a file.
    """

    cache: RepairResult | None
    records_moved_to: Path | None
    left_in_place: tuple[NewerDatabaseError, ...] = ()


def repair(environ: Mapping[str, str] | None = None) -> Repaired:
    """Rebuild ``cache.db`` from the artifacts on disk (nothing is rebuilt or downloaded), then move a damaged
    ``records.db`` aside (verify and bench results can be measured again). A database a newer attnforge wrote is
    left as it is and named in ``left_in_place``; the other one is still repaired.

    Raises:
        CacheError: the cache cannot be written, or its database is locked or on a failing disk.
    """
    from attnforge.cache.repair import repair as run
    from attnforge.records import open_records

    store = open_store(environ)
    newer: list[NewerDatabaseError] = []
    result: RepairResult | None = None
    records_moved: Path | None = None
    try:
        result = run(store)
    except NewerDatabaseError as exc:
        newer.append(exc)
    try:
        records_moved = open_records(environ).repair(store.now())
    except NewerDatabaseError as exc:
        newer.append(exc)
    return Repaired(cache=result, records_moved_to=records_moved, left_in_place=tuple(newer))


def disk_error(exc: OSError) -> CacheError | None:
    """The user-facing error for "no space left", "quota exceeded" or "read-only file system" raised anywhere
    under a verb (a log, an index page or a temp file written on a full disk), with where it happened and a
    hint; None for any other OSError (:func:`attnforge.cache._db.os_error_as_cache_error`)."""
    from attnforge.cache._db import os_error_as_cache_error

    return os_error_as_cache_error(exc)


def publish_to_directory(wheel: Path, inputs: CacheKeyInputs, *, dest: Path, scratch: Path,
                         log_path: Path | None = None, provenance: Mapping[str, Any] | None = None) -> Entry:
    """Add one wheel to the PEP 503 directory index ``dest`` exactly as ``attnforge cache export`` writes one
    (``dest/artifacts/<digest>/`` with its provenance, ``dest/simple`` rewritten): through a one-entry store in
    ``scratch`` (a fresh directory, removed afterwards). The fleet's directory index publishes with it.

    Returns:
        The entry as stored (its key, file name and sha256; its path is in ``scratch``, gone on return).

    Raises:
        UsageError: the wheel's file name does not match ``inputs``.
        CacheError: the disk is full or a symlink was planted in ``dest`` (nothing partial stays visible).
    """
    from attnforge.cache._files import remove_tree
    from attnforge.cache.share import export as run

    scratch.mkdir(parents=True)
    try:
        store = Store(scratch)
        put = store.put(wheel, inputs, log_path=log_path, provenance=provenance)
        run(store, dest)
    finally:
        remove_tree(scratch)
    return put.entry


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes, as the store records an artifact's (read in chunks).

    Raises:
        OSError: the file cannot be read.
    """
    from attnforge.cache._files import sha256_file

    return sha256_file(path)
