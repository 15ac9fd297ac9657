"""The content-addressed artifact store under ``home_dir()``.

Layout (``ROOT`` is ``$ATTNFORGE_HOME`` or the platformdirs user cache)::

    ROOT/cache.db                    SQLite (WAL): one row per complete entry; the only index of what exists
    ROOT/cache.lock                  file lock held by every writer
    ROOT/artifacts/<digest>/         one entry: the wheel or static library, provenance.json, build.log
    ROOT/artifacts/.staging-*/       an entry being written (removed on the next write if its writer died)
    ROOT/quarantine/<digest>-<time>/ entries that failed their hash check, with reason.txt
    ROOT/locks/<name>.lock           per-job locks so concurrent installs build a thing once

An entry becomes visible only when its directory has been renamed into place *and* its row is committed, so
a writer killed at any point leaves nothing that :meth:`Store.get` returns. Every :meth:`Store.get` re-hashes
the file; a mismatch moves the entry to quarantine and raises, so a corrupt artifact is never installed.
"""

from __future__ import annotations

import builtins
import datetime as _dt
import json
import os
import sqlite3
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.utils import parse_wheel_filename

from attnforge._system.files import write_atomic
from attnforge.cache._base import StoreBase
from attnforge.cache._db import db_error, is_disk_problem
from attnforge.cache._files import (
    fsync_dir,
    is_no_space,
    no_space_error,
    remove_tree,
    sha256_file,
)
from attnforge.cache._provenance import (
    BUILD_LOG,
    PROVENANCE,
    check_wheel_name,
    provenance_doc,
    read_provenance,
    unsafe_member,
)
from attnforge.cache.entry import Entry, PutResult, entry_at, entry_from_row
from attnforge.cache.key import ArtifactKind, CacheKey, CacheKeyInputs
from attnforge.errors import CacheError, UsageError
from attnforge.resolve.types import CachedArtifact

STAGING_PREFIX = ".staging-"

_SELECT_ALL = (
    "SELECT key, filename, sha256, size_bytes, inputs, provenance, has_log, created_at, last_used_at"
    " FROM artifacts ORDER BY created_at DESC"
)
_SELECT_ONE = (
    "SELECT key, filename, sha256, size_bytes, inputs, provenance, has_log, created_at, last_used_at"
    " FROM artifacts WHERE key = ?"
)
_INSERT = (
    "INSERT INTO artifacts (key, kind, name, version, filename, sha256, size_bytes, inputs, provenance,"
    " has_log, created_at, last_used_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
)


#: The fewest hex digits a key prefix must have (``attnforge cache list`` shows 12).
_MIN_PREFIX = 4
#: How many candidates a too-short or ambiguous prefix lists.
_SHOWN_CANDIDATES = 8


def _parsed_key(text: object) -> CacheKey | None:
    """A row's key, or None where the row's key column is not one (a damaged row)."""
    try:
        return CacheKey.parse(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _candidates(rows: builtins.list[sqlite3.Row]) -> str:
    """``give more digits of one of: sha256:0a1b2c3d4e5f (x.whl), ...`` for the rows a prefix matched."""
    shown = ", ".join(f"{str(r['key'])[:19]} ({r['filename']})" for r in rows[:_SHOWN_CANDIDATES])
    left = len(rows) - _SHOWN_CANDIDATES
    more = f", and {left} more (`attnforge cache list`)" if left > 0 else ""
    return f"give more digits of one of: {shown}{more}"


class Store(StoreBase):
    """The artifact store rooted at one directory (constructor arguments: :class:`StoreBase`)."""

    # -- writing --------------------------------------------------------------------------------------------

    def put(
        self,
        artifact: Path,
        inputs: CacheKeyInputs,
        *,
        log_path: Path | None = None,
        provenance: Mapping[str, Any] | None = None,
        expected_sha256: str | None = None,
        follow_symlinks: bool = True,
    ) -> PutResult:
        """Store a wheel (or, with ``inputs.kind``, a static library) under the key of ``inputs``.

        Args:
            artifact: the file to store; it is copied, never moved.
            inputs: what the key is computed from; for a wheel, its name must match the wheel's.
            log_path: the build log to keep with it.
            provenance: extra facts to record (JSON values).
            expected_sha256: refuse the file unless its bytes hash to this (a wheel from an index).
            follow_symlinks: copy what a symlinked ``artifact`` or ``log_path`` points at (the caller's own
                files); False refuses symlinks (``cache import`` of someone else's directory).

        Returns:
            The entry, and ``stored=False`` when an intact entry with this key already existed.

        Raises:
            UsageError: the file is missing, or a wheel's file name does not match ``inputs``.
            CacheError: the hash differs from ``expected_sha256``, or the disk is full (nothing is left
                behind).
        """
        artifact = Path(artifact)
        if not artifact.is_file():
            raise UsageError(f"no such artifact file: {artifact}")
        if not follow_symlinks and (artifact.is_symlink() or (log_path is not None and Path(log_path).is_symlink())):
            raise CacheError(f"{artifact.name} was not stored: it or its log is a symlink, which is never followed",
                             hint="store the file itself")
        source = artifact  # a symlink keeps its name (a wheel's name is its metadata); its target is copied
        if follow_symlinks:
            source = artifact.resolve()
            if log_path is not None:
                log_path = Path(log_path).resolve()
        if inputs.kind is ArtifactKind.WHEEL:
            check_wheel_name(artifact.name, inputs)
            bad = unsafe_member(artifact)
            if bad is not None:
                raise CacheError(f"{artifact.name} was not stored: {bad}",
                                 hint="it is not a sound wheel; rebuild it or get it from a trusted source")
        key = CacheKey.of(inputs)
        with self.writer():
            existing = self._row(key)
            if existing is not None:
                if self._intact(existing):
                    return PutResult(entry=existing, stored=False)
                self._quarantine_locked(existing, "replaced: its file no longer matched its sha256")
            try:
                entry = self._store_locked(
                    key=key, artifact=artifact, source=source, inputs=inputs, log_path=log_path,
                    extra=provenance or {},
                    expected_sha256=expected_sha256,
                )
            except (OSError, sqlite3.OperationalError) as exc:
                if is_no_space(exc):
                    raise no_space_error(f"store {artifact.name} in the cache", self.root, exc) from None
                raise
        return PutResult(entry=entry, stored=True)

    def _store_locked(
        self,
        *,
        key: CacheKey,
        artifact: Path,
        source: Path,
        inputs: CacheKeyInputs,
        log_path: Path | None,
        extra: Mapping[str, Any],
        expected_sha256: str | None,
    ) -> Entry:
        with self._db():  # the index exists (and was checked: check_index) before an entry appears on disk
            pass
        self.artifacts_dir.mkdir(parents=True, exist_ok=True)
        self.remove_debris_locked()
        final = self.artifacts_dir / key.digest
        remove_tree(final)  # a directory without a row: a writer died between rename and commit
        staging = self.artifacts_dir / f"{STAGING_PREFIX}{key.digest[:16]}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        try:
            sha = self._copy_file(source, staging / artifact.name)
            if expected_sha256 is not None and sha != expected_sha256.lower():
                raise CacheError(
                    f"{artifact.name} does not match its published sha256; it was not stored",
                    cause=f"expected {expected_sha256}, got {sha}",
                    hint="the file was corrupted or replaced in transit; download it again from a trusted "
                    "index",
                )
            has_log = False
            if log_path is not None and Path(log_path).is_file():
                self._copy_file(Path(log_path), staging / BUILD_LOG)
                has_log = True
            now = self._clock()
            size = (staging / artifact.name).stat().st_size
            doc = provenance_doc(
                key=key, inputs=inputs, filename=artifact.name, sha256=sha, size_bytes=size,
                created_at_s=now, has_log=has_log, extra=extra,
            )
            write_atomic(staging / PROVENANCE, json.dumps(doc, indent=2, sort_keys=True).encode())
            os.replace(staging, final)
            fsync_dir(self.artifacts_dir)
        except BaseException:
            remove_tree(staging)
            raise
        entry = entry_at(self.artifacts_dir, key=key, inputs=inputs, filename=artifact.name, sha=sha, size=size,
                         has_log=has_log, created=now, used=now, extra=extra)
        try:
            self.add_row_locked(entry)
        except BaseException:
            remove_tree(final)
            raise
        return entry

    def add_row_locked(self, entry: Entry) -> None:
        """Commit the row of ``entry``, whose files are in place (``put``; ``repair`` indexing an entry again)."""
        with self._db() as conn:
            conn.execute(_INSERT, (
                entry.key, entry.kind.value, entry.name, entry.version, entry.filename, entry.sha256,
                entry.size_bytes, entry.inputs.canonical_json(), json.dumps(dict(entry.provenance), sort_keys=True),
                int(entry.log_path is not None), entry.created_at_s, entry.last_used_at_s))

    # -- reading --------------------------------------------------------------------------------------------

    def get(self, key: CacheKey | str) -> Path:
        """The path of an entry's artifact, after re-hashing it.

        Raises:
            CacheError: no such entry, or its file is missing or fails its sha256 check (the entry is then
                moved to quarantine; the error says where).
        """
        entry = self.show(key)
        problem = entry.problem or self.integrity_problem(entry)
        if problem is not None:
            if self.read_only:
                raise CacheError(
                    f"cache entry {entry.key} ({entry.filename}) is corrupt and was not used",
                    cause=f"{problem}; the cache is read-only, so it stays where it is",
                    hint=f"ask the owner of {self.root} to run `attnforge cache verify`",
                )
            where = self.quarantine(entry, problem)
            raise CacheError(
                f"cache entry {entry.key} ({entry.filename}) is corrupt and was not used",
                cause=f"{problem}; moved to {where}",
                hint="it will be rebuilt or fetched again on the next install; "
                "inspect the quarantined copy if this keeps happening (disk or memory errors)",
            )
        if not self.read_only:
            try:
                with self._db(raw=True) as conn:
                    conn.execute("UPDATE artifacts SET last_used_at = ? WHERE key = ?", (self._clock(), entry.key))
            except (sqlite3.Error, CacheError):
                pass  # the last-used time only orders `prune`; a full disk or a bad lock must not stop an install
        return Path(entry.path)

    def find(self, key: CacheKey | str) -> Entry | None:
        """The entry's metadata, or None (no hashing)."""
        return self._row(self.resolve_key(key) if isinstance(key, str) else key)

    def show(self, key: CacheKey | str) -> Entry:
        """The entry's metadata (no hashing). ``key`` may be a unique prefix of the digest.

        Raises:
            CacheError: no such entry.
            UsageError: the text is not a key or is an ambiguous prefix.
        """
        found = self.find(key)
        if found is None:
            raise CacheError(f"no cache entry {key}", hint="see `attnforge cache list`")
        return found

    def list(self) -> list[Entry]:
        """Every complete entry, newest first."""
        with self.reader("list the cache") as conn:
            rows = conn.execute(_SELECT_ALL).fetchall()
        return [entry_from_row(r, artifacts_dir=self.artifacts_dir, db_path=self.db_path) for r in rows]

    def cached_artifacts(self) -> builtins.list[CachedArtifact]:
        """The wheels in the store, as the resolver's cache candidates."""
        out = []
        for e in self.list():
            if e.kind is not ArtifactKind.WHEEL:
                continue
            _, version, _, _ = parse_wheel_filename(e.filename)
            out.append(
                CachedArtifact(
                    key=e.key, name=e.name, version=str(version), filename=e.filename, archs=e.inputs.archs,
                    torch_version=e.inputs.torch_version, cuda_version=e.inputs.cuda_version,
                    cxx11_abi=e.inputs.cxx11_abi, sha256=e.sha256, flags=e.inputs.flags,
                    source_sha256=e.inputs.source_sha256, abi=e.inputs.abi.value,
                )
            )
        return out

    def resolve_key(self, text: str) -> CacheKey:
        """A full key, or a unique prefix of a digest (``sha256:ab12`` or ``ab12``, at least 4 digits).

        Raises:
            UsageError: not a key, too short, unknown or ambiguous prefix.
        """
        t = text.strip().lower().removeprefix("sha256:")
        if len(t) == 64:
            try:
                return CacheKey(t)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        if not t or any(c not in "0123456789abcdef" for c in t):
            raise UsageError(
                f"not a cache key or key prefix: {text!r}", hint="copy a key from `attnforge cache list`"
            )
        with self.reader() as conn:
            rows = conn.execute("SELECT key, filename FROM artifacts WHERE key LIKE ? ORDER BY key",
                                (f"sha256:{t}%",)).fetchall()
        if len(t) < _MIN_PREFIX:
            raise UsageError(f"the key prefix {text!r} is too short: give at least {_MIN_PREFIX} hex digits",
                             hint=_candidates(rows) if rows else "copy a key from `attnforge cache list`")
        # a row whose key is not a key (a damaged row: `cache verify` moves it aside) is no entry to name
        named = [(key, row) for key, row in ((_parsed_key(row["key"]), row) for row in rows) if key is not None]
        if len(named) == 1:
            return named[0][0]
        if not named and rows:
            raise CacheError(f"the only row that starts with {text!r} is damaged: {str(rows[0]['key'])[:80]!r}",
                             hint="`attnforge cache verify` moves it aside; `attnforge cache repair` then rebuilds "
                                  "the rows from the files on disk")
        if not named:
            raise CacheError(f"no cache entry starts with {text!r}", hint="see `attnforge cache list`")
        raise UsageError(f"the key prefix {text!r} matches {len(named)} entries",
                         hint=_candidates([row for _, row in named]))

    # -- removing -------------------------------------------------------------------------------------------

    def remove(self, key: CacheKey | str) -> Entry:
        """Delete an entry (row first, then files).

        Raises:
            CacheError: no such entry.
        """
        entry = self.show(key)
        with self.writer():
            self.delete_locked([entry])
        return entry

    def delete_locked(self, entries: builtins.list[Entry]) -> None:
        """Remove ``entries``; the caller holds :meth:`writer` (``prune`` does). Rows first, then files. On a full
        disk (no room for SQLite's journal) the files go first to make room: a row whose file is gone is never
        installed (:meth:`get` finds the file missing). No entries: nothing opened (a write transaction for
        nothing failed on a full disk, where ``cache prune`` is the advice)."""
        if not entries:
            return
        keys = [(e.key,) for e in entries]
        try:
            with self._db(raw=True) as conn:
                conn.executemany("DELETE FROM artifacts WHERE key = ?", keys)
        except sqlite3.Error as exc:
            if not is_disk_problem(exc):
                raise db_error(exc, self.db_path, "remove entries") from None
            for e in entries:
                remove_tree(Path(e.path).parent)
            with self._db("remove entries") as conn:
                conn.executemany("DELETE FROM artifacts WHERE key = ?", keys)
        for e in entries:
            remove_tree(Path(e.path).parent)

    def quarantine(self, entry: Entry, reason: str) -> Path:
        """Move an entry aside (never deleted, never installed) and drop its row; returns where it went."""
        with self.writer():
            return self._quarantine_locked(entry, reason)

    def _quarantine_locked(self, entry: Entry, reason: str) -> Path:
        with self._db() as conn:
            conn.execute("DELETE FROM artifacts WHERE key = ?", (entry.key,))
        src = Path(entry.path).parent
        stamp = _dt.datetime.fromtimestamp(self._clock(), tz=_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        dest = self.quarantine_dir / f"{src.name}-{stamp}-{uuid.uuid4().hex[:6]}"
        self.quarantine_dir.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            os.replace(src, dest)
        else:
            dest.mkdir()
        (dest / "reason.txt").write_text(f"{entry.key}\n{entry.filename}\n{reason}\n")
        return dest

    def remove_debris_locked(self) -> builtins.list[str]:
        """Remove staging directories and row-less entry directories without a sound ``provenance.json``; safe
        only under :meth:`writer` (no live writer then). Complete row-less entries are kept: a writer that died
        between the rename and the commit, or a lost index, leaves exactly that, and
        :func:`attnforge.cache.repair.repair` indexes them again (a FlashAttention build can take an hour).

        Returns:
            The names of the directories removed under ``artifacts/``.
        """
        if not self.artifacts_dir.is_dir():
            return []
        with self.reader() as conn:
            known = {str(r["key"]).removeprefix("sha256:") for r in conn.execute("SELECT key FROM artifacts")}
        removed = []
        for child in self.artifacts_dir.iterdir():
            incomplete = child.is_dir() and child.name not in known and read_provenance(child)[0] is None
            if child.name.startswith(STAGING_PREFIX) or incomplete:
                remove_tree(child)
                removed.append(child.name)
        return removed

    # The store's maintenance lives beside it and takes the store as an argument (the store imports none of it):
    # prune.prune, share.export / share.import_, verify.verify, repair.repair; attnforge.provision.cache calls them.

    # -- helpers --------------------------------------------------------------------------------------------

    def _row(self, key: CacheKey) -> Entry | None:
        with self.reader() as conn:
            row = conn.execute(_SELECT_ONE, (str(key),)).fetchone()
        return None if row is None else entry_from_row(row, artifacts_dir=self.artifacts_dir, db_path=self.db_path)

    def integrity_problem(self, entry: Entry) -> str | None:
        """Why the file of ``entry`` cannot be trusted (missing, another size or sha256), or None."""
        path = Path(entry.path)
        if not path.is_file():
            return f"its file {path} is missing"
        actual = sha256_file(path)
        if actual != entry.sha256:
            return f"sha256 of {path.name} is {actual}, recorded {entry.sha256}"
        return None

    def _intact(self, entry: Entry) -> bool:
        return self.integrity_problem(entry) is None
