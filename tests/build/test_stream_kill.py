"""``kill_tree``: what ``stop`` does on Windows after the grace period (there is no process-group kill there).

The function is platform-neutral (psutil), so it is exercised here on a real parent with a real grandchild.
"""

from __future__ import annotations

import subprocess
import sys

import psutil

from attnforge.build.stream import kill_tree

_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def test_kill_tree_kills_the_child_and_its_descendants() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert parent.stdout is not None
        grandchild = int(parent.stdout.readline())
        assert psutil.pid_exists(grandchild)
        kill_tree(parent.pid)
        parent.wait(timeout=10)  # kill_tree has reaped it already (psutil.wait_procs); this must not hang
        gone = not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
        assert gone, "the grandchild outlived kill_tree"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def test_kill_tree_of_a_finished_process_is_a_no_op() -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    kill_tree(done.pid)  # must not raise
