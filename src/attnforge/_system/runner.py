"""Subprocesses behind one protocol, so tests can replay real recorded outputs (pypa/build's ``runner=``)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

#: Return code reported when the program does not exist (as a shell would).
NOT_FOUND = 127
#: Return code reported when the program ran past its timeout (as coreutils ``timeout`` does).
TIMED_OUT = 124


@dataclass(frozen=True, slots=True, kw_only=True)
class Completed:
    """The outcome of one subprocess.

    Attributes:
        argv: what was run.
        returncode: the exit status; ``NOT_FOUND`` (127) if the program is missing, ``TIMED_OUT`` (124) on timeout.
        stdout: decoded standard output (UTF-8, undecodable bytes replaced).
        stderr: decoded standard error.
        duration_s: wall time in seconds.
    """

    argv: tuple[str, ...]
    returncode: int
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def output(self) -> str:
        """stdout and stderr together, for parsers that do not care which stream a line came on."""
        return self.stdout + ("\n" if self.stdout and self.stderr else "") + self.stderr


class Runner(Protocol):
    """Runs one program to completion. Never raises for a missing program or a timeout."""

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Completed: ...


class SubprocessRunner:
    """The real runner: a child with captured text output (:class:`subprocess.Popen` + ``communicate``). The child
    never outlives the wait for it: on a timeout, Ctrl-C or SIGTERM (:class:`~attnforge._system.interrupt.
    Interrupted`) it is killed and reaped before the call returns or raises (``subprocess.run`` leaves a
    Ctrl-C'd child unreaped, assuming the terminal's SIGINT reached it too)."""

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Completed:
        argv_t = tuple(str(a) for a in argv)
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv_t,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except FileNotFoundError as exc:
            return Completed(argv=argv_t, returncode=NOT_FOUND, stderr=str(exc))
        except PermissionError as exc:
            return Completed(argv=argv_t, returncode=126, stderr=str(exc))
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            if os.name == "nt":  # as subprocess.run: Windows collects the output only after the kill
                proc.kill()
                out = proc.communicate()[0]
            else:  # POSIX: the output so far travels on the exception
                _stop(proc)
                out = exc.stdout if isinstance(exc.stdout, bytes) else b""
            return Completed(
                argv=argv_t,
                returncode=TIMED_OUT,
                stdout=out.decode("utf-8", "replace"),
                stderr=f"timed out after {timeout_s} s",
                duration_s=time.monotonic() - start,
            )
        except BaseException:
            _stop(proc)
            raise
        return Completed(
            argv=argv_t,
            returncode=proc.returncode,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            duration_s=time.monotonic() - start,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill and reap ``proc`` without reading its pipes to the end: a grandchild that inherited them must not
    hold up a timeout or Ctrl-C. On Windows the pipes stay open (their reader threads hold them)."""
    proc.kill()
    proc.wait()
    if os.name != "nt":
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def run_attached(argv: Sequence[str], *, env: Mapping[str, str] | None = None, stdout: IO[str] | None = None) -> int:
    """Run a program with its output going straight to this terminal (or ``stdout``), for commands the user
    watches (``attnforge cargo-env -- cargo build``); returns the exit status.

    Raises:
        FileNotFoundError: the program does not exist.
    """
    return subprocess.run(list(argv), env=dict(env) if env is not None else None, stdout=stdout,
                          check=False).returncode


def which(name: str, environ: Mapping[str, str]) -> Path | None:
    """Find ``name`` on ``environ['PATH']`` (not on this process's PATH), like :func:`shutil.which`."""
    import shutil

    found = shutil.which(name, path=environ.get("PATH", os.defpath))
    return Path(found) if found else None
