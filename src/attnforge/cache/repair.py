"""What lies on disk that ``cache.db`` does not index: complete entries to index again.

The artifacts are content-addressed and self-describing: every ``ROOT/artifacts/<digest>/`` holds the file
and a ``provenance.json`` (:func:`attnforge.cache._provenance.provenance_doc`) with the key, the inputs it
was computed from, the file name, its sha256 and size, and the facts recorded at ``put``. So ``cache.db`` is
an index that can be rebuilt (:func:`repair`, ``attnforge cache repair``): a damaged, foreign or empty
database is moved aside (never deleted) and every entry whose key is the hash of its recorded inputs and whose
file still hashes to its recorded sha256 is indexed again; one that fails goes to quarantine with the reason.
Nothing is rebuilt or downloaded. A ``cache.db`` a newer attnforge wrote is not damage: it is left as it is, and
nothing is indexed or quarantined (the newer release's index is the one that counts).

A row-less entry directory is not debris when it is complete (``Store.remove_debris_locked`` keeps it): a
writer that died between the rename and the commit, or a lost index, leaves exactly that, and a FlashAttention
build can take an hour.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path

from attnforge._system.statedb import DamagedDatabaseError, lacking_columns, move_aside
from attnforge.cache._base import INDEX_SCHEMA
from attnforge.cache._files import sha256_file
from attnforge.cache._provenance import (
    BUILD_LOG,
    MAX_WHEEL_BYTES,
    check_wheel_name,
    read_provenance,
    regular_file_problem,
)
from attnforge.cache.entry import Entry, entry_at
from attnforge.cache.key import ArtifactKind, CacheKey, CacheKeyInputs
from attnforge.cache.store import Store
from attnforge.errors import AttnforgeError, CacheError


@dataclass(frozen=True, slots=True, kw_only=True)
class RepairResult:
    """What ``attnforge cache repair`` did.

    Attributes:
        database_moved_to: where the damaged ``cache.db`` went (None: it was sound and kept).
        damage: why it was moved aside (None when kept).
        indexed: keys of the entries indexed again.
        kept: how many entries already had a sound row.
        quarantined: ``directory: reason`` of each entry directory that failed its checks (moved to quarantine).
    """

    root: str
    database_moved_to: str | None
    damage: str | None
    indexed: tuple[str, ...]
    kept: int
    quarantined: tuple[str, ...]


def repair(store: Store) -> RepairResult:
    """Make ``cache.db`` the index of the entries on disk, under the writer lock.

    Raises:
        NewerDatabaseError: a newer attnforge wrote ``cache.db``: it is left as it is, and nothing is indexed
            or quarantined.
        CacheError: the cache cannot be written (read-only home, another owner, a bad lock file) or the
            database is locked or on a failing disk (those are not damage: nothing is moved).
    """
    from attnforge.cache.verify import quarantine_row

    with store.writer():
        moved, damage = _move_damaged_db(store)
        with store.reader("repair the cache") as conn:
            known = {str(r["key"]) for r in conn.execute("SELECT key FROM artifacts")}
        indexed: list[str] = []
        quarantined: list[str] = []
        for folder in store.entry_dirs():
            key = f"sha256:{folder.name}"
            if key in known:
                continue
            entry, why = entry_on_disk(store, folder)
            if entry is None:
                problem = quarantine_row(store, key, "?", f"repair: {why}")
                quarantined.append(f"{folder.name}: {why} (moved to {problem.moved_to})")
                continue
            store.add_row_locked(entry)
            indexed.append(entry.key)
    return RepairResult(root=str(store.root), database_moved_to=None if moved is None else str(moved),
                        damage=damage, indexed=tuple(indexed), kept=len(known), quarantined=tuple(quarantined))


def _move_damaged_db(store: Store) -> tuple[Path | None, str | None]:
    """Move ``cache.db`` aside when it is damaged, foreign, empty while entries lie on disk, or fails
    ``PRAGMA quick_check``; returns where it went and why (None, None when it is sound or absent). A newer
    attnforge's file raises :class:`~attnforge._system.statedb.NewerDatabaseError` before anything is moved."""
    try:
        with store.reader("check the cache database") as conn:
            quick = [str(r[0]) for r in conn.execute("PRAGMA quick_check").fetchall()]
            lacking = lacking_columns(conn, INDEX_SCHEMA)
        if quick == ["ok"] and not lacking:
            return None, None
        damage = ("PRAGMA quick_check: " + "; ".join(quick)[:500] if quick != ["ok"]
                  else f"its tables lack the columns {', '.join(lacking)}"[:500])
    except DamagedDatabaseError as exc:
        damage = exc.cause or exc.message
    dest = None
    if store.db_path.exists() or store.db_path.is_symlink():  # else a missing index: indexed into a new one
        try:
            dest = move_aside(store.db_path, store.now())
        except OSError as exc:
            raise CacheError(f"cannot move the damaged cache database {store.db_path} aside",
                             cause=exc.strerror or str(exc), hint="make its directory writable by you") from None
    store.new_index_locked()
    return dest, damage


def entry_on_disk(store: Store, folder: Path) -> tuple[Entry | None, str]:
    """The entry that ``folder`` holds, re-derived from its ``provenance.json`` and checked like an import
    (the key is the hash of the recorded inputs and names the folder, the file hashes to the recorded sha256),
    or ``(None, why)``."""
    doc, why = read_provenance(folder)
    if doc is None:
        return None, why or "no provenance.json"
    try:
        inputs = CacheKeyInputs.from_json(doc["inputs"])
        key = CacheKey.parse(str(doc["key"]))
        filename = str(doc["filename"])
        extra = doc.get("details") or {}
        if not isinstance(extra, dict):
            raise TypeError("details is not an object")
    except (KeyError, TypeError, ValueError, AttnforgeError) as exc:
        return None, f"provenance.json cannot be read as an entry ({exc})"
    if CacheKey.of(inputs) != key or key.digest != folder.name:
        return None, f"its key {key} is not the hash of its recorded inputs or does not name its directory"
    if "/" in filename or "\\" in filename or filename in ("", ".", ".."):
        return None, f"its file name {filename!r} is not a plain name"
    problem = regular_file_problem(folder / filename, MAX_WHEEL_BYTES)
    if problem is not None:
        return None, problem
    if inputs.kind is ArtifactKind.WHEEL:
        try:
            check_wheel_name(filename, inputs)
        except AttnforgeError as exc:
            return None, exc.message
    sha = sha256_file(folder / filename)
    if sha != doc.get("sha256"):
        return None, f"sha256 of {filename} is {sha}, recorded {doc.get('sha256')}"
    now = store.now()
    try:
        created = _dt.datetime.fromisoformat(str(doc["created_at"])).timestamp()
    except (KeyError, ValueError):
        created = now
    has_log = doc.get("log") == BUILD_LOG and (folder / BUILD_LOG).is_file()
    size = (folder / filename).stat().st_size
    return entry_at(store.artifacts_dir, key=key, inputs=inputs, filename=filename, sha=sha, size=size,
                    has_log=has_log, created=created, used=now, extra=extra), ""
