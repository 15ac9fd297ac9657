"""A stand-in for ``torch.compile`` in FlexAttention tests: records what it was asked to compile and returns the
function to run eagerly (the adapter's compile-once-per-signature cache is what the tests count)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class CountingCompiler:
    """Counts compilations (the compiled functions' code names) and runs each function eagerly."""

    def __init__(self) -> None:
        self.compiled: list[str] = []

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        self.compiled.append(fn.__code__.co_name)
        return fn
