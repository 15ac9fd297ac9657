"""``attnforge cache verify``: re-hash every entry and re-check every key against its recorded inputs.

What it catches, and where each came from:
- the artifact's bytes no longer hash to the recorded sha256 (disk or memory error, tampering);
- the row's key is not the sha256 of its recorded inputs (one flipped byte in ``cache.db`` can relabel a
  torch 2.12 build as 2.13: the key no longer matches, so the entry is refused before any install);
- ``provenance.json`` is missing, unreadable, or disagrees with the row (an export would carry it);
- a row that cannot be parsed at all, and SQLite's own ``PRAGMA quick_check``;
- a damaged, foreign or empty ``cache.db`` while entries lie on disk (the reader refuses it: the error's hint
  is ``attnforge cache repair``), and entry directories that have no row (``unindexed``).

Each bad entry is moved to quarantine (never deleted) unless the cache is read-only; then it is reported
only. The same key and hash checks run on every :meth:`Store.get`, so an install never needs this first.
"""

from __future__ import annotations

import datetime as _dt
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from attnforge._system.statedb import lacking_columns
from attnforge.cache._base import INDEX_SCHEMA
from attnforge.cache._db import damaged_db
from attnforge.cache._provenance import PROVENANCE, provenance_problem
from attnforge.cache.entry import Entry, entry_from_row
from attnforge.cache.store import Store
from attnforge.errors import CacheError


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    key: str
    filename: str
    problem: str
    moved_to: str | None  # where it went in quarantine; None when the cache is read-only


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyReport:
    root: str
    checked: int
    ok: tuple[str, ...]
    problems: tuple[Problem, ...]
    database: str  # "ok", or what PRAGMA quick_check said
    #: entry directories on disk without a row (a lost index, a writer killed before its commit):
    #: ``attnforge cache repair`` indexes them again
    unindexed: tuple[str, ...] = ()


def verify(store: Store) -> VerifyReport:
    """Check every entry of ``store``; quarantine the bad ones (when writable). Never raises for a bad entry.

    Raises:
        CacheError: the database cannot be read at all (then nothing can be checked; the hint says how to
            recover the artifacts).
    """
    with store.reader("verify the cache") as conn:
        lacking = lacking_columns(conn, INDEX_SCHEMA)
        if lacking:  # SELECT * reads such a table, and each row then failed on a missing key (an internal error)
            raise damaged_db(store.db_path, f"its tables lack the columns {', '.join(lacking)}"[:500])
        rows = conn.execute("SELECT * FROM artifacts ORDER BY created_at").fetchall()
        quick = [str(r[0]) for r in conn.execute("PRAGMA quick_check").fetchall()]
    ok: list[str] = []
    problems: list[Problem] = []
    for row in rows:
        try:
            entry = entry_from_row(row, artifacts_dir=store.artifacts_dir, db_path=store.db_path)
        except CacheError as exc:
            problems.append(quarantine_row(store, str(row["key"]), str(row["filename"]), exc.message))
            continue
        problem = entry.problem or store.integrity_problem(entry) or _provenance_problem(entry)
        if problem is None:
            ok.append(entry.key)
            continue
        moved = None if store.read_only else str(store.quarantine(entry, problem))
        problems.append(Problem(key=entry.key, filename=entry.filename, problem=problem, moved_to=moved))
    database = "ok" if quick == ["ok"] else "; ".join(quick)[:2000]
    indexed = {str(row["key"]).removeprefix("sha256:") for row in rows}
    unindexed = tuple(d.name for d in store.entry_dirs() if d.name not in indexed and (d / PROVENANCE).is_file())
    return VerifyReport(root=str(store.root), checked=len(rows), ok=tuple(ok), problems=tuple(problems),
                        database=database, unindexed=unindexed)


def _provenance_problem(entry: Entry) -> str | None:
    return provenance_problem(Path(entry.path).parent, key=entry.key, sha256=entry.sha256,
                              filename=entry.filename, inputs=entry.inputs.to_json())


def quarantine_row(store: Store, key: str, filename: str, why: str) -> Problem:
    """A row too damaged to become an Entry: drop the row, move its directory (if it names one) aside."""
    if store.read_only:
        return Problem(key=key, filename=filename, problem=why, moved_to=None)
    digest = key.removeprefix("sha256:")
    stamp = _dt.datetime.now(tz=_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    dest = store.quarantine_dir / f"row-{stamp}-{uuid.uuid4().hex[:6]}"
    with store.writer():
        store.drop_row(key)
        dest.mkdir(parents=True)
        src = store.artifacts_dir / digest
        if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest) and src.is_dir():
            os.replace(src, dest / digest)
        (dest / "reason.txt").write_text(f"{key}\n{filename}\n{why}\n")
    return Problem(key=key, filename=filename, problem=why, moved_to=str(dest))
