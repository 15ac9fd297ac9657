"""Verify tests: one torch thread per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread() -> Iterator[None]:
    """CI machines are small and shared: spinning intra-op threads turn 0.1 ms calls into 20 ms ones."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(autouse=True)
def private_compile_caches(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Verify repairs the Inductor/Triton caches it finds in the environment: in tests, never the user's."""
    root = tmp_path_factory.mktemp("compile-caches")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(root / "triton"))
