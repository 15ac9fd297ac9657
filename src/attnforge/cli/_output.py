"""Shared rendering: the rich consoles, ``--json`` envelopes and ``error:`` / ``hint:`` lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from attnforge._serde import to_jsonable
from attnforge.errors import AttnforgeError, UsageError

#: Version of every command's ``--json`` envelope; bump when a field changes meaning or disappears.
JSON_SCHEMA_VERSION = 1

#: Where to report a bug (printed with internal errors).
ISSUES_URL = "https://github.com/attnforge/attnforge/issues"


class _Mode:
    """How this command line wants its output: set once by :func:`attnforge.cli.main`."""

    as_json = False
    verbose = False
    warned_columns = False  # a bad COLUMNS is named once per command


def set_output_mode(*, as_json: bool, verbose: bool) -> None:
    _Mode.as_json = as_json
    _Mode.verbose = verbose
    _Mode.warned_columns = False


def verbose() -> bool:
    """True under ``-v``/``--verbose``."""
    return _Mode.verbose


def console(*, stderr: bool = False) -> Any:
    """A rich console; colour only on a terminal, plain text in CI logs and pipes."""
    import os
    import shutil

    from rich.console import Console

    from attnforge.cli._types import columns_from_env

    stream = sys.stderr if stderr else sys.stdout
    columns, bad = columns_from_env(os.environ)
    if bad is not None and not _Mode.warned_columns:  # a bad COLUMNS once printed nothing at all (issue 31)
        _Mode.warned_columns = True
        click.echo(f"note: {bad}", err=True)
    width = columns
    if not stream.isatty() and width is None:  # CI logs and pipes: wide enough for the doctor table
        width = max(shutil.get_terminal_size(fallback=(160, 24)).columns, 160)
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=width)  # rich skips a bad COLUMNS too


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
    """``error: ...`` / ``cause: ...`` / ``hint: ...`` on stderr; never a traceback.

    Under ``--json`` the same error is also printed on stdout as
    ``{"schema_version": 1, "kind": "error", "error": {"message", "cause", "hint", "exit_code", ...}}``.
    """
    problems = getattr(exc, "problems", ())
    log_path = getattr(exc, "log_path", None)
    if _Mode.as_json:
        error: dict[str, Any] = {"message": exc.message, "cause": exc.cause, "hint": exc.hint,
                                 "exit_code": exc.exit_code, "type": type(exc).__name__}
        if problems:
            error["problems"] = list(problems)
        if log_path:
            error["log"] = str(log_path)
        emit_json("error", {"error": error})
    click.echo(f"error: {exc.message}", err=True)
    for p in problems:
        click.echo(f"  - {p}", err=True)
    if exc.cause:
        click.echo(f"cause: {exc.cause}", err=True)
    if log_path:
        click.echo(f"log: {log_path}", err=True)
    if exc.hint:
        click.echo(f"hint: {exc.hint}", err=True)
    sys.stderr.flush()


def emit_unexpected(exc: BaseException, *, argv: list[str]) -> int:
    """Report an exception nothing else caught: ``error: internal error ...``, a log with the traceback, exit 1.

    A file-system or database fault (``OSError``, ``sqlite3.Error``) is named as such with the path involved; the
    traceback goes to ``$ATTNFORGE_HOME/logs/internal-error-*.log`` (or the temp dir when that is unusable), and
    to stderr under ``-v``.
    """
    import os
    import sqlite3
    import traceback

    from attnforge import __version__
    from attnforge._system.paths import home_dir

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    log = _write_crash_log(f"attnforge {__version__}\nargv: {argv}\n\n{text}")
    where = f"; the traceback is in {log}" if log else ""
    home = home_dir(os.environ)
    if isinstance(exc, OSError) and home.exists() and not home.is_dir():
        err: AttnforgeError = UsageError(
            f"ATTNFORGE_HOME={home} is not a directory",
            cause=f"{type(exc).__name__}: {exc.strerror or exc}",
            hint="point ATTNFORGE_HOME at a directory (it is created when missing), or unset it to use the "
                 "user cache dir",
        )
    elif isinstance(exc, OSError):
        path = exc.filename or "a file attnforge needed"
        err = AttnforgeError(
            f"cannot use {path}: {exc.strerror or exc}",
            cause=f"{type(exc).__name__} (errno {exc.errno})",
            hint="check that the path exists, is a directory where one is expected, is writable and has free "
                 f"space; ATTNFORGE_HOME=DIR moves attnforge's state elsewhere{where}",
        )
    elif isinstance(exc, sqlite3.Error):
        err = AttnforgeError(
            f"attnforge's database under ATTNFORGE_HOME could not be used: {exc}",
            cause=type(exc).__name__,
            hint=f"check free space and permissions there, or point ATTNFORGE_HOME at another directory{where}",
        )
    else:
        err = AttnforgeError(
            f"internal error: {type(exc).__name__}: {exc}",
            cause="a bug in attnforge (an exception it did not expect)",
            hint=f"please report it at {ISSUES_URL} with the command you ran{where}; `-v` prints the traceback",
        )
    if _Mode.verbose:
        click.echo(text.rstrip(), err=True)
    emit_error(err)
    return err.exit_code


def _write_crash_log(text: str) -> str | None:
    """Write ``text`` to a fresh log file; None when no directory would take it."""
    import os
    import tempfile
    import time

    from attnforge._system.paths import home_dir

    name = f"internal-error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    candidates = [home_dir(os.environ) / "logs", Path(tempfile.gettempdir())]
    for folder in candidates:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            return str(folder / name)
        except OSError:
            continue
    return None


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
