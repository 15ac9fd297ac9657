"""Shared pieces of the reliability scripts: a trial record, the CLI in a real process, small wheels."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
sys.path[:0] = [str(SRC), str(REPO)]

from tests.cache.conftest import inputs_for  # noqa: E402
from tests.cache.wheelmaker import make_wheel  # noqa: E402

from attnforge.cache import Store  # noqa: E402
from attnforge.cache.verify import verify  # noqa: E402

#: setpriv arguments that drop root's right to ignore file permissions: "another user" for these scripts.
NO_DAC = "-dac_override,-dac_read_search,-fowner"


@dataclass
class Row:
    """One line of the reliability table."""

    fault: str
    trials: int = 0
    survived: int = 0
    lost: list[str] = field(default_factory=list)  # what was lost or went wrong, one line per bad trial

    def record(self, ok: bool, what: str = "") -> None:
        self.trials += 1
        if ok:
            self.survived += 1
        else:
            self.lost.append(what or "unexplained")


def cli(home: Path, *args: str, unprivileged: bool = False, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    prefix = ["setpriv", f"--bounding-set={NO_DAC}", f"--inh-caps={NO_DAC}"] if unprivileged else []
    env = {**os.environ, "ATTNFORGE_HOME": str(home), "PYTHONPATH": str(SRC), "NO_COLOR": "1"}
    return subprocess.run([*prefix, sys.executable, "-m", "attnforge", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)


def clean_error(done: subprocess.CompletedProcess[str]) -> bool:
    """Exit 1 or 2 with ``error:`` and ``hint:`` and no traceback."""
    text = done.stdout + done.stderr
    return done.returncode in (1, 2) and "Traceback" not in text and "error:" in text and "hint:" in text


def no_traceback(done: subprocess.CompletedProcess[str]) -> bool:
    return "Traceback" not in done.stdout + done.stderr


def store_with(root: Path, dist: Path, versions: list[str], padding: int = 0) -> tuple[Store, list[str]]:
    store = Store(root)
    keys = []
    for v in versions:
        w = make_wheel(dist / v, version=v, padding_bytes=padding)
        keys.append(store.put(w, inputs_for(w)).entry.key)
    return store, keys


def consistent(store: Store) -> str | None:
    """None when every listed entry is intact and ``cache verify`` finds nothing; else what is wrong."""
    try:
        report = verify(store)
    except Exception as exc:
        return f"verify raised {type(exc).__name__}: {exc}"
    if report.problems:
        return "; ".join(f"{p.filename}: {p.problem}" for p in report.problems)
    return None


def flip(path: Path, rng: random.Random, start: int = 0) -> int:
    data = bytearray(path.read_bytes())
    offset = rng.randrange(start, len(data))
    data[offset] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return offset


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def can_mount() -> bool:
    return os.name == "posix" and os.geteuid() == 0 and shutil.which("mount") is not None


def is_root_with_setpriv() -> bool:
    return os.name == "posix" and os.geteuid() == 0 and shutil.which("setpriv") is not None


Fault = Callable[[Path, int, random.Random], Row]
