"""What a build reports while it runs: ninja ``[n/N]`` steps, phases, heartbeats, and the reporter protocol.

The library only *reports* events; ``cli/build.py`` renders them (a rich progress bar on a terminal, plain
lines in CI logs). Everything here is pure and replayable on a recorded log.

Ninja prints ``[finished/total] description`` when it is not writing to a terminal, once per finished edge
(ninja ``src/status_printer.cc``: the status line is printed at edge *end* for non-smart terminals); with
``-v`` (which ``torch.utils.cpp_extension`` always passes) the description is the full command. Under pip the
lines are indented by two spaces, and by more when a build backend nests its output.
"""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass
from typing import Protocol

from attnforge._compat import StrEnum

_STEP = re.compile(r"^\s*\[(?P<done>\d+)/(?P<total>\d+)\]\s+(?P<command>.*)$")
_SOURCE_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c", ".mm")


@dataclass(frozen=True, slots=True, kw_only=True)
class NinjaStep:
    """One ``[done/total]`` line from ninja.

    Attributes:
        done: edges finished so far, including this one.
        total: edges in the build.
        command: the rest of the line (with ``-v``: the compiler command).
        file: the source file this step compiled, else its ``-o`` output, else None.
    """

    done: int
    total: int
    command: str
    file: str | None

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0


def parse_step(line: str) -> NinjaStep | None:
    """Parse one ninja status line, however deeply pip indented it.

    Returns:
        The step, or None for any other line (including ``[n/N]`` with ``n > N`` or ``N == 0``, which ninja
        never prints).
    """
    m = _STEP.match(line)
    if m is None:
        return None
    done, total = int(m["done"]), int(m["total"])
    if total == 0 or done > total:
        return None
    command = m["command"].strip()
    return NinjaStep(done=done, total=total, command=command, file=_step_file(command))


def _step_file(command: str) -> str | None:
    try:
        tokens = shlex.split(command, posix=True)
    except ValueError:  # an unbalanced quote in a truncated line
        tokens = [t.strip("'\"") for t in command.split()]
    sources = [t for t in tokens if t.endswith(_SOURCE_SUFFIXES) and not t.startswith("-")]
    if sources:
        return sources[-1]
    for flag, value in itertools.pairwise(tokens):
        if flag == "-o":
            return value
    return None


class Phase(StrEnum):
    """The stages of one build, in order."""

    FETCH = "fetch"  # download / clone / hash the source
    UNPACK = "unpack"  # lay the tree out under the build root (or reuse a kept one)
    BUILD = "build"  # pip wheel: metadata, compile (ninja steps), link
    STAGE = "stage"  # move the wheel to the staging dir
    DONE = "done"


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseEvent:
    """A stage started; ``detail`` says what it works on (a URL, a directory, the command)."""

    phase: Phase
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepEvent:
    """Ninja finished a step.

    Attributes:
        step: the parsed status line.
        elapsed_s: seconds since the build phase started.
        eta_s: estimated seconds left, None until two steps give a rate.
    """

    step: NinjaStep
    elapsed_s: float
    eta_s: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LineEvent:
    """One line of build output (already written to the log)."""

    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatEvent:
    """Nothing was printed for ``idle_s`` seconds: the build is alive, a long compiler step is running.

    Attributes:
        idle_s: seconds since the last output line.
        elapsed_s: seconds since the build phase started.
        last_step: the last ninja step seen (its file is the last one finished), None before the first.
    """

    idle_s: float
    elapsed_s: float
    last_step: NinjaStep | None


BuildEvent = PhaseEvent | StepEvent | LineEvent | HeartbeatEvent


class Reporter(Protocol):
    """Receives every event of a build, in order, on the thread that called ``execute``."""

    def report(self, event: BuildEvent) -> None: ...


class NullReporter:
    """Ignores everything (the default for library callers that only want the result)."""

    def report(self, event: BuildEvent) -> None:
        return None


class EtaEstimator:
    """Seconds left from the rate of ninja steps since the first one seen.

    The first step is the reference (ninja's own start-up and the metadata stage are not compile work), so the
    estimate is ``(total - done) / rate`` with ``rate = (done - done_0) / (t - t_0)``. Parallel jobs finish in
    bursts; averaging over the whole run keeps the figure steadier than a sliding window.
    """

    def __init__(self) -> None:
        self._first: tuple[float, int] | None = None
        self._last: tuple[int, int] = (0, 0)

    def update(self, now_s: float, done: int, total: int) -> float | None:
        """Feed one step; return the estimate, or None until a rate is known."""
        last_done, last_total = self._last
        self._last = (done, total)
        if self._first is None or total != last_total or done < last_done:  # another ninja run restarts
            self._first = (now_s, done)
            return None
        t0, d0 = self._first
        if done == d0 or now_s <= t0:
            return None
        rate = (done - d0) / (now_s - t0)
        return (total - done) / rate
