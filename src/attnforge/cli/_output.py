"""Shared rendering: the rich consoles, ``--json`` envelopes and ``error:`` / ``hint:`` lines."""

from __future__ import annotations

import errno
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, overload

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
    """A rich console; colour only on a terminal, plain text in CI logs and pipes.

    A closed stream (``attnforge doctor >&-`` in a cron job: Python's ``sys.stdout`` is None) is no error, as for
    pip: rich then writes nowhere, and the command runs and exits as it would with its output read.
    """
    import os
    import shutil

    from attnforge.cli._types import columns_from_env

    stream = sys.stderr if stderr else sys.stdout
    columns, bad = columns_from_env(os.environ)
    if bad is not None and not _Mode.warned_columns:  # a bad COLUMNS once printed nothing at all (issue 31)
        _Mode.warned_columns = True
        click.echo(f"note: {bad}", err=True)
    width = columns
    if not _on_terminal(stream) and width is None:  # CI logs and pipes: wide enough for the doctor table
        width = max(shutil.get_terminal_size(fallback=(160, 24)).columns, 160)
    return _console_type()(stderr=stderr, highlight=False, soft_wrap=False, width=width)  # rich skips a bad COLUMNS


@functools.cache
def _console_type() -> Any:
    """rich's ``Console``, but a pipe whose reader went away raises ``BrokenPipeError`` to
    :func:`attnforge.cli.main`, which ends every command alike (rich's own ``on_broken_pipe`` exits 1 on the spot,
    which no caller can tell from a failure)."""
    from rich.console import Console

    class PipeAwareConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True  # drop the rest of the buffer
            raise BrokenPipeError(errno.EPIPE, "the reader of the pipe went away")

    return PipeAwareConsole


def _on_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal; False for a closed one (None when the descriptor was closed at start-up,
    a file object closed since)."""
    try:
        return stream is not None and bool(stream.isatty())
    except ValueError:  # I/O operation on closed file
        return False


def emit_json(kind: str, payload: Any) -> None:
    """Print ``{"schema_version": 1, "kind": KIND, ...payload}`` as JSON on stdout."""
    body = to_jsonable(payload)
    doc = {"schema_version": JSON_SCHEMA_VERSION, "kind": kind}
    if isinstance(body, dict):
        doc.update(body)
    else:
        doc["result"] = body
    click.echo(json.dumps(doc, indent=2))


def discard_stdout() -> None:
    """Point stdout's descriptor at the null device: Python flushes ``sys.stdout`` at exit, and the bytes the closed
    pipe refused would fail again there ("Exception ignored ... BrokenPipeError"). The recipe of Python's own
    documentation (``signal``, "Note on SIGPIPE"); a stream with no descriptor (a test's capture) is left alone."""
    import os

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # None, or io.UnsupportedOperation (both an OSError and a ValueError)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


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
        try:
            emit_json("error", {"error": error})
        except BrokenPipeError:  # stdout's reader went away: the error still goes to stderr, with its exit code
            discard_stdout()
    click.echo(f"error: {exc.message}", err=True)
    for p in problems:
        click.echo(f"  - {p}", err=True)
    if exc.cause:
        click.echo(f"cause: {exc.cause}", err=True)
    if log_path:
        click.echo(f"log: {log_path}", err=True)
    if exc.hint:
        click.echo(f"hint: {exc.hint}", err=True)
    if sys.stderr is not None:  # closed (``2>&-``): click.echo wrote nothing either
        sys.stderr.flush()


def emit_unexpected(exc: BaseException, *, argv: list[str]) -> int:
    """Report an exception nothing else caught: ``error: internal error ...``, a log with the traceback, exit 1.

    A file-system fault (``OSError``) is :func:`emit_os_error`'s; a database fault (``sqlite3.Error``) is named as
    such. The traceback goes to ``$ATTNFORGE_HOME/logs/internal-error-*.log`` (or the temp dir when that is
    unusable), and to stderr under ``-v``.
    """
    import sqlite3
    import traceback

    from attnforge import __version__

    if isinstance(exc, OSError):  # a file-system fault, not a bug: named with its path and the fix
        return emit_os_error(exc)
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    log = _write_crash_log(f"attnforge {__version__}\nargv: {argv}\n\n{text}")
    where = f"; the traceback is in {log}" if log else ""
    err: AttnforgeError
    if isinstance(exc, sqlite3.Error):
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


def emit_os_error(exc: OSError) -> int:
    """Report a file-system fault that reached the command line (:func:`os_error`); returns its exit code. Under
    ``-v`` the traceback goes to stderr too (no log file: the disk may be the problem)."""
    import traceback

    if _Mode.verbose:
        click.echo("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip(), err=True)
    err = os_error(exc)
    emit_error(err)
    return err.exit_code


def os_error(exc: OSError) -> AttnforgeError:
    """The user-facing error for an ``OSError`` under any verb, never an internal error: a full or read-only disk
    (:func:`attnforge.provision.cache.disk_error`); ``ATTNFORGE_HOME`` that is a file or a symlink loop (bad input,
    exit 2); a path under it this user may not write ("ATTNFORGE_HOME ... is not writable"); a file where a folder
    is needed, or a folder where a file is; else the path and the OS's reason. Each names the path and a fix."""
    import errno
    import os

    from attnforge._system.paths import home_dir
    from attnforge.provision.cache import disk_error

    disk = disk_error(exc)
    if disk is not None:
        return disk
    home = Path(os.path.abspath(home_dir(os.environ)))
    path = _os_error_path(exc)
    in_home = path is not None and (path == home or home in path.parents)
    why = exc.strerror or str(exc)
    cause = f"{type(exc).__name__} (errno {exc.errno})"
    elsewhere = "point ATTNFORGE_HOME at another folder (e.g. `export ATTNFORGE_HOME=$HOME/.af`), or unset it"
    if os.path.exists(home) and not os.path.isdir(home):
        return UsageError(f"ATTNFORGE_HOME={home} is not a directory", cause=cause,
                          hint="point ATTNFORGE_HOME at a directory (it is created when missing), or unset it to use "
                               "the user cache dir")
    if exc.errno == errno.ELOOP:
        if in_home:
            return UsageError(f"ATTNFORGE_HOME={home} cannot be used: {path} is a symlink loop (its links point back "
                              "at themselves)", cause=cause,
                              hint=f"`ls -l {home}` shows where it points: make it a real folder, or {elsewhere}")
        return AttnforgeError(f"cannot use {path}: it is a symlink loop", cause=cause,
                              hint=f"`ls -l {path}` shows where it points: remove or fix the link")
    if exc.errno in (errno.EACCES, errno.EPERM):
        if in_home:
            return AttnforgeError(f"ATTNFORGE_HOME {home} is not writable: {path}: {why}", cause=cause,
                                  hint=f"set ATTNFORGE_HOME to a writable folder (e.g. `export ATTNFORGE_HOME=$HOME/"
                                       f".af`), or give this user write access to {home}")
        return AttnforgeError(f"cannot use {path or 'a file attnforge needed'}: {why}", cause=cause,
                              hint="give this user access to it, or choose a path this user can write")
    blocker = _file_in_the_way(path) if exc.errno in (errno.ENOTDIR, errno.EEXIST) else None
    if blocker is not None:
        return AttnforgeError(f"{blocker} is a file where attnforge needs a folder", cause=f"{cause}: {why}: {path}",
                              hint=f"move it aside (`mv {blocker} {blocker}.bad`) and run the command again"
                                   + (f", or {elsewhere}" if in_home else ""))
    if exc.errno == errno.EISDIR and path is not None:
        return AttnforgeError(f"{path} is a folder where attnforge needs a file", cause=cause,
                              hint=f"move it aside (`mv {path} {path}.bad`) and run the command again")
    return AttnforgeError(
        f"cannot use {path or 'a file attnforge needed'}: {why}", cause=cause,
        hint="check that the path exists, is a directory where one is expected, is writable and has free space; "
             "ATTNFORGE_HOME=DIR moves attnforge's state elsewhere",
    )


def _os_error_path(exc: OSError) -> Path | None:
    """The absolute path an ``OSError`` names (None for a file descriptor or no name); not resolved: a symlink loop
    has no resolution."""
    import os

    name = exc.filename
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    return Path(os.path.abspath(name)) if isinstance(name, (str, os.PathLike)) else None


def _file_in_the_way(path: Path | None) -> Path | None:
    """The first of ``path`` and its parents that is there and is not a folder (a file where a folder must be)."""
    import os
    import stat

    for candidate in ([] if path is None else [path, *path.parents]):
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        return None if stat.S_ISDIR(st.st_mode) else candidate
    return None


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


def require_torch(verb: str) -> None:
    """Import torch for a verb that runs kernels (``verify``, ``bench``, ``warmup``); when it does not import, say so
    and how to install it, instead of an internal error.

    Raises:
        AttnforgeError: torch is not installed in this interpreter, or its import fails (the error's one line).
    """
    try:
        import torch  # noqa: F401 - imported for its side effect: the check
    except Exception as exc:  # any failure of the import (a missing CUDA library is an OSError)
        from attnforge.report.doctor import torch_cuda_hint
        from attnforge.verify.causes import headline

        missing = isinstance(exc, ModuleNotFoundError) and exc.name == "torch"
        python = sys.executable
        raise AttnforgeError(
            f"`attnforge {verb}` needs torch, and torch "
            + (f"is not installed in {python}" if missing else f"fails to import in {python}: {headline(exc)}"),
            cause=None if missing else f"{type(exc).__name__} while importing torch",
            hint=f"install the torch build that matches your CUDA driver into this interpreter, e.g. `{python} -m "
                 f"{torch_cuda_hint()}` (`pip install torch` on a machine without a GPU); `attnforge doctor` says "
                 "what this machine has",
        ) from None


def snapshot_option(f: Any) -> Any:
    """``--snapshot FILE``: decide for a saved machine instead of probing this one."""
    return click.option(
        "--snapshot", "snapshot_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
        help="Use a saved `attnforge probe --json` file instead of probing this machine.",
    )(f)


_F = TypeVar("_F", bound=Callable[..., Any])


@overload
def json_option(f: _F) -> _F: ...
@overload
def json_option(*, version: int = JSON_SCHEMA_VERSION) -> Callable[[_F], _F]: ...
def json_option(f: Any = None, *, version: int = JSON_SCHEMA_VERSION) -> Any:
    """``--json``, its help naming the ``schema_version`` the command prints: ``@json_option`` for the envelope's
    (:data:`JSON_SCHEMA_VERSION`), ``@json_option(version=N)`` for a document with its own (verify, bench)."""
    def apply(fn: Any) -> Any:
        return click.option("--json", "as_json", is_flag=True,
                            help=f"Print machine-readable JSON (schema_version {version}).")(fn)

    return apply if f is None else apply(f)


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
