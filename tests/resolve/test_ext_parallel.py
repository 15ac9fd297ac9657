"""SageAttention builds its extension modules side by side with the job budget split between them.

Its setup.py builds ``_qattn_sm80``, ``_qattn_sm89``, ``_qattn_sm90`` and ``_fused`` on Hopper, each with
``MAX_JOBS`` ninja jobs, ``EXT_PARALLEL`` at a time. Each has one long translation unit (157 s for
``qk_int_sv_f8_cuda_sm90.cu`` at sm_90a on the 2-core CI machine), so one at a time left 16 cores mostly idle and
the build did not fit in 560 s on the H200 (docs/benchmarks.md, thirty-eighth session). The budget of compile
processes must hold all the same: ``EXT_PARALLEL x MAX_JOBS <= jobs``.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from attnforge.build.execute import build_environment
from attnforge.catalog import Catalog
from attnforge.fleet.build import size_task
from attnforge.install.keys import build_flags
from attnforge.provision.build import with_options
from attnforge.resolve import build_spec
from attnforge.resolve.jobs import GIB, job_env
from attnforge.resolve.types import Request
from tests.resolve.conftest import snapshot


@given(jobs=st.integers(-2, 300), threads=st.integers(0, 8),
       units=st.lists(st.integers(1, 40), min_size=1, max_size=8))
def test_the_split_never_exceeds_the_budget(jobs: int, threads: int, units: list[int]) -> None:
    env = job_env(jobs=jobs, threads=threads, parallel_env="EXT_PARALLEL", units=tuple(units))
    together, each = int(env["EXT_PARALLEL"]), int(env["MAX_JOBS"])
    budget = max(jobs, 1)
    biggest = sorted(units, reverse=True)[:together]
    assert together == min(len(units), budget)  # the extensions go side by side before any gets a second job
    assert each >= 1
    assert sum(min(u, each) for u in biggest) <= budget  # the worst moment: the biggest extensions at once
    if each < max(units):  # and no job is left unused that one more each would fit in
        assert sum(min(u, each + 1) for u in biggest) > budget
    assert int(env["NVCC_THREADS"]) == max(threads, 1)


def test_without_a_parallel_variable_max_jobs_is_the_budget() -> None:
    assert job_env(jobs=16, threads=2) == {"MAX_JOBS": "16", "NVCC_THREADS": "2"}


def _sage(catalog: Catalog):  # type: ignore[no-untyped-def]
    return build_spec(snapshot("h200_torch2.11_cu130"), catalog, Request(backend="sageattention-2"),
                      home="/tmp/afhome")


def test_sage_on_the_h200_builds_four_extensions_at_once(catalog: Catalog) -> None:
    spec = _sage(catalog)
    assert spec.max_jobs == 16  # the H200 snapshot's 16 cores, 5 GiB a job
    # all four at once, _qattn_sm89's eight units in one wave: 2 + 8 + 2 + 2 = 14 compiles <= 16
    assert (spec.env["EXT_PARALLEL"], spec.env["MAX_JOBS"]) == ("4", "8")
    assert any("EXT_PARALLEL=4, MAX_JOBS=8 each, at most 16 compiles" in note for note in spec.notes)
    env = build_environment(spec, {"MAX_JOBS": "64", "EXT_PARALLEL": "9", "PATH": "/usr/bin"})
    assert (env["EXT_PARALLEL"], env["MAX_JOBS"]) == ("4", "8")  # the spec's word over the user's shell
    assert "EXT_PARALLEL" not in build_environment(_fa3(catalog), {})


def _fa3(catalog: Catalog):  # type: ignore[no-untyped-def]
    return build_spec(snapshot("h200_torch2.11_cu130"), catalog, Request(backend="flash-attn-3"), home="/tmp/afhome")


def test_jobs_and_a_small_fleet_node_split_again(catalog: Catalog) -> None:
    spec = _sage(catalog)
    two = with_options(spec, jobs=2, use_sccache=False, name=None)
    assert (two.env["EXT_PARALLEL"], two.env["MAX_JOBS"], two.max_jobs) == ("2", "1", 2)
    assert build_environment(two, {})["EXT_PARALLEL"] == "2"
    six = with_options(spec, jobs=6, use_sccache=False, name=None)
    assert (six.env["EXT_PARALLEL"], six.env["MAX_JOBS"]) == ("4", "1")
    nine = with_options(spec, jobs=9, use_sccache=False, name=None)
    assert (nine.env["EXT_PARALLEL"], nine.env["MAX_JOBS"]) == ("4", "3")  # 2 + 3 + 2 + 2 = 9
    node = size_task(spec, gib_per_thread=5, node_cpus=3, node_memory_bytes=64 * GIB)
    assert node.num_cpus == 3
    assert (node.spec.env["EXT_PARALLEL"], node.spec.env["MAX_JOBS"]) == ("3", "1")
    assert node.spec.notes[-1].endswith("MAX_JOBS=1")  # the note says what the build gets


def test_how_many_build_at_once_is_not_in_the_cache_key(catalog: Catalog) -> None:
    spec = _sage(catalog)
    assert not any(flag.startswith("EXT_PARALLEL=") for flag in build_flags(spec))
    assert build_flags(with_options(spec, jobs=2, use_sccache=False, name=None)) == build_flags(spec)
    assert "TORCH_CUDA_ARCH_LIST=9.0" in build_flags(spec)  # what changes the bytes stays keyed
