"""Run one long build command: every output line goes to the log file at once and to the reporter.

A reader thread moves lines from the child's pipe into a queue, so the calling thread can send heartbeats
while a compiler step is silent and can stop the child's whole process group on Ctrl-C or SIGTERM.
The child runs in its own session (POSIX) or process group (Windows): an interrupt stops ninja, nvcc and
cicc with it, and nothing keeps writing into a directory that is being removed. On POSIX a watchdog process
holds a pipe from attnforge; if attnforge dies without releasing it (SIGKILL, OOM killer) the watchdog stops
the build's process group, so no compiler keeps running orphaned.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

import psutil

from attnforge._system.interrupt import install_sigterm, restore_sigterm
from attnforge.build.progress import (
    EtaEstimator,
    HeartbeatEvent,
    LineEvent,
    NinjaStep,
    Reporter,
    StepEvent,
    parse_step,
)

#: Seconds a stopped build gets to exit after SIGTERM before SIGKILL.
_GRACE_S = 10.0


class Launcher(Protocol):
    """Starts the build process with stdout and stderr merged into one binary pipe (the seam for tests)."""

    def __call__(
        self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]
    ) -> subprocess.Popen[bytes]: ...


def launch(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """The real launcher: own session / process group, stdin closed, stderr into stdout."""
    extra: dict[str, object] = {}
    if sys.platform == "win32":
        extra["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP
    else:
        extra["start_new_session"] = True
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        list(argv), cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, **extra,
    )


#: Run in its own session next to every POSIX build: it waits for EOF on stdin, which comes when attnforge
#: releases it (it writes "done" first) or when attnforge dies, even by SIGKILL (the kernel closes the pipe).
#: In the second case it stops the build's whole process group, so no compiler is left orphaned.
_WATCHDOG = """
import os, signal, sys, time
pgid, grace = int(sys.argv[1]), float(sys.argv[2])
if sys.stdin.buffer.read().startswith(b"done"):
    sys.exit(0)
try:
    os.killpg(pgid, signal.SIGTERM)
except OSError:
    sys.exit(0)
deadline = time.monotonic() + grace
while time.monotonic() < deadline:
    try:
        os.killpg(pgid, 0)
    except OSError:
        sys.exit(0)
    time.sleep(0.2)
try:
    os.killpg(pgid, signal.SIGKILL)
except OSError:
    pass
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamOutcome:
    """How the command ended.

    Attributes:
        returncode: the exit status.
        duration_s: wall time.
        steps_done / steps_total: the last ninja step seen (0/0 when ninja never ran).
    """

    returncode: int
    duration_s: float
    steps_done: int
    steps_total: int


def run_streamed(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    log: IO[str],
    reporter: Reporter,
    launcher: Launcher = launch,
    heartbeat_s: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
) -> StreamOutcome:
    """Run ``argv`` to the end, logging and reporting each line as it arrives.

    Args:
        argv: the command.
        cwd: its working directory.
        env: its complete environment.
        log: an open text file; each line is written and flushed before it is reported.
        reporter: receives LineEvent, StepEvent and HeartbeatEvent.
        launcher: the process seam.
        heartbeat_s: report a heartbeat after this many seconds without output (and every as many after).
        clock: monotonic seconds (a seam for tests).

    Raises:
        KeyboardInterrupt, Interrupted: the caller was interrupted; the child's process group was stopped
        first.
    """
    start = clock()
    proc = launcher(argv, cwd=cwd, env=env)
    watchdog = _start_watchdog(proc)
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_pump, args=(proc, lines), daemon=True, name="attnforge-build-reader")
    reader.start()
    eta = EtaEstimator()
    last_step: NinjaStep | None = None
    last_output = clock()
    next_beat = last_output + heartbeat_s
    previous = install_sigterm()
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.05, min(heartbeat_s, next_beat - clock())))
            except queue.Empty:
                now = clock()
                if now >= next_beat:
                    reporter.report(HeartbeatEvent(idle_s=now - last_output, elapsed_s=now - start,
                                                   last_step=last_step))
                    next_beat = now + heartbeat_s
                continue
            if line is None:
                break
            log.write(line + "\n")
            log.flush()
            now = clock()
            last_output, next_beat = now, now + heartbeat_s
            reporter.report(LineEvent(text=line))
            step = parse_step(line)
            if step is not None:
                last_step = step
                reporter.report(StepEvent(step=step, elapsed_s=now - start,
                                          eta_s=eta.update(now, step.done, step.total)))
        returncode = proc.wait()
    except BaseException:
        stop(proc)
        raise
    finally:
        _release_watchdog(watchdog)
        restore_sigterm(previous)
        reader.join(timeout=5)
        if proc.stdout is not None:
            proc.stdout.close()
    return StreamOutcome(returncode=returncode, duration_s=clock() - start,
                         steps_done=last_step.done if last_step else 0,
                         steps_total=last_step.total if last_step else 0)


def _pump(proc: subprocess.Popen[bytes], lines: queue.Queue[str | None]) -> None:
    if proc.stdout is None:
        lines.put(None)
        return
    try:
        for raw in iter(proc.stdout.readline, b""):
            lines.put(raw.decode("utf-8", "replace").rstrip("\r\n"))
    except (OSError, ValueError):  # the pipe was closed under us while stopping
        pass
    finally:
        lines.put(None)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the child and everything it started: SIGTERM to the group, SIGKILL after a grace period.

    On Windows the child's process group gets ``CTRL_BREAK_EVENT`` (the console's Ctrl-Break, which Python,
    ninja and cl.exe stop on); after the grace period every descendant is terminated and then the child
    (:func:`kill_tree`), since Windows has no signal that reaches a whole group by force.
    """
    if proc.poll() is not None:
        return
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=_GRACE_S)
    except subprocess.TimeoutExpired:
        if sys.platform == "win32":
            kill_tree(proc.pid)
        else:
            _signal_group(proc, signal.SIGKILL)
        proc.wait()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        if sys.platform == "win32":
            proc.send_signal(signal.CTRL_BREAK_EVENT)
        else:
            os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError, OSError):
        proc.kill()


def kill_tree(pid: int) -> None:
    """Kill ``pid`` and all its descendants, descendants first (found before anything is killed, so an
    orphan cannot escape). Processes that are already gone are skipped."""
    try:
        root = psutil.Process(pid)
        family = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for p in family:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            p.kill()
    psutil.wait_procs(family, timeout=_GRACE_S)


def _start_watchdog(proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes] | None:
    """Start the watchdog of ``proc``'s process group (POSIX; only when ``proc`` leads its own group)."""
    if sys.platform == "win32":
        return None
    try:
        if os.getpgid(proc.pid) != proc.pid:
            return None  # a test launcher that did not start a new session: nothing of its own to stop
        return subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(proc.pid), str(_GRACE_S)], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
    except OSError:
        return None  # the build already ended, or no process can be started: the build runs unguarded


def _release_watchdog(watchdog: subprocess.Popen[bytes] | None) -> None:
    if watchdog is None or watchdog.stdin is None:
        return
    with contextlib.suppress(OSError):
        watchdog.stdin.write(b"done")
    with contextlib.suppress(OSError):
        watchdog.stdin.close()
    try:
        watchdog.wait(timeout=5)
    except subprocess.TimeoutExpired:
        watchdog.kill()
        watchdog.wait()
