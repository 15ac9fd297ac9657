"""What a backend's exception says: its first meaningful line for people, its whole chain for the record.

A verify case used to keep only the last line of ``f"{type}: {exc}"``; for every ``torch.compile`` error that is
the boilerplate "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace ..." (issue 31, item 5), so a missing C++
compiler (Inductor's ``InvalidCxxCompiler: No working C++ compiler found``) read like any other failure.
"""

from __future__ import annotations

import re
import traceback

#: Lines torch appends to the message of a compile error, which say nothing about the cause. Read in torch 2.13:
#: ``torch/_dynamo/exc.py`` (``format_error_msg_verbose``, "Set TORCHDYNAMO_VERBOSE=1 ..."), ``torch/_dynamo/
#: convert_frame.py`` ("You can suppress this exception and fall back to eager ..."), ``torch/_dynamo/
#: utils.py`` ("For more information ..."), and the separator lines around them.
BOILERPLATE = re.compile(
    r"^\s*(Set TORCHDYNAMO_VERBOSE|Set TORCH_LOGS|For even more developer context|You can suppress this exception"
    r"|For more information|To fix the error|from user code:|torch\._dynamo\.config\.suppress_errors"
    r"|import torch\._dynamo|backend='\w+' raised:\s*$|\(Please do this especially|Developer debug context|"
    r"[-=*_~.]{3,}\s*$)",
    re.IGNORECASE,
)
#: The most characters of one exception chain kept in a verify record (the head: type and message of each
#: exception first, then the traceback tails).
MAX_CAUSE_CHARS = 12_000
#: Frames kept per exception of the chain: where it was raised, not the whole dispatcher stack.
TAIL_FRAMES = 4


def chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions behind it (``__cause__``, else a not-suppressed ``__context__``), outermost
    first, each once."""
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in out):
        out.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return out


def meaningful_line(text: str) -> str | None:
    """The first line of ``text`` that is not blank and not torch's boilerplate, stripped; None when none is."""
    for line in text.splitlines():
        if line.strip() and not BOILERPLATE.match(line):
            return line.strip()
    return None


def headline(exc: BaseException) -> str:
    """``"InductorError: InvalidCxxCompiler: No working C++ compiler found in ..."``: the type of the outermost
    exception and the first meaningful line of the first exception in its chain that has one."""
    for link in chain(exc):
        line = meaningful_line(str(link))
        if line is not None:
            name = type(exc).__name__
            return line if line.startswith(f"{name}:") else f"{name}: {line}"
    return type(exc).__name__


def full_text(exc: BaseException) -> str:
    """Every exception of the chain (type and whole message, outermost first), then Python's own rendering of
    the chain with the last :data:`TAIL_FRAMES` frames of each; at most :data:`MAX_CAUSE_CHARS` characters."""
    heads = [f"{type(link).__module__}.{type(link).__name__}: {str(link).strip()}" for link in chain(exc)]
    try:
        rendered = "".join(traceback.TracebackException.from_exception(exc, limit=-TAIL_FRAMES).format())
    except Exception:  # a message whose __str__ raises: keep what the heads say
        rendered = ""
    text = "\n".join(heads) + ("\n\n" + rendered if rendered else "")
    return text if len(text) <= MAX_CAUSE_CHARS else text[:MAX_CAUSE_CHARS] + "\n... (cut)"


def output_headline(output: str) -> str:
    """The line naming the error in a dead child's output: the last ``SomeError: ...`` line that is not
    boilerplate, else the last meaningful line; empty when there is none."""
    lines = [line.strip() for line in output.splitlines() if line.strip() and not BOILERPLATE.match(line)]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception|Failed|Interrupt)\w*:", line)]
    return (errors or lines or [""])[-1]
