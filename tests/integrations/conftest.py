"""Hermetic model tests: no Hub access, and a dispatcher whose records come from an empty temp ATTNFORGE_HOME.

The process-wide dispatcher reads verify/bench records from ``$ATTNFORGE_HOME`` (else ``~/.cache/attnforge``) on
first use; a test that let it read the real cache once depended on what this machine had benchmarked. Every test
here gets a fresh dispatcher built after ATTNFORGE_HOME points at its own ``tmp_path``.

Importing probe first avoids the catalog <-> probe import cycle (see tests/dispatch/conftest.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import attnforge.probe  # noqa: F401

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

