"""``attnforge cache``: list, show, rm, prune, export, import, verify and repair the artifact store."""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from attnforge.cli._output import console, emit_json, json_option
from attnforge.cli._types import NamedPath
from attnforge.errors import UsageError

if TYPE_CHECKING:
    from attnforge.provision.cache import (
        Entry,
        ExportResult,
        ImportResult,
        NewerDatabaseError,
        RepairResult,
        VerifyReport,
    )

_DURATION_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE_BYTES = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
#: SQLite's integers (the sizes the store sums) end below 2**63
_MAX_SIZE_BYTES = 2**63


def parse_duration_s(text: str) -> float:
    """``"30d"`` -> 2592000.0; units s, m, h, d, w.

    Raises:
        UsageError: not a number followed by one of those units.
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    if match is None:
        raise UsageError(f"not a duration: {text!r}", hint="write it like 30d, 12h or 2w")
    return float(match.group(1)) * _DURATION_S[match.group(2)]


def parse_size_bytes(text: str) -> int:
    """``"20GB"`` -> 20000000000 (decimal units; ``GiB`` and friends are binary); ``"0"`` needs no unit.

    Raises:
        UsageError: not a number followed by a size unit (a bare number other than 0 is ambiguous).
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b)?\s*", text.lower())
    if match is not None and match.group(2) is None and Decimal(match.group(1)) == 0:
        return 0
    if match is None or match.group(2) not in _SIZE_BYTES:
        raise UsageError(f"not a size: {text!r}", hint="write it like 20GB, 500MB or 8GiB (0 needs no unit)")
    # exact decimal arithmetic: a float made 400 nines infinite (OverflowError) and 0.5b zero (an emptied cache)
    value = Decimal(match.group(1)) * _SIZE_BYTES[match.group(2)]
    if value >= _MAX_SIZE_BYTES or 0 < value < 1:
        raise UsageError(f"not a size a disk holds: {text[:40]!r}",
                         hint="write it like 20GB, 500MB or 8GiB, at least 1B (0: remove everything)")
    return int(value)


def entry_json(entry: Entry) -> dict[str, Any]:
    """One entry as JSON: key, what it is, where it lives, and everything its key was computed from."""
    return {
        "key": entry.key,
        "kind": entry.kind.value,
        "name": entry.name,
        "version": entry.version,
        "filename": entry.filename,
        "sha256": entry.sha256,
        "size_bytes": entry.size_bytes,
        "path": entry.path,
        "log_path": entry.log_path,
        "created_at": _iso(entry.created_at_s),
        "last_used_at": _iso(entry.last_used_at_s),
        "inputs": entry.inputs.to_json(),
        "provenance": dict(entry.provenance),
    }


def _iso(seconds: float) -> str:
    """UTC ISO 8601; a time no calendar holds (a row edited by hand: ``1e300``) as ``invalid time <value>``, not a
    crash of ``cache list`` and ``cache show`` (CLI fuzz, 2026-12-03)."""
    try:
        return _dt.datetime.fromtimestamp(seconds, tz=_dt.timezone.utc).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return f"invalid time {seconds!r}"


def _size(size_bytes: int) -> str:
    """Decimal units, as disks are sold and as --max-size reads them."""
    value = float(size_bytes)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


@click.group("cache")
def command() -> None:
    """The artifact cache: built wheels and libraries, keyed by everything that changes the binary."""


@command.command("list")
@json_option
def list_(as_json: bool) -> int:
    """Every entry, newest first."""
    from attnforge.provision.cache import list_entries

    listing = list_entries()
    entries, root = listing.entries, listing.root
    if as_json:
        emit_json("cache.list", {"root": str(root), "entries": [entry_json(e) for e in entries]})
        return 0
    from rich import box
    from rich.table import Table

    out = console()
    if not entries:
        out.print(f"the cache at {root} is empty")
        return 0
    out.print(f"cache: {root}")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("key", "name", "version", "archs", "torch", "size", "last used"):
        table.add_column(col, no_wrap=col in ("key", "name"))
    for e in entries:
        archs = ",".join(f"{a}.{b}" for a, b in e.inputs.archs) or "-"
        torch = e.inputs.torch_version or "-"
        used = _iso(e.last_used_at_s)[:10]
        table.add_row(e.key[7:19], e.name, e.version, archs, torch, _size(e.size_bytes), used)
    out.print(table)
    total = sum(e.size_bytes for e in entries)
    out.print(f"{len(entries)} entries, {_size(total)}")
    return 0


@command.command("show")
@click.argument("key")
@json_option
def show(key: str, as_json: bool) -> int:
    """One entry in full (KEY may be a unique prefix)."""
    from attnforge.provision.cache import show as show_entry

    entry = show_entry(key)
    doc = entry_json(entry)
    if as_json:
        emit_json("cache.show", doc)
        return 0
    out = console()
    for field in ("key", "kind", "name", "version", "filename", "sha256", "size_bytes", "path", "log_path",
                  "created_at", "last_used_at"):
        out.print(f"[bold]{field}[/bold]: {doc[field]}")
    _print_mapping(out, "built from", doc["inputs"])
    if doc["provenance"]:
        _print_mapping(out, "provenance", doc["provenance"])
    return 0


def _print_mapping(out: Any, title: str, mapping: Mapping[str, Any]) -> None:
    """``title:`` in bold, then one indented ``name: value`` line per item."""
    out.print(f"[bold]{title}[/bold]:")
    for name, value in mapping.items():
        out.print(f"  {name}: {value}")


@command.command("rm")
@click.argument("key")
@json_option
def rm(key: str, as_json: bool) -> int:
    """Delete one entry (KEY may be a unique prefix)."""
    from attnforge.provision.cache import remove

    entry = remove(key)
    if as_json:
        emit_json("cache.rm", {"removed": entry_json(entry)})
    else:
        console().print(f"removed {entry.key} ({entry.filename}, {_size(entry.size_bytes)})")
    return 0


@command.command("prune")
@click.option("--older-than", "older_than", default=None, metavar="AGE",
              help="Remove entries not used for AGE (30d, 12h, 2w).")
@click.option("--max-size", "max_size", default=None, metavar="SIZE",
              help="Then remove least recently used entries until the cache holds at most SIZE (20GB, 8GiB; "
                   "0 removes every entry).")
@json_option
def prune(older_than: str | None, max_size: str | None, as_json: bool) -> int:
    """Free space: old entries, then least recently used ones over a size budget; also clears debris.

    `--max-size 0` empties the cache (the store keeps no pinned entries).
    """
    older_s = parse_duration_s(older_than) if older_than is not None else None
    max_bytes = parse_size_bytes(max_size) if max_size is not None else None
    from attnforge.provision.cache import prune as run_prune

    result = run_prune(older_than_s=older_s, max_size_bytes=max_bytes)
    if as_json:
        emit_json("cache.prune", {
            "removed": [entry_json(e) for e in result.removed], "freed_bytes": result.freed_bytes,
            "kept_bytes": result.kept_bytes, "debris_removed": list(result.debris_removed),
        })
        return 0
    out = console()
    for e in result.removed:
        out.print(f"removed {e.key[:19]} {e.filename} ({_size(e.size_bytes)})")
    out.print(f"freed {_size(result.freed_bytes)}; {_size(result.kept_bytes)} kept")
    return 0


@command.command("export")
@click.argument("dest", type=NamedPath(path_type=Path, file_okay=False))
@json_option
def export(dest: Path, as_json: bool) -> int:
    """Write every entry and a PEP 503 index into DEST (serve it from any static file server or bucket).

    Exit code 1 when an entry could not be exported.
    """
    from attnforge.provision.cache import export as run_export

    result = run_export(dest)
    _emit("cache.export", result, as_json, _print_export)
    return 1 if result.errors else 0


@command.command("import")
@click.argument("source", type=NamedPath(path_type=Path, file_okay=False, exists=True))
@json_option
def import_(source: Path, as_json: bool) -> int:
    """Merge an export directory or another cache into this one; every file's hash and key are checked.

    Exit code 1 when anything was rejected.
    """
    from attnforge.provision.cache import import_ as run_import

    result = run_import(source)
    _emit("cache.import", result, as_json, _print_import)
    return 1 if result.rejected else 0


@command.command("verify")
@json_option
def verify(as_json: bool) -> int:
    """Re-hash every entry and re-check its key against its recorded inputs; quarantine what fails.

    Exit code 1 when anything failed.
    """
    from attnforge.provision.cache import verify as run_verify

    report = run_verify()
    _emit("cache.verify", report, as_json, _print_verify)
    return 1 if report.problems or report.database != "ok" or report.unindexed else 0


@command.command("repair")
@json_option
def repair(as_json: bool) -> int:
    """Rebuild cache.db from the artifacts on disk and start a new records.db if it is damaged.

    A damaged, foreign or empty cache.db is moved aside (never deleted) and every artifact whose key and
    sha256 still check out is indexed again: nothing is rebuilt. Artifacts that fail go to quarantine.
    A damaged records.db is moved aside too (verify and bench results are re-measurable). A database a newer
    attnforge wrote is not damage: it is left in place, unchanged, and named with the fix (upgrade attnforge,
    or use another ATTNFORGE_HOME). Exit code 1 when an artifact was quarantined or a newer database was left
    in place: what repair could not make right here.
    """
    from attnforge.provision.cache import repair as run_repair

    repaired = run_repair()
    result, records_moved, newer = repaired.cache, repaired.records_moved_to, repaired.left_in_place
    if as_json:
        emit_json("cache.repair", {
            "result": result, "records_moved_to": None if records_moved is None else str(records_moved),
            "left_in_place": [{"path": str(e.path), "schema_version": e.found, "reads_up_to": e.known,
                               "message": e.message, "hint": e.hint} for e in newer]})
    else:
        _print_repair(console(), result, records_moved, newer)
    return 1 if newer or (result is not None and result.quarantined) else 0


def _print_repair(out: Any, result: RepairResult | None, records_moved: Path | None,
                  newer: tuple[NewerDatabaseError, ...]) -> None:
    if result is not None and result.database_moved_to is not None:
        out.print(f"cache.db was damaged ({result.damage}); moved to {result.database_moved_to}")
    elif result is not None and result.damage is not None:
        out.print(f"cache.db was missing ({result.damage}); a new one was created")
    if result is not None:
        out.print(f"indexed {len(result.indexed)} artifacts from disk, {result.kept} already indexed, "
                  f"{len(result.quarantined)} quarantined, in {result.root}")
        for line in result.quarantined:
            out.print(f"[red]quarantined[/red] {line}")
    if records_moved is not None:
        out.print(f"records.db was damaged; moved to {records_moved} (run `attnforge verify` and "
                  "`attnforge bench` to measure again)")
    from rich.markup import escape

    for exc in newer:  # one line each, unwrapped: the path and the versions are read together
        out.print(f"[yellow]left in place[/yellow], unchanged: {escape(exc.message)}", soft_wrap=True)
    if newer:
        out.print(f"hint: {newer[0].hint}", soft_wrap=True)


def _emit(kind: str, result: Any, as_json: bool, render: Callable[[Any, Any], None]) -> None:
    """One result, as JSON or for people; the exit code is the caller's and never depends on the format."""
    if as_json:
        emit_json(kind, result)
    else:
        render(console(), result)


def _print_export(out: Any, result: ExportResult) -> None:
    out.print(f"exported {len(result.exported)} new, {len(result.already)} already there, to {result.dest}")
    for line in result.skipped:
        out.print(f"[yellow]skipped[/yellow] {line}")
    for line in result.errors:
        out.print(f"[red]error[/red] {line}")
    out.print(f"install from it with: pip install --index-url {result.index_url} NAME")
    if result.errors:
        out.print(f"hint: {len(result.errors)} entries were not exported; `attnforge cache verify` moves damaged "
                  "entries to quarantine")


def _print_import(out: Any, result: ImportResult) -> None:
    out.print(f"imported {len(result.imported)} new, {len(result.already)} already here, from {result.source}")
    for line in result.rejected:
        out.print(f"[red]rejected[/red] {line}")
    if result.rejected:
        out.print(f"error: {len(result.rejected)} entries were rejected and not imported")
        out.print("hint: each is kept in quarantine with a reason.txt; re-export them from a trusted cache")


def _print_verify(out: Any, report: VerifyReport) -> None:
    out.print(f"checked {report.checked} entries in {report.root}: {len(report.ok)} ok, "
              f"{len(report.problems)} bad; database: {report.database}")
    for p in report.problems:
        where = f"moved to {p.moved_to}" if p.moved_to else "left in place (read-only cache)"
        out.print(f"[red]bad[/red] {p.key[:19]} {p.filename}: {p.problem}; {where}")
    if report.unindexed:
        out.print(f"[red]unindexed[/red] {len(report.unindexed)} artifacts on disk have no row in cache.db: "
                  f"{', '.join(d[:12] for d in report.unindexed[:5])}")
    if report.unindexed or report.database != "ok":
        out.print("hint: `attnforge cache repair` rebuilds the database from the artifacts on disk")
