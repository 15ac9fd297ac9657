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
import dataclasses
import datetime as _dt
import json
import os
import sqlite3
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.utils import parse_wheel_filename

from attnforge.cache._base import StoreBase
from attnforge.cache._db import db_error, is_disk_problem
from attnforge.cache._files import (
    fsync_dir,
    is_no_space,
    no_space_error,
    remove_tree,
    sha256_file,
    write_atomic,
)
from attnforge.cache._provenance import BUILD_LOG, PROVENANCE, check_wheel_name, provenance_doc, unsafe_member
from attnforge.cache.key import ArtifactKind, CacheKey, CacheKeyInputs
from attnforge.errors import CacheError, UsageError
from attnforge.resolve.types import CachedArtifact

if TYPE_CHECKING:
    from attnforge.cache.share import ExportResult, ImportResult
    from attnforge.cache.verify import VerifyReport

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


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One complete artifact in the store (metadata only; :meth:`Store.get` returns its verified path).

    Attributes:
        key: ``sha256:...`` of ``inputs``.
        inputs: everything the key was computed from.
        filename: the artifact's file name (a wheel's carries its tags).
        sha256: hex sha256 of the artifact's bytes, recorded when it was stored.
        size_bytes: the artifact's size.
        path: where the artifact file lives.
        log_path: the build log kept with it, if any.
        created_at_s / last_used_at_s: Unix times.
        provenance: free-form facts from whoever stored it (builder, source URL, host).
        problem: why this row cannot be trusted (its key does not match its inputs: the database was
            altered), else None; :meth:`Store.get` refuses such an entry.
    """

    key: str
    inputs: CacheKeyInputs
    filename: str
    sha256: str
    size_bytes: int
    path: str
    log_path: str | None
    created_at_s: float
    last_used_at_s: float
    provenance: Mapping[str, Any] = field(default_factory=dict)
    problem: str | None = None  # set when the row's key is not the hash of its recorded inputs

    @property
    def kind(self) -> ArtifactKind:
        return self.inputs.kind

    @property
    def name(self) -> str:
        return self.inputs.name

    @property
    def version(self) -> str:
        return self.inputs.version


@dataclass(frozen=True, slots=True, kw_only=True)
class PutResult:
    """The entry, and whether this call stored it (False: an identical entry was already there)."""

    entry: Entry
    stored: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class PruneResult:
    removed: tuple[Entry, ...]
    freed_bytes: int
    kept_bytes: int
    debris_removed: tuple[str, ...] = ()  # staging dirs of dead writers and dirs without a row


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
        with self._writer():
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

    def put_file(
        self,
        path: Path,
        inputs: CacheKeyInputs,
        *,
        log_path: Path | None = None,
        provenance: Mapping[str, Any] | None = None,
    ) -> PutResult:
        """Store a non-wheel artifact (``inputs.kind`` is ``static-lib``), such as candle's
        ``libflashattention.a``. Same guarantees as :meth:`put`.

        Raises:
            UsageError: ``inputs.kind`` is ``wheel`` (use :meth:`put`).
        """
        if inputs.kind is ArtifactKind.WHEEL:
            raise UsageError("put_file() is for non-wheel artifacts; use put() for wheels")
        return self.put(path, inputs, log_path=log_path, provenance=provenance)

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
        self.artifacts_dir.mkdir(parents=True, exist_ok=True)
        self._remove_debris_locked()
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
        try:
            with self._db() as conn:
                extra_json = json.dumps(dict(extra), sort_keys=True)
                conn.execute(
                    _INSERT,
                    (str(key), inputs.kind.value, inputs.name, inputs.version, artifact.name, sha, size,
                     inputs.canonical_json(), extra_json, int(has_log), now, now),
                )
        except BaseException:
            remove_tree(final)
            raise
        return self._entry_from(
            key=key, inputs=inputs, filename=artifact.name, sha=sha, size=size, has_log=has_log, created=now,
            used=now, extra=extra,
        )

    # -- reading --------------------------------------------------------------------------------------------

    def get(self, key: CacheKey | str) -> Path:
        """The path of an entry's artifact, after re-hashing it.

        Raises:
            CacheError: no such entry, or its file is missing or fails its sha256 check (the entry is then
                moved to quarantine; the error says where).
        """
        entry = self.show(key)
        problem = entry.problem or self._integrity_problem(entry)
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
            except sqlite3.Error:
                pass  # the last-used time only orders `prune`; a full disk must not stop an install
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
        with self._read("list the cache") as conn:
            rows = conn.execute(_SELECT_ALL).fetchall()
        return [self._entry_from_row(r) for r in rows]

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
        if len(t) < 4 or any(c not in "0123456789abcdef" for c in t):
            raise UsageError(
                f"not a cache key or key prefix: {text!r}", hint="copy a key from `attnforge cache list`"
            )
        with self._read() as conn:
            rows = conn.execute("SELECT key FROM artifacts WHERE key LIKE ?", (f"sha256:{t}%",)).fetchall()
        if len(rows) == 1:
            return CacheKey.parse(rows[0]["key"])
        if not rows:
            raise CacheError(f"no cache entry starts with {text!r}", hint="see `attnforge cache list`")
        raise UsageError(f"{text!r} matches {len(rows)} entries", hint="give more digits of the key")

    # -- removing -------------------------------------------------------------------------------------------

    def remove(self, key: CacheKey | str) -> Entry:
        """Delete an entry (row first, then files).

        Raises:
            CacheError: no such entry.
        """
        entry = self.show(key)
        with self._writer():
            self._delete_locked([entry])
        return entry

    def _delete_locked(self, entries: builtins.list[Entry]) -> None:
        """Rows first, then files. On a full disk (no room for SQLite's journal) the files go first to make
        room: a row whose file is gone is never installed (:meth:`get` finds the file missing)."""
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
        with self._writer():
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

    def prune(self, *, older_than_s: float | None = None, max_size_bytes: int | None = None) -> PruneResult:
        """Remove entries unused for ``older_than_s``, then least recently used ones until the store holds at
        most ``max_size_bytes``; also clears the debris of writers that died.
        """
        with self._writer():
            debris = self._remove_debris_locked()
            entries = sorted(self.list(), key=lambda e: e.last_used_at_s)
            doomed: list[Entry] = []
            if older_than_s is not None:
                cutoff = self._clock() - older_than_s
                doomed = [e for e in entries if e.last_used_at_s < cutoff]
            kept = [e for e in entries if e not in doomed]
            total = sum(e.size_bytes for e in kept)
            if max_size_bytes is not None:
                while kept and total > max_size_bytes:
                    victim = kept.pop(0)
                    doomed.append(victim)
                    total -= victim.size_bytes
            self._delete_locked(doomed)
        return PruneResult(
            removed=tuple(doomed), freed_bytes=sum(e.size_bytes for e in doomed), kept_bytes=total,
            debris_removed=tuple(debris),
        )

    def _remove_debris_locked(self) -> builtins.list[str]:
        """Staging dirs and row-less entry dirs; safe only under the writer lock (no live writer then)."""
        if not self.artifacts_dir.is_dir():
            return []
        with self._read() as conn:
            known = {str(r["key"]).removeprefix("sha256:") for r in conn.execute("SELECT key FROM artifacts")}
        removed = []
        for child in self.artifacts_dir.iterdir():
            if child.name.startswith(STAGING_PREFIX) or (child.is_dir() and child.name not in known):
                remove_tree(child)
                removed.append(child.name)
        return removed

    # -- sharing (see share.py) -----------------------------------------------------------------------------

    def export(self, dest: Path) -> ExportResult:
        """Write every intact entry into ``dest`` with a PEP 503 index at ``dest/simple``."""
        from attnforge.cache.share import export

        return export(self, dest)

    def verify(self) -> VerifyReport:
        """Re-hash every entry and re-check its key; quarantine what fails (see verify.py)."""
        from attnforge.cache.verify import verify

        return verify(self)

    def import_(self, source: Path) -> ImportResult:
        """Merge an export directory or another cache root, verifying keys and hashes."""
        from attnforge.cache.share import import_

        return import_(self, source)

    # -- helpers --------------------------------------------------------------------------------------------

    def _row(self, key: CacheKey) -> Entry | None:
        with self._read() as conn:
            row = conn.execute(_SELECT_ONE, (str(key),)).fetchone()
        return None if row is None else self._entry_from_row(row)

    def _integrity_problem(self, entry: Entry) -> str | None:
        path = Path(entry.path)
        if not path.is_file():
            return f"its file {path} is missing"
        actual = sha256_file(path)
        if actual != entry.sha256:
            return f"sha256 of {path.name} is {actual}, recorded {entry.sha256}"
        return None

    def _intact(self, entry: Entry) -> bool:
        return self._integrity_problem(entry) is None

    def _entry_from_row(self, row: sqlite3.Row) -> Entry:
        """The entry of a row, its key re-checked against its recorded inputs (``problem`` says if not).

        Raises:
            CacheError: the row cannot be read at all (the database was damaged).
        """
        try:
            inputs = CacheKeyInputs.from_json(json.loads(row["inputs"]))
            key = CacheKey.parse(str(row["key"]))
            extra = json.loads(row["provenance"])
            filename = str(row["filename"])
            if not isinstance(extra, dict) or "/" in filename or "\\" in filename or filename in ("", ".", ".."):
                raise ValueError("bad provenance or file name")
            entry = self._entry_from(
                key=key, inputs=inputs, filename=filename, sha=str(row["sha256"]), size=int(row["size_bytes"]),
                has_log=bool(row["has_log"]), created=float(row["created_at"]), used=float(row["last_used_at"]),
                extra=extra,
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise CacheError(
                f"a row of the cache database is damaged: {str(row['key'])[:80]!r}",
                cause=f"{self.db_path}: {exc}",
                hint="run `attnforge cache verify`: it moves damaged entries to quarantine",
            ) from None
        expected = CacheKey.of(inputs)
        if expected != key:
            problem = f"its key {key} is not the hash of its recorded inputs ({expected}): the database was altered"
            return dataclasses.replace(entry, problem=problem)
        return entry

    def _entry_from(
        self, *, key: CacheKey, inputs: CacheKeyInputs, filename: str, sha: str, size: int, has_log: bool,
        created: float, used: float, extra: Mapping[str, Any],
    ) -> Entry:
        folder = self.artifacts_dir / key.digest
        return Entry(
            key=str(key), inputs=inputs, filename=filename, sha256=sha, size_bytes=size,
            path=str(folder / filename), log_path=str(folder / BUILD_LOG) if has_log else None,
            created_at_s=created, last_used_at_s=used, provenance=dict(extra),
        )
