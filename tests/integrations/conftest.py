"""Hermetic model tests: no Hub access, and a dispatcher whose records come from an empty temp ATTNFORGE_HOME.

The process-wide dispatcher reads verify/bench records from ``$ATTNFORGE_HOME`` (else ``~/.cache/attnforge``) on
first use; a test that let it read the real cache once depended on what this machine had benchmarked. Every test
here gets a fresh dispatcher built after ATTNFORGE_HOME points at its own ``tmp_path``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# read by huggingface_hub at import time, so set before any test module imports transformers/diffusers
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


@pytest.fixture(autouse=True)
def isolated_dispatcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """ATTNFORGE_HOME in tmp_path and a dispatcher built from it, the previous one restored afterwards."""
    from attnforge.dispatch import runtime

    monkeypatch.setenv("ATTNFORGE_HOME", str(tmp_path / "afhome"))
    previous = runtime.set_dispatcher(None)
    yield
    runtime.set_dispatcher(previous)


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The query shape of every call :func:`attnforge.attention` serves (a spy on the runtime's function)."""
    from attnforge.dispatch import runtime

    calls: list[tuple[int, ...]] = []
    real = runtime.attention

    def spy(q: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(tuple(q.shape))
        return real(q, *args, **kwargs)

    monkeypatch.setattr(runtime, "attention", spy)
    return calls

