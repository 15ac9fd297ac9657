"""Fixtures of the HTTP client's tests (servers in :mod:`tests.fetch.servers`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fetch.servers import PROXY_VARIABLES, BlackHole


@pytest.fixture
def black_hole() -> Iterator[BlackHole]:
    hole = BlackHole()
    yield hole
    hole.close()


@pytest.fixture
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in PROXY_VARIABLES:
        monkeypatch.delenv(var, raising=False)
