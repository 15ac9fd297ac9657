"""Finding the real failure in a build log, past the wrapper lines.

A failed torch-extension build ends in a pile of lines that are *consequences*: ``ninja: build stopped:
subcommand failed.``, ``RuntimeError: Error compiling objects for extension``, ``CalledProcessError``, pip's
``subprocess-exited-with-error`` box and its copy of the ``setup.py`` shim (install-anchors.md, KB-12). The
cause is in ninja's first ``FAILED:`` block: the failed target, the command, and the compiler's words under
it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FAILED = re.compile(r"^\s*FAILED:\s*(?:\[code=\d+\]\s*)?(?P<target>.*)$")
_STEP = re.compile(r"^\s*\[\d+/\d+\]\s")
_BLOCK_END = re.compile(r"^\s*(?:FAILED:|ninja: build stopped|Traceback \(most recent call last\))")
_MAX_BLOCK_LINES = 80

#: Lines that report that something failed without saying what (never a cause).
WRAPPER_PATTERNS = tuple(re.compile(p) for p in (
    r"ninja: build stopped",
    r"Error compiling objects for extension",
    r"Error building extension",
    r"CalledProcessError: Command '\['ninja'",
    r"subprocess-exited-with-error",
    r"did not run successfully",
    r"See above for output",
    r"This error originates from a subprocess",
    r"Failed building wheel for",
    r"Failed to build ",
    r"Could not build wheels for",
    r"ERROR: Failed building wheel",
    r"error: command '(?=[^'\n]*ninja)[^'\n]*' failed",  # one pass to the quote (.*ninja.* is quadratic)
    r"Precompiled wheel not found",  # FA2's wheel-URL guess: chained noise (KB-03)
    r"Guessing wheel URL",
    r"HTTP Error 404",
    r"^\s*(?:\S+\s*)?exit code: \d+",
    r"^\s*attnforge: ",  # attnforge's own header and footer lines in its logs
))


@dataclass(frozen=True, slots=True, kw_only=True)
class LogLine:
    """One line of a log; ``line`` is its number, counted from 1 like an editor does."""

    line: int
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureSite:
    """Where a log fails.

    Attributes:
        target: the output ninja could not build (``.../flash_api.o``), None without a ``FAILED:`` block.
        command: the command under ``FAILED:``, when there is one.
        block: the lines of the first ``FAILED:`` block after its command (the compiler's own words).
        rest: every line of the log that is not a wrapper line, not pip's shim source, and not a compile
        command.
    """

    target: str | None
    command: LogLine | None
    block: tuple[LogLine, ...]
    rest: tuple[LogLine, ...]


def find_failure(text: str) -> FailureSite:
    """Split a log into the first ``FAILED:`` block (if any) and the other meaningful lines."""
    lines = [LogLine(line=i, text=t) for i, t in enumerate(text.splitlines(), start=1)]
    target: str | None = None
    command: LogLine | None = None
    block: list[LogLine] = []
    start = next((i for i, ln in enumerate(lines) if _FAILED.match(ln.text)), None)
    if start is not None:
        m = _FAILED.match(lines[start].text)
        target = (m["target"].strip() or None) if m else None
        for ln in lines[start + 1 : start + 1 + _MAX_BLOCK_LINES]:
            if _BLOCK_END.match(ln.text) or _STEP.match(ln.text):
                break
            if command is None and not block and _looks_like_command(ln.text):
                command = ln
                continue
            if ln.text.strip() and not is_wrapper(ln.text):
                block.append(ln)
    return FailureSite(target=target, command=command, block=tuple(block), rest=tuple(_meaningful(lines)))


def is_wrapper(text: str) -> bool:
    return any(p.search(text) for p in WRAPPER_PATTERNS)


def _looks_like_command(text: str) -> bool:
    t = text.strip()
    flags = " -c " in t or " -o " in t or " -MF " in t
    return len(t) > 80 and flags and not re.search(r"\berror\b", t[:60])


def _meaningful(lines: list[LogLine]) -> list[LogLine]:
    out: list[LogLine] = []
    in_shim = False
    for ln in lines:
        t = ln.text
        if "full command:" in t:  # pip prints its setup.py shim here, which names errors it did not raise
            in_shim = True
            continue
        if in_shim:
            if t.strip().startswith("cwd:"):
                in_shim = False
            continue
        if not t.strip() or is_wrapper(t) or _STEP.match(t) or _looks_like_command(t):
            continue
        out.append(ln)
    return out
