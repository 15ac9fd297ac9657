"""Job sizing invariants, build_spec errors and listing wheels from find-links dirs and PEP 503 pages."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnforge.catalog import Catalog
from attnforge.errors import ResolveError, UsageError
from attnforge.resolve import build_spec
from attnforge.resolve.jobs import GIB, size_jobs
from attnforge.resolve.types import Request
from tests.resolve.conftest import snapshot


@given(
    cores=st.integers(1, 256), ram_gib=st.integers(0, 2048), gib=st.integers(1, 8), threads=st.integers(1, 8)
)
def test_jobs_respect_cores_and_ram(cores: int, ram_gib: int, gib: int, threads: int) -> None:
    s = size_jobs(cores=cores, ram_available_bytes=ram_gib * GIB, gib_per_thread=gib, max_threads=threads)
    assert s.max_jobs >= 1
    assert s.nvcc_threads >= 1
    assert s.nvcc_threads <= threads
    if s.fits_in_ram:
        assert s.max_jobs * s.nvcc_threads <= cores
        assert s.max_jobs * s.nvcc_threads * gib <= ram_gib
    else:
        assert ram_gib < gib


def test_h200_sizing_fills_the_cores_with_jobs_first() -> None:
    """On the H200 8 jobs x 2 threads built FlashAttention-2 at half the speed of 16 x 1 (docs/benchmarks.md)."""
    s = size_jobs(cores=16, ram_available_bytes=120 * GIB, gib_per_thread=5, max_threads=2)
    assert (s.max_jobs, s.nvcc_threads) == (16, 1)


@pytest.mark.parametrize(
    ("cores", "ram_gib", "expected"),
    [
        pytest.param(2, 24, (2, 1), id="dev-machine"),
        pytest.param(64, 120, (24, 1), id="ram-bound-jobs"),
        pytest.param(16, 12, (2, 1), id="ram-starved"),
    ],
)
def test_threads_only_take_cores_that_jobs_leave(cores: int, ram_gib: int, expected: tuple[int, int]) -> None:
    s = size_jobs(cores=cores, ram_available_bytes=ram_gib * GIB, gib_per_thread=5, max_threads=2)
    assert (s.max_jobs, s.nvcc_threads) == expected


def test_build_spec_raises_with_every_failure(catalog: Catalog) -> None:
    with pytest.raises(ResolveError) as err:
        build_spec(snapshot("cpu_dev_torch2.13_cpu"), catalog, Request(backend="flash-attn"))
    assert err.value.cause is not None
    assert "CPU-only build" in err.value.cause
    assert "no target compute capability" in err.value.cause
    assert err.value.hint is not None
    assert "download.pytorch.org/whl/cu130" in err.value.hint


def test_build_spec_for_a_local_source(catalog: Catalog) -> None:
    from attnforge.resolve.types import SourceKind, SourceSpec

    src = SourceSpec(kind=SourceKind.PATH, location="/src/my-kernel")
    spec = build_spec(
        snapshot("h200_torch2.11_cu130"),
        catalog,
        Request(backend="my-kernel", source=src, version="==0.1"),
        home="/tmp/afhome",
    )
    assert spec.source == src
    assert spec.env["TORCH_CUDA_ARCH_LIST"] == "9.0"
    assert spec.build_root.startswith("/tmp/afhome/b/")
    assert spec.version == "0.1"


def test_nothing_to_build_for_builtins(catalog: Catalog) -> None:
    with pytest.raises(UsageError, match="nothing to build"):
        build_spec(snapshot("h200_torch2.11_cu130"), catalog, Request(backend="sdpa-flash"))
