"""Sharing the store: export it as a PEP 503 simple index, import an export or another cache.

An export directory is served as is by any static file server or bucket::

    DIR/simple/index.html                    the project list (PEP 503)
    DIR/simple/<normalized-name>/index.html  one link per wheel, with a ``#sha256=`` fragment
    DIR/artifacts/<digest>/                  artifact, provenance.json, build.log (the cache's own layout)

so ``pip install --index-url file://DIR/simple NAME`` (or ``uv pip install``) installs from it, and
``attnforge cache import DIR`` recovers full cache entries (keys, provenance, logs) from it. Exporting into a
directory that already holds an export adds to it and rewrites the index from everything there; a PEP 503 index
that was there before keeps its projects and links (the pages are merged: attnforge writes only the links into its
own ``artifacts/``). The store's own directory is never an export's destination.
Source of the index format: PEP 503 (https://peps.python.org/pep-0503/).
"""

from __future__ import annotations

import datetime as _dt
import html
import html.parser
import os
import stat
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import filelock
from packaging.utils import canonicalize_name

from attnforge._system.files import open_nofollow, refuse_symlinked_dir, write_atomic
from attnforge._system.statedb import DamagedDatabaseError, NewerDatabaseError
from attnforge.cache._db import check_root
from attnforge.cache._files import (
    copy_hashed,
    fsync_dir,
    is_no_space,
    no_space_error,
    remove_tree,
    sha256_file,
)
from attnforge.cache._provenance import (
    BUILD_LOG,
    MAX_LOG_BYTES,
    MAX_PROVENANCE_BYTES,
    MAX_WHEEL_BYTES,
    provenance_problem,
    read_provenance,
    regular_file_problem,
)
from attnforge.cache.key import ArtifactKind, CacheKey, CacheKeyInputs
from attnforge.cache.store import STAGING_PREFIX, Store
from attnforge.errors import CacheError, UsageError


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportResult:
    """What ``export`` wrote.

    Attributes:
        index_url: the ``file://`` URL to give pip's ``--index-url``.
        exported: keys copied by this call; ``already``: keys that were there, intact.
        projects: the normalized project names in the index.
        skipped: one line per artifact left out of the index (duplicate file name).
        errors: one line per entry that could not be exported (corrupt artifact or provenance); the CLI
            exits 1 when there are any.
    """

    dest: str
    index_url: str
    exported: tuple[str, ...]
    already: tuple[str, ...]
    projects: tuple[str, ...]
    skipped: tuple[str, ...]
    errors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportResult:
    """What ``import_`` merged: new keys, keys already present, every rejected artifact with its reason."""

    source: str
    imported: tuple[str, ...]
    already: tuple[str, ...]
    rejected: tuple[str, ...]


#: Seconds an export waits for another export into the same directory before giving up with a message.
EXPORT_LOCK_TIMEOUT_S = 120.0


def export(store: Store, dest: Path, *, lock_timeout_s: float = EXPORT_LOCK_TIMEOUT_S) -> ExportResult:
    """Copy every intact entry of ``store`` into ``dest`` and (re)write the PEP 503 index there.

    ``dest`` may be shared with other users: every file is created exclusively under a fresh name and no
    symlink inside ``dest`` is followed (a planted one stops the export with a message instead).

    Raises:
        UsageError: ``dest`` is the store's own directory, inside it, or holds it where the export writes.
        CacheError: the store's ``cache.db`` cannot be read (nothing is made under ``dest``); the disk under
            ``dest`` is full (files already copied stay valid; the index is rewritten
            only after every copy succeeded), a symlink was planted in ``dest``, or the export lock is held by
            another export (or owned by another user) for longer than ``lock_timeout_s``.
    """
    dest = Path(dest).absolute()
    _refuse_the_store(store, dest)
    for part in (dest, dest / "artifacts", dest / "simple"):
        refuse_symlinked_dir(part)
    # the store's entries before anything is made under dest: a cache.db that cannot be read (damaged, a newer
    # attnforge's) left an empty export directory and its lock file behind (review, 2026-12-02)
    entries = store.list()
    try:
        (dest / "artifacts").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheError(f"cannot create the export directory {dest}", cause=str(exc),
                         hint="choose a directory you can write to") from None
    exported: list[str] = []
    already: list[str] = []
    skipped: list[str] = []
    errors: list[str] = []
    with _export_lock(dest, lock_timeout_s):
        for entry in entries:
            try:
                path = store.get(entry.key)  # re-hashes; a corrupt entry is quarantined, not exported
            except CacheError as exc:
                errors.append(f"{entry.key} ({entry.filename}): {exc.message}")
                continue
            bad = provenance_problem(path.parent, key=entry.key, sha256=entry.sha256, filename=entry.filename,
                                     inputs=entry.inputs.to_json())
            if bad is not None:
                errors.append(f"{entry.key} ({entry.filename}): not exported: {bad} "
                              "(run `attnforge cache verify`)")
                continue
            target = dest / "artifacts" / CacheKey.parse(entry.key).digest
            refuse_symlinked_dir(target)  # planted by someone else: never write through or replace it
            if _already_exported(target, entry.filename, entry.sha256):
                already.append(entry.key)
                continue
            try:
                _copy_entry(path.parent, target)
            except OSError as exc:
                if is_no_space(exc):
                    raise no_space_error(f"export {entry.filename}", dest, exc) from None
                raise
            exported.append(entry.key)
        projects, dupes = write_index(dest)
    return ExportResult(
        dest=str(dest), index_url=(dest / "simple").as_uri(), exported=tuple(exported),
        already=tuple(already), projects=tuple(projects), skipped=(*skipped, *dupes), errors=tuple(errors),
    )


def _refuse_the_store(store: Store, dest: Path) -> None:
    """Refuse an export into the store (``$ATTNFORGE_HOME``) or over it: its ``artifacts/`` are the store's own
    entries, which an export would replace, and its index pages would land in the cache."""
    from attnforge._system.files import resolve_user_path

    hint = "export into a real directory outside ATTNFORGE_HOME, e.g. `attnforge cache export ./wheelhouse`"
    home = resolve_user_path(store.root, what="ATTNFORGE_HOME", hint="point ATTNFORGE_HOME at a real directory")
    target = resolve_user_path(dest, what="the export destination", hint=hint)
    written = (target, target / "artifacts", target / "simple")
    if target == home or home in target.parents or any(w == home or w in home.parents for w in written[1:]):
        raise UsageError(
            f"cannot export into {dest}: it is the attnforge cache ({home}) or overlaps it",
            cause="an export writes artifacts/ and simple/ into its destination, which would overwrite the "
                  "cache's own entries",
            hint="export into a directory outside ATTNFORGE_HOME, e.g. `attnforge cache export ./wheelhouse`",
        )


def _refuse_the_store_as_source(store: Store, source: Path) -> None:
    """Refuse an import whose source is the store itself (``$ATTNFORGE_HOME``, by any path or link to it): each of its
    entries would be stored over its own folder, and an entry without its row (what ``cache verify`` calls
    unindexed) was removed before it was read, lost for ``cache repair`` too (CLI fuzz, 2026-12-03)."""
    from attnforge._system.files import resolve_user_path

    home = resolve_user_path(store.root, what="ATTNFORGE_HOME", hint="point ATTNFORGE_HOME at a real directory")
    artifacts = (source / "artifacts").resolve() if (source / "artifacts").exists() else None
    if source == home or (artifacts is not None and artifacts == (home / "artifacts").resolve()):
        raise UsageError(
            f"cannot import {source}: it is the attnforge cache itself ({home})",
            cause="an import stores each entry of its source into the cache, here over the entry's own folder",
            hint="`attnforge cache repair` indexes the cache's own entries that lost their rows; import takes an "
                 "export directory or another ATTNFORGE_HOME",
        )


def _already_exported(target: Path, filename: str, sha256: str) -> bool:
    if regular_file_problem(target / filename, MAX_WHEEL_BYTES) is not None:
        return False
    return sha256_file(target / filename) == sha256


@contextmanager
def _export_lock(dest: Path, timeout_s: float) -> Iterator[None]:
    path = dest / ".attnforge-export.lock"
    try:
        with filelock.FileLock(str(path), timeout=timeout_s):
            yield
    except filelock.Timeout:
        raise CacheError(
            f"another export into {dest} has held its lock for over {timeout_s:.0f} s",
            cause=f"lock file {path}{_owner(path)}",
            hint="wait for it to finish; if no export is running, the lock is stale: remove that file",
        ) from None
    except PermissionError as exc:
        raise CacheError(
            f"cannot take the export lock in {dest}",
            cause=f"{exc.strerror}: {path}{_owner(path)}",
            hint="remove the stale lock file (ask its owner), or export into a directory of your own",
        ) from None


def _owner(path: Path) -> str:
    try:
        uid = os.lstat(path).st_uid
    except OSError:
        return ""
    try:
        import pwd

        return f" (owned by {pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f" (owned by uid {uid})"


def _copy_entry(src_dir: Path, target: Path) -> None:
    staging = target.parent / f"{STAGING_PREFIX}{target.name[:16]}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        for child in src_dir.iterdir():
            if stat.S_ISREG(os.lstat(child).st_mode):  # never a symlink, never what one points at
                copy_hashed(child, staging / child.name)
        remove_tree(target)
        os.replace(staging, target)
        fsync_dir(target.parent)
    except BaseException:
        remove_tree(staging)
        raise


def write_index(dest: Path) -> tuple[list[str], list[str]]:
    """Write ``dest/simple`` from every ``dest/artifacts/*/provenance.json``; returns (projects, skipped).

    Two different entries with the same wheel file name (e.g. built for different archs without a local
    version label) cannot both be in one index, since pip picks among links by file name: the newest wins and
    the others are reported. The pages of an index that was there before are merged, not replaced: its projects
    stay on the root page and its links (those not into ``artifacts/``) on each project page, unless one has the
    file name of an exported wheel (reported too).
    """
    by_project: dict[str, dict[str, tuple[str, dict[str, Any]]]] = defaultdict(dict)
    skipped: list[str] = []
    for digest_dir, doc in _exported_entries(dest):
        why = _not_indexable(dest / "artifacts" / digest_dir, doc)
        if why is not None:
            if why:
                skipped.append(f"{digest_dir}: not in the index: {why}")
            continue
        name = canonicalize_name(doc["inputs"]["name"])
        previous = by_project[name].get(doc["filename"])
        if previous is not None:
            older, newer = sorted([previous, (digest_dir, doc)], key=lambda p: str(p[1]["created_at"]))
            by_project[name][doc["filename"]] = newer
            skipped.append(f"{older[1]['key']} ({doc['filename']}): same file name as {newer[1]['key']}")
            continue
        by_project[name][doc["filename"]] = (digest_dir, doc)
    simple = dest / "simple"
    refuse_symlinked_dir(simple)
    simple.mkdir(parents=True, exist_ok=True)
    for project, files in by_project.items():
        links = [
            f'<a href="../../artifacts/{digest}/{quote(fn)}#sha256={doc["sha256"]}">'
            f"{html.escape(fn)}</a><br/>"
            for fn, (digest, doc) in sorted(files.items())
        ]
        refuse_symlinked_dir(simple / project)
        (simple / project).mkdir(exist_ok=True)
        for text, attrs in _anchors(simple / project / "index.html"):
            if attrs.get("href", "").startswith(_OWN_HREF):
                continue  # a link of an earlier export: written again above from artifacts/
            if text in files:
                skipped.append(f"{project}: the index's own link to {text} was replaced by the exported one")
                continue
            links.append(_anchor(text, attrs))
        write_atomic(simple / project / "index.html", _page(f"Links for {project}", links).encode())
    projects = sorted(by_project)
    root_links = [f'<a href="{quote(n)}/">{html.escape(n)}</a><br/>' for n in projects]
    root_links += [_anchor(text, attrs) for text, attrs in _anchors(simple / "index.html")
                   if canonicalize_name(text) not in by_project]  # the projects of an index that was there
    write_atomic(simple / "index.html", _page("Simple index", root_links).encode())
    return projects, skipped


def _not_indexable(folder: Path, doc: dict[str, Any]) -> str | None:
    """Why the entry ``folder`` (its ``provenance.json`` read as ``doc``) gets no link in the index: ``""`` for an
    artifact that is not a wheel, a reason for a provenance whose fields are not what an export writes or whose wheel
    is not there, None for a wheel to link. The destination may hold folders no export of ours wrote: a
    ``provenance.json`` with a list for ``inputs`` or without ``filename`` crashed ``cache export`` after it had
    copied the artifacts, and one naming a missing wheel got a link to it, exit 0 (CLI fuzz, 2026-12-03)."""
    inputs = doc.get("inputs")
    if not isinstance(inputs, dict):
        return "its provenance.json has no inputs object"
    if inputs.get("kind") != ArtifactKind.WHEEL.value:
        return ""
    filename, sha256, key = doc.get("filename"), doc.get("sha256"), doc.get("key")
    fields = (inputs.get("name"), filename, sha256, key)
    if not all(isinstance(f, str) and f for f in fields) or not isinstance(doc.get("created_at", ""), str):
        return "its provenance.json lacks a field an export writes (name, filename, sha256, key, created_at)"
    name, digest = str(filename), str(sha256)  # strings, checked above
    if "/" in name or "\\" in name or name in (".", "..") or len(digest) != 64 or not all(
            c in "0123456789abcdef" for c in digest):
        return f"its provenance.json names {name!r} with sha256 {digest[:16]!r}..., not a wheel of an export"
    problem = regular_file_problem(folder / name, MAX_WHEEL_BYTES)
    if problem is not None:
        return problem
    return None


#: Where the links of an exported wheel point (``simple/<project>/`` -> ``artifacts/<digest>/``).
_OWN_HREF = "../../artifacts/"
#: The largest index page read back to merge with (PyPI's largest project pages are a few MB).
_MAX_PAGE_BYTES = 64 * 1024 * 1024


class _AnchorParser(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, dict[str, str]]] = []
        self._open: dict[str, str] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._open, self._text = {k: v or "" for k, v in attrs}, []

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._open is not None:
            self.found.append(("".join(self._text).strip(), self._open))
            self._open = None


def _anchors(page: Path) -> list[tuple[str, dict[str, str]]]:
    """(text, attributes) of every link of an existing PEP 503 page; none when there is no such regular file."""
    if regular_file_problem(page, _MAX_PAGE_BYTES) is not None:
        return []
    try:
        with open_nofollow(page) as f:
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    parser = _AnchorParser()
    parser.feed(text)
    parser.close()
    return [(t, attrs) for t, attrs in parser.found if t and attrs.get("href")]


def _anchor(text: str, attrs: dict[str, str]) -> str:
    """A link as PEP 503 writes it, with every attribute it had (``data-requires-python`` and the like)."""
    rendered = "".join(f' {name}="{html.escape(value)}"' for name, value in attrs.items())
    return f"<a{rendered}>{html.escape(text)}</a><br/>"


def _page(title: str, links: list[str]) -> str:
    body = "\n".join(links)
    return (
        "<!DOCTYPE html>\n<html>\n<head>\n"
        '<meta name="pypi:repository-version" content="1.0">\n'
        f"<title>{html.escape(title)}</title>\n</head>\n<body>\n<h1>{html.escape(title)}</h1>\n"
        f"{body}\n</body>\n</html>\n"
    )


def _exported_entries(root: Path) -> list[tuple[str, dict[str, Any]]]:
    """(digest, provenance) of each sound entry directory under ``root/artifacts`` (export or cache)."""
    return [(name, doc) for name, doc, _ in _entry_dirs(root) if doc is not None]


def _entry_dirs(root: Path) -> list[tuple[str, dict[str, Any] | None, str | None]]:
    """(name, provenance or None, why not) of every entry directory under ``root/artifacts``."""
    out: list[tuple[str, dict[str, Any] | None, str | None]] = []
    base = root / "artifacts"
    if not base.is_dir():
        return out
    for child in sorted(base.iterdir()):
        if child.name.startswith("."):
            continue
        mode = os.lstat(child).st_mode
        if stat.S_ISLNK(mode):
            out.append((child.name, None, f"{child.name} is a symlink; symlinks are never followed"))
        elif stat.S_ISDIR(mode):
            doc, why = read_provenance(child)
            out.append((child.name, doc, why))
    return out


def import_(store: Store, source: Path) -> ImportResult:
    """Merge the entries of an export directory or another cache root into ``store``.

    Each entry is accepted only if its key is the hash of its recorded inputs and its file hashes to the
    recorded sha256; anything else is rejected with the reason and never stored.

    Raises:
        UsageError: ``source`` holds neither an export nor a cache (no ``artifacts/*/provenance.json``).
        CacheError: the store's disk is full.
    """
    check_root(store.root, write=True)  # a read-only cache cannot take imports: say so once, up front
    with store.writer(), store.reader("import into the cache"):
        pass  # a bad lock file or a damaged cache.db is the store's problem, said once, not each entry's
    source = Path(source).resolve()
    _refuse_the_store_as_source(store, source)
    if not (source / "artifacts").is_dir():
        raise UsageError(
            f"{source} is not an attnforge export or cache",
            cause=f"{source / 'artifacts'} does not exist",
            hint="give the directory written by `attnforge cache export DIR`, or another ATTNFORGE_HOME",
        )
    imported: list[str] = []
    already: list[str] = []
    rejected: list[str] = []
    for digest, doc, why in _entry_dirs(source):
        folder = source / "artifacts" / digest
        problem, inputs = (why, None) if doc is None else _check_provenance(folder, digest, doc)
        if problem is not None or inputs is None or doc is None:
            rejected.append(f"{folder}: {problem}; quarantined in {_quarantine_import(store, folder, str(problem))}")
            continue
        log = folder / BUILD_LOG
        log_problem = regular_file_problem(log, MAX_LOG_BYTES)
        if (log.exists() or log.is_symlink()) and log_problem is not None:
            rejected.append(f"{folder}: {log_problem}; quarantined in "
                            f"{_quarantine_import(store, folder, log_problem)}")
            continue
        raw_details = doc.get("details")
        details: dict[str, Any] = raw_details if isinstance(raw_details, dict) else {}
        try:
            result = store.put(
                folder / doc["filename"], inputs, log_path=log if log_problem is None else None,
                provenance={**details, "imported_from": str(source)}, expected_sha256=doc["sha256"],
                follow_symlinks=False,
            )
        except (CacheError, UsageError) as exc:
            if "disk space" in exc.message or isinstance(exc, (DamagedDatabaseError, NewerDatabaseError)):
                raise
            rejected.append(f"{folder}: {exc.message}; quarantined in "
                            f"{_quarantine_import(store, folder, exc.message)}")
            continue
        (imported if result.stored else already).append(result.entry.key)
    return ImportResult(
        source=str(source), imported=tuple(imported), already=tuple(already), rejected=tuple(rejected)
    )


def _quarantine_import(store: Store, folder: Path, reason: str) -> str:
    """Keep a rejected import for inspection: its small regular files and ``reason.txt`` (symlinks and files
    over the limits are only named there, never copied). Returns where, or why nothing was kept."""
    stamp = _dt.datetime.now(tz=_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    dest = store.quarantine_dir / f"import-{folder.name[:64]}-{stamp}-{uuid.uuid4().hex[:6]}"
    try:
        dest.mkdir(parents=True)
        notes = [f"imported from {folder}", reason, ""]
        for child in sorted(folder.iterdir()):
            problem = regular_file_problem(child, MAX_PROVENANCE_BYTES)
            if problem is None:
                copy_hashed(child, dest / child.name)
            else:
                notes.append(f"not copied: {problem}")
        (dest / "reason.txt").write_text("\n".join(notes) + "\n")
    except OSError as exc:
        return f"nowhere ({exc.strerror or exc})"
    return str(dest)


def _check_provenance(
    folder: Path, digest: str, doc: dict[str, Any]
) -> tuple[str | None, CacheKeyInputs | None]:
    try:
        inputs = CacheKeyInputs.from_json(doc["inputs"])
        key = CacheKey.of(inputs)
        filename = str(doc["filename"])
        recorded_sha = str(doc["sha256"])
    except (KeyError, TypeError, ValueError) as exc:
        return f"unreadable provenance.json ({exc})", None
    if str(key) != doc.get("key") or key.digest != digest:
        return f"its key {doc.get('key')} is not the hash of its recorded inputs ({key})", None
    if "/" in filename or "\\" in filename or filename.startswith(".") or not filename:
        return f"its file name {filename!r} is not a plain file name", None
    artifact = folder / filename
    file_problem = regular_file_problem(artifact, MAX_WHEEL_BYTES)
    if file_problem is not None:
        return file_problem, None
    actual = sha256_file(artifact)
    if actual != recorded_sha:
        return f"{filename} fails its hash check (sha256 {actual}, recorded {recorded_sha})", None
    return None, inputs
