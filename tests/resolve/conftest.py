from __future__ import annotations

from pathlib import Path

import pytest

from attnforge.catalog import Catalog, load_catalog
from attnforge.probe.snapshot import SystemSnapshot

SNAPSHOTS = Path(__file__).resolve().parent.parent / "fixtures" / "snapshots"
WHEELS = Path(__file__).resolve().parent.parent / "fixtures" / "wheels"


def snapshot(name: str) -> SystemSnapshot:
    return SystemSnapshot.load(SNAPSHOTS / f"{name}.json")


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return load_catalog()
