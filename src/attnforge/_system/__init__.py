"""The seams: the only code that touches the operating system (subprocesses, environment, filesystem, clock)."""

from attnforge._system.runner import Completed, Runner, SubprocessRunner

__all__ = ["Completed", "Runner", "SubprocessRunner"]
