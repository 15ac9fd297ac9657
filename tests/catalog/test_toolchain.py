"""The toolchain tables and their predicates, checked against facts from
shared/research/toolchain-facts.md."""

from __future__ import annotations

import pytest

from attnforge.catalog import Catalog, load_catalog
from attnforge.catalog.toolchain import Target, TargetKind


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


@pytest.mark.parametrize(
    ("name", "cc"),
    [
        pytest.param("NVIDIA H200", (9, 0), id="h200"),
        pytest.param("NVIDIA H100 80GB HBM3", (9, 0), id="h100"),
        pytest.param("NVIDIA GeForce RTX 5090", (12, 0), id="rtx5090"),
        pytest.param("NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0), id="rtx-pro-6000-longest-wins"),
        pytest.param("Quadro RTX 6000", (7, 5), id="quadro-rtx-6000-is-turing"),
        pytest.param("NVIDIA RTX 6000 Ada Generation", (8, 9), id="rtx-6000-ada"),
        pytest.param("NVIDIA A10G", (8, 6), id="a10g"),
        pytest.param("Tesla T4", (7, 5), id="t4"),
        pytest.param("NVIDIA B300", (10, 3), id="b300"),
        pytest.param("NVIDIA GB10", (12, 1), id="gb10"),
        pytest.param("Some Unknown Accelerator", None, id="unknown"),
    ],
)
def test_gpu_name_to_compute_capability(catalog: Catalog, name: str, cc: tuple[int, int] | None) -> None:
    assert catalog.tools.cc_for_gpu_name(name) == cc


@pytest.mark.parametrize(
    ("cuda", "target", "problem"),
    [
        pytest.param((11, 8), "sm_89", None, id="sm89-from-11.8"),
        pytest.param((11, 7), "sm_90", "needs nvcc >= 11.8", id="sm90-not-in-11.7"),
        pytest.param((11, 8), "sm_90a", "needs nvcc >= 12.0", id="sm90a-from-12.0"),
        pytest.param((12, 4), "sm_120", "needs nvcc >= 12.8", id="sm120-not-in-12.4"),
        pytest.param((12, 8), "sm_120a", None, id="sm120a-in-12.8"),
        pytest.param((12, 8), "compute_120", None, id="ptx120-in-12.8"),
        pytest.param((12, 8), "sm_103", "needs nvcc >= 12.9", id="sm103-from-12.9"),
        pytest.param((12, 9), "sm_121", None, id="sm121-in-12.9"),
        pytest.param((12, 8), "sm_100f", "needs nvcc >= 12.9", id="family-targets-from-12.9"),
        pytest.param((12, 9), "sm_110", "needs nvcc >= 13.0", id="sm110-from-13.0"),
        pytest.param((12, 9), "sm_101", None, id="sm101-in-12.9"),
        pytest.param((13, 0), "sm_101", "dropped after CUDA 12.9", id="sm101-renamed-in-13"),
        pytest.param((12, 9), "sm_70", None, id="volta-in-12.9"),
        pytest.param((13, 0), "sm_70", "dropped after CUDA 12.9", id="volta-dropped-in-13"),
        pytest.param((13, 0), "sm_75", None, id="turing-kept-in-13"),
    ],
)
def test_which_nvcc_can_emit_which_target(
    catalog: Catalog, cuda: tuple[int, int], target: str, problem: str | None
) -> None:
    got = catalog.tools.nvcc_can_emit(cuda, Target.parse(target))
    if problem is None:
        assert got is None
    else:
        assert got is not None
        assert problem in got


@pytest.mark.parametrize(
    ("target", "cc", "runs"),
    [
        pytest.param("sm_80", (8, 6), True, id="sm80-cubin-on-8.6"),
        pytest.param("sm_80", (8, 9), True, id="sm80-cubin-on-8.9"),
        pytest.param("sm_86", (8, 0), False, id="cubin-not-on-lower-minor"),
        pytest.param("sm_80", (9, 0), False, id="cubin-not-across-majors"),
        pytest.param("sm_90", (12, 0), False, id="sm90-not-on-blackwell"),
        pytest.param("sm_90a", (9, 0), True, id="arch-specific-exact"),
        pytest.param("sm_100a", (10, 3), False, id="arch-specific-not-on-10.3"),
        pytest.param("sm_100f", (10, 3), True, id="family-on-10.3"),
        pytest.param("compute_90", (12, 0), True, id="ptx-forward"),
        pytest.param("compute_120", (9, 0), False, id="ptx-not-backward"),
    ],
)
def test_binary_compatibility_rules(catalog: Catalog, target: str, cc: tuple[int, int], runs: bool) -> None:
    assert catalog.tools.runs_on(Target.parse(target), cc) is runs


@pytest.mark.parametrize(
    ("cuda", "gcc_max", "msc_end"),
    [
        pytest.param((11, 8), 11, 1940, id="11.8"),
        pytest.param((12, 3), 12, 1940, id="12.3-rejects-vs-17.10"),
        pytest.param((12, 4), 13, 1950, id="12.4-accepts-vs-17.10"),
        pytest.param((12, 8), 14, 1950, id="12.8"),
        pytest.param((13, 0), 15, 1950, id="13.0-rejects-vs-2026"),
        pytest.param((13, 2), 15, 1960, id="13.2-accepts-vs-2026"),
    ],
)
def test_host_compiler_windows(catalog: Catalog, cuda: tuple[int, int], gcc_max: int, msc_end: int) -> None:
    window = catalog.tools.host_range(cuda)
    assert window is not None
    assert (window.gcc_max, window.msc_end) == (gcc_max, msc_end)


def test_torch_releases_and_drivers(catalog: Catalog) -> None:
    t28 = catalog.tools.torch_release((2, 8))
    assert t28 is not None
    assert t28.cuda == ((12, 6), (12, 8), (12, 9))
    assert catalog.tools.torch_release((2, 11)).pypi_default == (13, 0)  # type: ignore[union-attr]
    assert catalog.tools.driver_floor((12, 8)).linux_min == "570.26"  # type: ignore[union-attr]
    assert catalog.tools.driver_families[13] == "580"
    assert catalog.tools.extension_major_must_match is True


@pytest.mark.parametrize("text", ["sm_90", "sm_90a", "sm_100f", "sm_121a", "compute_120", "sm_75"])
def test_target_round_trips(text: str) -> None:
    assert str(Target.parse(text)) == text


@pytest.mark.parametrize("text", ["sm_9", "compute_90a", "gfx90a", "12"])
def test_target_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="target"):
        Target.parse(text)


def test_bare_capability_is_a_cubin() -> None:
    assert Target.parse("12.0") == Target(cc=(12, 0), kind=TargetKind.SASS)


def test_torch_stack_facts_come_from_the_data_file() -> None:
    from attnforge.catalog import load_catalog

    tools = load_catalog().tools
    assert tools.torch_stack.index_url == "https://download.pytorch.org/whl"
    assert {"torch", "torchvision", "triton-windows"} <= tools.torch_stack.protected
    newest = max(tools.torch_releases, key=lambda t: t.version)
    assert tools.default_torch_cuda() == newest.pypi_default
    assert tools.torch_index_url((13, 0)) == "https://download.pytorch.org/whl/cu130"
    assert tools.torch_index_url(None) == "https://download.pytorch.org/whl/cpu"
