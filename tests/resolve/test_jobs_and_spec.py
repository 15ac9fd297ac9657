"""Job sizing invariants, build_spec errors and listing wheels from find-links dirs and PEP 503 pages."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnforge.catalog import Catalog
from attnforge.errors import ResolveError, UsageError
from attnforge.fetch.indexes import list_find_links, list_index, list_wheels, parse_simple_page
from attnforge.resolve import build_spec
from attnforge.resolve.jobs import GIB, size_jobs
from attnforge.resolve.types import Request
from tests.resolve.conftest import WHEELS, snapshot


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


def test_find_links_lists_only_wheels() -> None:
    names = [w.filename for w in list_find_links(str(WHEELS / "h200_flash_attn"))]
    assert len(names) == 5
    assert all(n.endswith(".whl") for n in names)


def test_missing_find_links_dir_is_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="find-links"):
        list_find_links(str(tmp_path / "nope"))


PAGE = """<!DOCTYPE html><html><body>
<a
href="../../files/flash_attn-2.8.3+cu13torch2.11cxx11abiTRUE-cp312-cp312-linux_x86_64.whl#sha256=abc123">flash_attn-2.8.3+cu13torch2.11cxx11abiTRUE-cp312-cp312-linux_x86_64.whl</a>
<a href="flash_attn-2.8.3.tar.gz">flash_attn-2.8.3.tar.gz</a>
</body></html>"""


def test_pep503_page() -> None:
    refs = parse_simple_page(PAGE, "https://example.org/simple/flash-attn/")
    assert len(refs) == 1
    assert refs[0].sha256 == "abc123"
    assert refs[0].url == (
        "https://example.org/files/flash_attn-2.8.3+cu13torch2.11cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"
    )


def test_file_index(tmp_path: Path) -> None:
    page_dir = tmp_path / "simple" / "flash-attn"
    page_dir.mkdir(parents=True)
    (page_dir / "index.html").write_text(PAGE)
    refs = list_index((tmp_path / "simple").as_uri(), "flash_attn")
    assert [r.sha256 for r in refs] == ["abc123"]


def test_offline_skips_http_and_fake_opener_is_used() -> None:
    calls: list[str] = []

    def opener(url: str, timeout_s: float) -> io.BytesIO:
        calls.append(url)
        return io.BytesIO(PAGE.encode())

    offline = list_wheels([], ["https://example.org/simple"], ["flash-attn"], offline=True, opener=opener)
    assert offline.wheels == ()
    assert calls == []
    assert "--offline" in offline.problems[0]
    online = list_wheels(
        [], ["https://example.org/simple"], ["flash-attn", "flash_attn"], offline=False, opener=opener
    )
    assert calls == ["https://example.org/simple/flash-attn/"]
    assert len(online.wheels) == 1


def test_unreachable_index_is_a_problem_not_a_crash() -> None:
    def opener(url: str, timeout_s: float) -> io.BytesIO:
        raise OSError("connection refused")

    got = list_wheels([], ["https://example.org/simple"], ["flash-attn"], offline=False, opener=opener)
    assert got.wheels == ()
    assert "connection refused" in got.problems[0]


def test_bad_index_scheme() -> None:
    with pytest.raises(UsageError):
        list_wheels([], ["ftp://example.org"], ["flash-attn"], offline=False)
