"""Shared rendering: the rich consoles, ``--json`` envelopes and ``error:`` / ``hint:`` lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from attnforge._serde import to_jsonable
from attnforge.errors import AttnforgeError

#: Version of every command's ``--json`` envelope; bump when a field changes meaning or disappears.
JSON_SCHEMA_VERSION = 1


def console(*, stderr: bool = False) -> Any:
    """A rich console; colour only on a terminal, plain text in CI logs and pipes."""
    import os
    import shutil

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not stream.isatty():  # CI logs and pipes: wide enough for the doctor table
        width = int(os.environ.get("COLUMNS", "0") or 0) or max(shutil.get_terminal_size().columns, 160)
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=width)


def emit_json(kind: str, payload: Any) -> None:
    """Print ``{"schema_version": 1, "kind": KIND, ...payload}`` as JSON on stdout."""
    body = to_jsonable(payload)
    doc = {"schema_version": JSON_SCHEMA_VERSION, "kind": kind}
    if isinstance(body, dict):
        doc.update(body)
    else:
        doc["result"] = body
    click.echo(json.dumps(doc, indent=2))


def emit_error(exc: AttnforgeError) -> None:
    """``error: ...`` / ``cause: ...`` / ``hint: ...`` on stderr; never a traceback."""
    click.echo(f"error: {exc.message}", err=True)
    problems = getattr(exc, "problems", ())
    for p in problems:
        click.echo(f"  - {p}", err=True)
    if exc.cause:
        click.echo(f"cause: {exc.cause}", err=True)
    log_path = getattr(exc, "log_path", None)
    if log_path:
        click.echo(f"log: {log_path}", err=True)
    if exc.hint:
        click.echo(f"hint: {exc.hint}", err=True)
    sys.stderr.flush()


def snapshot_option(f: Any) -> Any:
    """``--snapshot FILE``: decide for a saved machine instead of probing this one."""
    return click.option(
        "--snapshot", "snapshot_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
        help="Use a saved `attnforge probe --json` file instead of probing this machine.",
    )(f)


def json_option(f: Any) -> Any:
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON (schema_version 1).")(f)


def load_or_probe(snapshot_path: Path | None) -> Any:
    """The snapshot from ``--snapshot``, else a fresh probe of this machine.

    Raises:
        ProbeError: the snapshot file is missing or invalid.
    """
    from attnforge.catalog import load_catalog
    from attnforge.probe import SystemSnapshot, collect_snapshot

    if snapshot_path is not None:
        return SystemSnapshot.load(snapshot_path)
    return collect_snapshot(backends=load_catalog().backends.values())
