"""Run work that may crash the interpreter (a CUDA kernel) in a child process, so the parent never dies.

The parent calls :func:`run_in_child` with a target ``"module:function"`` and a payload. The child
(``python -m attnforge._system.isolate DIR``) calls ``function(payload, announce)``, which yields results one by
one; each is pickled to ``DIR/items`` as soon as it exists, and ``announce(x)`` records what it is about to do
(the case or shape) in ``DIR/steps``. A SIGSEGV, an abort or a hang therefore still leaves every finished
result and names the step that killed it. The files are private to one call (a fresh temporary directory), so
unpickling them trusts nothing but this process's own child.
"""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from attnforge._system.runner import TIMED_OUT, Runner

#: Default seconds one child may run (a backend's whole verify or bench, JIT compiles included).
DEFAULT_TIMEOUT_S = 900.0
#: Windows has no signals: a crashed process exits with its NTSTATUS code.
_WINDOWS_CRASHES = {
    0xC0000005: "access violation (0xC0000005, Windows' SIGSEGV)",
    0xC0000409: "fail-fast abort (0xC0000409, Windows' SIGABRT)",
    0xC000001D: "illegal instruction (0xC000001D)",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildOutcome:
    """What came back from one child.

    Attributes:
        items: every result the child finished, in order.
        current: what the child announced last and did not finish (the case it died on), or None.
        failure: None when the child finished; else ``"SIGSEGV"``, ``"SIGABRT"``, ``"hang (no result within
            60 s)"``, ``"exit status 3"``.
        output_tail: the last lines of the child's stderr (a Python traceback, a CUDA message).
        raised: the one line of a Python exception that ended the child (``"UnboundLocalError: ..."``), or None:
            the caller's own code failed in the child, which is not the child's kernel crashing (a signal, an
            abort, a hang).
    """

    items: tuple[Any, ...]
    current: Any
    failure: str | None
    output_tail: str = ""
    raised: str | None = None


def run_in_child(target: str, payload: Any, *, runner: Runner, python: str = sys.executable,
                 env: Mapping[str, str] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> ChildOutcome:
    """Run ``target(payload, announce)`` (a generator function) in a fresh interpreter; never raises for what
    the child does."""
    with tempfile.TemporaryDirectory(prefix="attnforge-child-") as tmp:
        folder = Path(tmp)
        # the child sees the parent's import path, so whatever the parent could import it can unpickle
        (folder / "call").write_bytes(pickle.dumps((list(sys.path), target, pickle.dumps(payload))))
        argv = [python, "-m", "attnforge._system.isolate", str(folder)]
        done = runner.run(argv, env=dict(os.environ if env is None else env), timeout_s=timeout_s)
        items = _read_all(folder / "items")
        steps = _read_all(folder / "steps")
        output = done.stderr + _text(folder / "output")
        raised = _text(folder / "raised").strip() or None
    finished = done.returncode == 0
    current = steps[-1] if steps and len(steps) > len(items) else None
    tail = "\n".join(output.strip().splitlines()[-6:])
    return ChildOutcome(items=tuple(items), current=None if finished else current,
                        failure=None if finished else describe_exit(done.returncode, output, timeout_s),
                        output_tail=tail, raised=None if finished else raised)


def describe_exit(returncode: int, stderr: str, timeout_s: float) -> str:
    """``-11`` -> ``"SIGSEGV"``; a timeout -> ``"hang (no result within 60 s)"``; else the exit status (and the
    child's last error line when Python raised)."""
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    if returncode in _WINDOWS_CRASHES:
        return _WINDOWS_CRASHES[returncode]
    if returncode == TIMED_OUT and "timed out after" in stderr:
        return f"hang (no result within {timeout_s:g} s, killed)"
    last = next((line for line in reversed(stderr.strip().splitlines()) if line.strip()), "")
    return f"exit status {returncode}" + (f" ({last.strip()})" if last else "")


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _read_all(path: Path) -> list[Any]:
    out: list[Any] = []
    if not path.is_file():
        return out
    with path.open("rb") as fh:
        while True:
            try:
                out.append(pickle.load(fh))  # noqa: S301 - written by this call's own child
            except EOFError:
                return out
            except (pickle.UnpicklingError, AttributeError, ImportError, ValueError, IndexError):
                return out  # the child died in the middle of a write: keep what was whole


def portable(obj: Any) -> bytes | None:
    """``obj`` pickled for a child, or None when it cannot be (an adapter holding a loaded kernel module)."""
    try:
        return pickle.dumps(obj)
    except Exception:  # pickling can fail with anything an object holds
        return None


def resolve(ref: str) -> Callable[..., Any]:
    """``"package.module:function"`` -> the function."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def _announcer(fh: BinaryIO) -> Callable[[Any], None]:
    def announce(step: Any) -> None:
        pickle.dump(step, fh)
        fh.flush()

    return announce


def main(argv: Sequence[str]) -> int:
    """The child: run the call in ``argv[0]``, writing items and steps as they happen."""
    folder = Path(argv[0])
    # Output goes to a file, not the parent's pipes: a worker process the kernel library leaves behind (a
    # compile pool) must not keep the parent waiting for the pipe to close after this process died.
    out = os.open(folder / "output", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    path, target, blob = pickle.loads((folder / "call").read_bytes())  # noqa: S301 - written by our parent
    sys.path[:0] = [p for p in path if p not in sys.path]
    payload = pickle.loads(blob)  # noqa: S301 - written by our parent
    func = resolve(target)
    with (folder / "items").open("ab") as items, (folder / "steps").open("ab") as steps:
        results: Iterator[Any] = func(payload, _announcer(steps))
        try:
            for item in results:
                pickle.dump(item, items)
                items.flush()
        except Exception as exc:  # the caller's code raised (ChildOutcome.raised); the traceback goes to output
            (folder / "raised").write_text(f"{type(exc).__name__}: {exc}"[:500], encoding="utf-8")
            raise
    return 0


if __name__ == "__main__":  # pragma: no cover - runs in the child
    sys.exit(main(sys.argv[1:]))
