"""What the store holds: an :class:`Entry` (one artifact's metadata), the result of ``put``, and
how a row of ``cache.db`` reads back into an entry, its key re-checked against its recorded inputs.

:class:`~attnforge.cache.store.Store` does the writing, reading and removing; this module only says what an
entry is and where its files lie (``ROOT/artifacts/<digest>/``).
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnforge import _serde
from attnforge.cache._provenance import BUILD_LOG
from attnforge.cache.key import ArtifactKind, CacheKey, CacheKeyInputs
from attnforge.errors import CacheError


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


def entry_at(
    artifacts_dir: Path, *, key: CacheKey, inputs: CacheKeyInputs, filename: str, sha: str, size: int,
    has_log: bool, created: float, used: float, extra: Mapping[str, Any],
) -> Entry:
    """The entry stored under ``artifacts_dir/<digest>/``."""
    folder = artifacts_dir / key.digest
    return Entry(
        key=str(key), inputs=inputs, filename=filename, sha256=sha, size_bytes=size,
        path=str(folder / filename), log_path=str(folder / BUILD_LOG) if has_log else None,
        created_at_s=created, last_used_at_s=used, provenance=dict(extra),
    )


def entry_from_row(row: sqlite3.Row, *, artifacts_dir: Path, db_path: Path) -> Entry:
    """The entry of a row, its key re-checked against its recorded inputs (``problem`` says if not).

    Raises:
        CacheError: the row cannot be read at all (the database was damaged).
    """
    try:
        inputs = CacheKeyInputs.from_json(_serde.loads(row["inputs"]))
        key = CacheKey.parse(str(row["key"]))
        extra = _serde.loads(row["provenance"])
        filename = str(row["filename"])
        if not isinstance(extra, dict) or "/" in filename or "\\" in filename or filename in ("", ".", ".."):
            raise ValueError("bad provenance or file name")
        entry = entry_at(
            artifacts_dir, key=key, inputs=inputs, filename=filename, sha=str(row["sha256"]),
            size=int(row["size_bytes"]), has_log=bool(row["has_log"]), created=float(row["created_at"]),
            used=float(row["last_used_at"]), extra=extra,
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise CacheError(
            f"a row of the cache database is damaged: {str(row['key'])[:80]!r}",
            cause=f"{db_path}: {exc}",
            hint="run `attnforge cache verify`: it moves damaged entries to quarantine",
        ) from None
    expected = CacheKey.of(inputs)
    if expected != key:
        problem = f"its key {key} is not the hash of its recorded inputs ({expected}): the database was altered"
        return dataclasses.replace(entry, problem=problem)
    return entry
