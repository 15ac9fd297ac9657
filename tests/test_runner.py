"""``SubprocessRunner``, the one place attnforge starts processes: its child never outlives the wait for it."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import psutil
import pytest

from attnforge._system.runner import NOT_FOUND, TIMED_OUT, SubprocessRunner

#: a child that starts a grandchild holding its stdout/stderr pipes open for 8 s, then sleeps
_PARENT_OF_A_SLEEPER = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
                        "'import time; time.sleep(8)']); time.sleep(60)")


def _our_children_since(start: float) -> list[psutil.Process]:
    return [c for c in psutil.Process().children() if c.create_time() >= start - 1]


@pytest.mark.usefixtures("ctrl_c_raises")
def test_ctrl_c_kills_and_reaps_the_child_even_when_a_grandchild_holds_its_pipes() -> None:
    started = time.time()
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
    t0 = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        SubprocessRunner().run([sys.executable, "-c", _PARENT_OF_A_SLEEPER], timeout_s=60)
    timer.join()
    assert time.monotonic() - t0 < 6  # not held up by the grandchild's 8 s on the pipes
    assert _our_children_since(started) == []  # killed and reaped: no zombie left behind


def test_a_timeout_is_a_result_not_an_exception() -> None:
    done = SubprocessRunner().run([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"],
                                  timeout_s=2)
    assert done.returncode == TIMED_OUT and "timed out after 2" in done.stderr
    assert "started" in done.stdout


def test_a_timeout_is_not_held_up_by_a_grandchild_holding_the_pipes() -> None:
    started = time.time()
    t0 = time.monotonic()
    done = SubprocessRunner().run([sys.executable, "-c", _PARENT_OF_A_SLEEPER], timeout_s=1.5)
    assert done.returncode == TIMED_OUT
    assert time.monotonic() - t0 < 6  # the grandchild sleeps 8 s with the pipes open
    assert _our_children_since(started) == []


def test_a_missing_program_is_a_result_not_an_exception() -> None:
    done = SubprocessRunner().run(["attnforge-no-such-program-here"])
    assert done.returncode == NOT_FOUND and "attnforge-no-such-program-here" in done.stderr
