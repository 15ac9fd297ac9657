from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from attnforge.cache import CacheKeyInputs, Store
from attnforge.cache._files import sha256_file
from tests._fakes import FakeClock
from tests.cache.wheelmaker import make_wheel


@contextlib.contextmanager
def mounted_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` (``mount -o size=``) at ``mount``, for full-disk tests; skips where it cannot be
    mounted (not root, no mount namespace)."""
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True,
                          check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def inputs_for(artifact: Path, **changes: Any) -> CacheKeyInputs:
    """Key inputs for a test wheel: name and version from its file name, source = its own bytes."""
    name, version = artifact.name.split("-")[:2]
    fields: dict[str, Any] = {
        "name": name, "version": version, "source_sha256": sha256_file(artifact), "archs": ((9, 0),),
        "torch_version": "2.13.0+cpu", "cuda_version": None, "cxx11_abi": True, "python_tag": "cp311",
        "platform_tag": "linux_x86_64", "glibc": "2.36", "toolchain": (("gcc", "12.2.0"),),
    }
    fields.update(changes)
    return CacheKeyInputs(**fields)


def put_wheels(store: Store, tmp_path: Path, count: int = 2) -> list[str]:
    """``count`` test wheels (versions ``0.0``, ``1.0`` ...) stored in ``store``; their keys, in order."""
    keys = []
    for i in range(count):
        wheel = make_wheel(tmp_path / f"w{i}", version=f"{i}.0")
        keys.append(store.put(wheel, inputs_for(wheel), provenance={"host": "test"}).entry.key)
    return keys


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_700_000_000.0)  # Unix seconds, for prune by age


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Store:
    return Store(tmp_path / "home", clock=clock)


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    return make_wheel(tmp_path / "dist")
