"""Fakes at the seams: a runner that replays real recorded outputs (tests/fixtures/outputs/), a settable clock, and
a call counter wrapped around a real function."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PureWindowsPath
from typing import Any

from attnforge._system.runner import NOT_FOUND, Completed

FIXTURES = Path(__file__).parent / "fixtures"
OUTPUTS = FIXTURES / "outputs"


def recorded(name: str) -> str:
    """The text of a recorded real output, ``tests/fixtures/outputs/<name>``."""
    return (OUTPUTS / name).read_text(encoding="utf-8")


def _key(argv: Sequence[str]) -> tuple[str, ...]:
    first = str(argv[0])
    base = PureWindowsPath(first).name if "\\" in first else Path(first).name
    return (base, *map(str, argv[1:]))


@dataclass
class FakeRunner:
    """Replays ``Completed`` results keyed by ``(basename(argv[0]), *argv[1:])``.

    Programs with no recording behave as missing (exit 127), like a machine without them. Every call is
    recorded in ``calls`` so tests can assert what would have run.
    """

    responses: dict[tuple[str, ...], Completed] = field(default_factory=dict)
    calls: list[tuple[str, ...]] = field(default_factory=list)
    envs: list[Mapping[str, str] | None] = field(default_factory=list)

    def add(self, argv: Sequence[str], stdout: str = "", *, stderr: str = "", returncode: int = 0) -> FakeRunner:
        key = _key(argv)
        self.responses[key] = Completed(argv=tuple(argv), returncode=returncode, stdout=stdout, stderr=stderr)
        return self

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Completed:
        key = _key(argv)
        self.calls.append(tuple(map(str, argv)))
        self.envs.append(env)
        hit = self.responses.get(key)
        if hit is None:
            return Completed(argv=tuple(map(str, argv)), returncode=NOT_FOUND, stderr=f"{argv[0]}: not found")
        return Completed(argv=tuple(map(str, argv)), returncode=hit.returncode, stdout=hit.stdout,
                         stderr=hit.stderr)


class FakeClock:
    """A settable clock at a clock seam: returns ``now`` (seconds or milliseconds, as the seam counts)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class ReadyAdapter:
    """The two questions the dispatcher asks a fake adapter before calling it, answered "loads, serves
    everything": the base of the timed stand-ins in tests/dispatch (their ``__call__`` is what differs)."""

    def load_error(self) -> str | None:
        return None

    def unsupported_reasons(self, call: object) -> list[str]:
        return []


def count_calls(monkeypatch: Any, owner: Any, name: str) -> list[int]:
    """Wrap ``owner.name`` (a module's function) so that each call appends 1 to the returned list; the real function
    still runs, and ``monkeypatch`` puts it back when the test ends."""
    calls: list[int] = []
    real = getattr(owner, name)

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return calls

