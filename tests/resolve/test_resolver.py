"""The resolver over snapshot fixtures: which candidate wins, and the reasons for the rest."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnforge.catalog import Catalog
from attnforge.fetch.indexes import list_find_links
from attnforge.probe.snapshot import Compiler, InstalledBackend, NativeModule, SystemSnapshot, TorchInfo
from attnforge.resolve.resolver import resolve
from attnforge.resolve.types import CachedArtifact, CandidateKind, Plan, Request
from tests.resolve.conftest import WHEELS, snapshot

H200 = "h200_torch2.11_cu130"
CPU = "cpu_dev_torch2.13_cpu"
RTX5090 = "rtx5090_torch2.8_cu128_nvcc12.4"
CU13_NVCC12 = "h100_torch2.11_cu130_nvcc12.6"
WINDOWS = "windows_vs17.10_cuda12.3_torch2.5_cu124"


def _source(plan: Plan) -> str:
    cand = next(c for c in plan.candidates if c.kind is CandidateKind.SOURCE)
    return "\n".join(cand.reasons)


@pytest.mark.parametrize(
    ("snap", "viable", "must_say", "must_not_say"),
    [
        pytest.param(H200, True, ["9.0 -> sm_90"], [], id="h200-builds-for-9.0"),
        pytest.param(CPU, False, ["CPU-only build"], ["set CUDA_HOME"], id="cpu-torch"),
        pytest.param(
            RTX5090,
            False,
            ["sm_120 needs nvcc >= 12.8", "NVIDIA GeForce RTX 5090"],
            [],
            id="rtx5090-nvcc-12.4",
        ),
        pytest.param(
            CU13_NVCC12,
            False,
            ["CUDA majors must match", "CUDA 13.0", "nvcc 12.6"],
            [],
            id="cu13-torch-nvcc-12",
        ),
        pytest.param(
            WINDOWS,
            False,
            ["_MSC_VER 1940", "_MSC_VER 1910-1939", "VS 2022 17.10", "-vcvars_ver=14.39", "CUDA 12.4 or newer"],
            [],
            id="windows-vs17.10-cuda12.3",
        ),
    ],
)
def test_flash_attn_source_build(
    catalog: Catalog, snap: str, viable: bool, must_say: list[str], must_not_say: list[str]
) -> None:
    plan = resolve(snapshot(snap), catalog, Request(backend="flash-attn"))
    assert plan.viable is viable
    text = _source(plan)
    for phrase in must_say:
        assert phrase in text
    for phrase in must_not_say:
        assert phrase not in text


def test_h200_build_spec(catalog: Catalog) -> None:
    snap = snapshot(H200)
    plan = resolve(snap, catalog, Request(backend="flash-attn"))
    chosen = plan.chosen
    assert chosen is not None
    assert chosen.kind is CandidateKind.SOURCE
    spec = chosen.build
    assert spec is not None
    assert spec.archs == ((9, 0),)
    assert spec.env["FLASH_ATTN_CUDA_ARCHS"] == "90"
    assert spec.env["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE"
    assert spec.env["CUDA_HOME"] == "/usr/local/cuda"
    assert spec.max_jobs * spec.nvcc_threads <= snap.platform.cores
    assert spec.max_jobs * spec.nvcc_threads * 5 * 2**30 <= snap.platform.ram_available_bytes
    assert spec.build_root.startswith(snap.platform.disk_path)


def test_rtx5090_plan_rejects_only_the_arch(catalog: Catalog) -> None:
    plan = resolve(snapshot(RTX5090), catalog, Request(backend="flash-attn"))
    text = _source(plan)
    assert "CUDA majors" not in text  # nvcc 12.4 and torch cu128 share major 12
    assert text.count("nvcc 12.4 cannot build") == 1  # the PTX of the same arch is not repeated


def test_arch_override(catalog: Catalog) -> None:
    plan = resolve(snapshot(H200), catalog, Request(backend="flash-attn", archs=((9, 0), (12, 0))))
    assert plan.chosen is not None
    assert plan.chosen.build is not None
    assert plan.chosen.build.env["FLASH_ATTN_CUDA_ARCHS"] == "90;120"


def test_sageattention_uses_torch_arch_list(catalog: Catalog) -> None:
    plan = resolve(snapshot(H200), catalog, Request(backend="sageattention-2"))
    assert plan.chosen is not None
    assert plan.chosen.build is not None
    assert plan.chosen.build.env["TORCH_CUDA_ARCH_LIST"] == "9.0"
    assert "FLASH_ATTN_CUDA_ARCHS" not in plan.chosen.build.env


def test_windows_with_a_fitting_toolset_builds(catalog: Catalog) -> None:
    snap = snapshot(WINDOWS)
    vs = dataclasses.replace(snap.visual_studio[0], msvc_toolsets=("14.40.33807", "14.39.33519"))
    snap = dataclasses.replace(snap, visual_studio=(vs,))
    plan = resolve(snap, catalog, Request(backend="flash-attn"))
    assert plan.chosen is not None
    assert plan.chosen.build is not None
    spec = plan.chosen.build
    assert spec.msvc_toolset == "14.39"
    assert spec.env["DISTUTILS_USE_SDK"] == "1"
    assert spec.env["FLASH_ATTN_CUDA_ARCHS"] == "80"  # an 8.9 GPU runs the sm_80 cubin
    assert spec.env["CUDA_HOME"].endswith("v12.3")
    assert len(spec.build_root) <= 40
    assert spec.build_root.startswith("C:\\afb\\")


def test_gcc_too_new(catalog: Catalog) -> None:
    snap = snapshot(H200)
    gcc = Compiler(kind="g++", path="/usr/bin/g++", version="16.1.0", banner="g++ 16.1.0")
    plan = resolve(dataclasses.replace(snap, compilers=(gcc,)), catalog, Request(backend="flash-attn"))
    assert not plan.viable
    assert "CC=gcc-15 CXX=g++-15" in _source(plan)


def test_wrapper_nvcc_is_not_chosen_as_cuda_home(catalog: Catalog) -> None:
    snap = snapshot(CPU)
    torch = dataclasses.replace(snap.torch, version="2.13.0+cu130", cuda_version="13.0")
    snap = dataclasses.replace(snap, torch=torch)
    plan = resolve(snap, catalog, Request(backend="flash-attn", archs=((9, 0),)))
    assert plan.chosen is not None
    assert plan.chosen.build is not None
    assert plan.chosen.build.env["CUDA_HOME"] == "/usr/local/cuda"


def test_no_torch_is_reported_as_missing(catalog: Catalog) -> None:
    snap = dataclasses.replace(snapshot(H200), torch=None)
    text = _source(resolve(snap, catalog, Request(backend="flash-attn")))
    assert "torch is not importable" in text


def test_find_links_picks_the_right_wheel(catalog: Catalog) -> None:
    wheels = list_find_links(str(WHEELS / "h200_flash_attn"))
    plan = resolve(snapshot(H200), catalog, Request(backend="flash-attn"), wheels=wheels)
    chosen = plan.chosen
    assert chosen is not None
    assert chosen.wheel is not None
    assert chosen.wheel.filename == "flash_attn-2.8.3+cu13torch2.11cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"
    rejected = {c.wheel.filename: " ".join(c.reasons) for c in plan.candidates if c.wheel and not c.accepted}
    assert (
        "built for torch 2.10"
        in rejected["flash_attn-2.8.3+cu13torch2.10cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"]
    )
    assert (
        "cp311-cp311-linux_x86_64 do not fit Python 3.12"
        in rejected["flash_attn-2.8.3+cu13torch2.11cxx11abiTRUE-cp311-cp311-linux_x86_64.whl"]
    )
    assert (
        "CUDA majors must match"
        in rejected["flash_attn-2.8.3+cu12torch2.11cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"]
    )
    assert all("torch-2.11.0" not in c.description for c in plan.candidates)  # another distribution


def test_wheel_without_the_gpus_arch_is_rejected(catalog: Catalog) -> None:
    snap = snapshot(RTX5090)
    # upstream wheels carry sm_80/90/100/120 + compute_120: Thor (11.0) runs none of them
    gpu = dataclasses.replace(snap.gpus[0], name="NVIDIA Jetson AGX Thor", compute_capability=(11, 0))
    wheels = list_find_links(str(WHEELS / "h200_flash_attn"))
    torch = dataclasses.replace(snap.torch, version="2.11.0+cu130", cuda_version="13.0")
    snap = dataclasses.replace(
        snap,
        gpus=(gpu,),
        torch=torch,
        platform=dataclasses.replace(snap.platform, wheel_tag="cp312-cp312-linux_x86_64"),
    )
    plan = resolve(snap, catalog, Request(backend="flash-attn"), wheels=wheels)
    right = next(
        c
        for c in plan.candidates
        if c.wheel and c.wheel.filename.startswith("flash_attn-2.8.3+cu13torch2.11cxx11abiTRUE-cp312")
    )
    assert not right.accepted
    assert "has no code for 11.0 (NVIDIA Jetson AGX Thor)" in " ".join(right.reasons)


def test_from_source_skips_wheels(catalog: Catalog) -> None:
    wheels = list_find_links(str(WHEELS / "h200_flash_attn"))
    plan = resolve(snapshot(H200), catalog, Request(backend="flash-attn", from_source=True), wheels=wheels)
    assert plan.chosen is not None
    assert plan.chosen.kind is CandidateKind.SOURCE


def _cached(**kw: object) -> CachedArtifact:
    base = {
        "key": "sha256:" + "a" * 64,
        "name": "flash-attn",
        "version": "2.8.3",
        "filename": "flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl",
        "archs": ((9, 0),),
        "torch_version": "2.11.0+cu130",
        "cuda_version": "13.0",
        "cxx11_abi": True,
        "sha256": "b" * 64,
    }
    base.update(kw)
    return CachedArtifact(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("art", "accepted", "reason"),
    [
        pytest.param(_cached(), True, None, id="fits"),
        pytest.param(_cached(archs=((8, 0),)), False, "has no code for 9.0", id="wrong-arch"),
        pytest.param(
            _cached(torch_version="2.10.0+cu130"), False, "built for torch 2.10.0", id="wrong-torch"
        ),
    ],
)
def test_cache_candidate(catalog: Catalog, art: CachedArtifact, accepted: bool, reason: str | None) -> None:
    plan = resolve(snapshot(H200), catalog, Request(backend="flash-attn"), cached=[art])
    cand = next(c for c in plan.candidates if c.kind is CandidateKind.CACHE)
    assert cand.accepted is accepted
    assert cand.cache_key == art.key
    if reason:
        assert reason in " ".join(cand.reasons)
    else:
        assert plan.chosen is cand


@pytest.mark.parametrize(
    ("state", "accepted"),
    [
        pytest.param(
            InstalledBackend(
                backend="flash-attn",
                distribution="flash-attn",
                version="2.8.3",
                imports=True,
                native=(NativeModule(name="flash_attn_2_cuda", ok=True),),
            ),
            True,
            id="works",
        ),
        pytest.param(
            InstalledBackend(
                backend="flash-attn",
                distribution="flash-attn",
                version="2.8.3",
                imports=True,
                native=(NativeModule(name="flash_attn_2_cuda", ok=False, error="undefined symbol: _ZN3c10"),),
            ),
            False,
            id="native-broken",
        ),
    ],
)
def test_installed_candidate(catalog: Catalog, state: InstalledBackend, accepted: bool) -> None:
    snap = snapshot(H200)
    snap = dataclasses.replace(snap, backends=(state,))
    plan = resolve(snap, catalog, Request(backend="flash-attn"))
    first = plan.candidates[0]
    assert first.kind is CandidateKind.INSTALLED
    assert first.accepted is accepted
    if not accepted:
        assert "undefined symbol" in " ".join(first.reasons)
        assert plan.chosen is not None
        assert plan.chosen.kind is CandidateKind.SOURCE


def test_pure_python_backend_is_a_pip_install(catalog: Catalog) -> None:
    plan = resolve(snapshot(H200), catalog, Request(backend="flash-attn-4"))
    assert plan.chosen is not None
    assert plan.chosen.kind is CandidateKind.WHEEL
    offline = resolve(snapshot(H200), catalog, Request(backend="flash-attn-4", offline=True))
    assert not offline.viable


def test_builtin_backend(catalog: Catalog) -> None:
    assert resolve(snapshot(H200), catalog, Request(backend="sdpa-flash")).viable
    assert not resolve(snapshot(CPU), catalog, Request(backend="sdpa-flash")).viable


def test_a_builtin_backends_version_is_torchs(catalog: Catalog) -> None:
    """``sdpa-flash>=99`` (found by a CLI fuzz, 2026-12-03: accepted, and `install` said "nothing to do")."""
    torch_version = snapshot(H200).torch.version  # type: ignore[union-attr]
    refused = resolve(snapshot(H200), catalog, Request(backend="sdpa-flash", version=">=99"))
    assert not refused.viable
    assert f"comes with torch {torch_version}, which is not >=99" in refused.candidates[0].reasons[0]
    major_minor = ".".join(torch_version.split("+")[0].split(".")[:2])
    assert resolve(snapshot(H200), catalog, Request(backend="sdpa-flash", version=f"=={major_minor}.*")).viable


def test_flash_attn_3_not_on_rtx5090(catalog: Catalog) -> None:
    text = _source(resolve(snapshot(RTX5090), catalog, Request(backend="flash-attn-3")))
    assert "12.0" in text
    assert "outside" in text or "cannot build code" in text


def test_snapshot_tags_not_the_running_interpreter(catalog: Catalog) -> None:
    """The H200 snapshot is Python 3.12; this machine runs 3.11. The cp312 wheel must still be chosen."""
    wheels = list_find_links(str(WHEELS / "h200_flash_attn"))
    snap: SystemSnapshot = snapshot(H200)
    plan = resolve(snap, catalog, Request(backend="flash-attn"), wheels=wheels)
    assert plan.chosen is not None
    assert plan.chosen.wheel is not None
    assert "cp312" in plan.chosen.wheel.filename


def test_bad_version_text_is_usage_error(catalog: Catalog) -> None:
    from attnforge.errors import UsageError

    with pytest.raises(UsageError):
        resolve(snapshot(H200), catalog, Request(backend="flash-attn", version="==>2"))


def test_torch_info_helpers_unchanged() -> None:
    assert TorchInfo.__dataclass_fields__["version"]  # contract types still import


def test_newest_wheel_is_chosen_by_pep440_not_by_hand(catalog: Catalog, tmp_path: Path) -> None:
    """2.8.3.post1 > 2.8.3 > 2.8.3rc1 > 2.8 (issue 13: a hand-made key chose the rc and crashed on 2.8 vs 2.8.3)."""
    label = "+cu13torch2.11cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"
    for version in ("2.8", "2.8.3rc1", "2.8.3", "2.8.3.post1"):
        (tmp_path / f"flash_attn-{version}{label}").touch()
    plan = resolve(snapshot(H200), catalog, Request(backend="flash-attn"), wheels=list_find_links(str(tmp_path)))
    order = [c.wheel.filename.split("+")[0] for c in plan.candidates if c.wheel and c.accepted]
    assert order == ["flash_attn-2.8.3.post1", "flash_attn-2.8.3", "flash_attn-2.8.3rc1", "flash_attn-2.8"]
    assert plan.chosen is not None and plan.chosen.wheel is not None
    assert plan.chosen.wheel.filename.startswith("flash_attn-2.8.3.post1+")


def test_an_explicit_source_is_built_even_when_the_backend_is_installed(catalog: Catalog) -> None:
    """On the H200 a verify-failed SageAttention from one commit answered "already installed" for --source of a
    newer commit of the same version: a given --source is built (a cache hit when that source was built)."""
    from attnforge.build.source import parse_source

    state = InstalledBackend(backend="flash-attn", distribution="flash-attn", version="2.8.3", imports=True,
                             native=(NativeModule(name="flash_attn_2_cuda", ok=True),))
    snap = dataclasses.replace(snapshot(H200), backends=(state,))
    plan = resolve(snap, catalog, Request(backend="flash-attn", source=parse_source("/src/flash-attention")))
    installed = next(c for c in plan.candidates if c.kind is CandidateKind.INSTALLED)
    assert not installed.accepted and "--source /src/flash-attention" in " ".join(installed.reasons)
    assert plan.chosen is not None and plan.chosen.kind is not CandidateKind.INSTALLED


def test_an_installed_build_whose_verify_failed_is_not_installed_and_working(catalog: Catalog) -> None:
    """An installed backend whose latest verify on this device failed used to answer "already installed and
    working"; the plan now obtains it again (and the install verifies it again)."""
    state = InstalledBackend(backend="flash-attn", distribution="flash-attn", version="2.8.3", imports=True,
                             native=(NativeModule(name="flash_attn_2_cuda", ok=True),))
    snap = dataclasses.replace(snapshot(H200), backends=(state,))
    failed = Request(backend="flash-attn", installed_verify_failure="bf16 causal d=128: max abs err 0.3 > 0.02")
    installed = next(c for c in resolve(snap, catalog, failed).candidates if c.kind is CandidateKind.INSTALLED)
    assert not installed.accepted
    assert "its latest verify on this device failed: bf16 causal d=128" in " ".join(installed.reasons)
    ok = next(c for c in resolve(snap, catalog, Request(backend="flash-attn")).candidates
              if c.kind is CandidateKind.INSTALLED)
    assert ok.accepted


@pytest.mark.parametrize(
    ("source_sha256", "accepted", "reason"),
    [
        pytest.param("c" * 64, True, "built from these bytes of /src/flash-attention", id="same-tree"),
        pytest.param("d" * 64, False, "built from another source tree (sha256 cccccccccccc...", id="edited-tree"),
        pytest.param(None, False, "known only once it is fetched", id="remote-source"),
    ],
)
def test_a_source_is_served_from_the_cache_only_by_a_build_of_its_bytes(
    catalog: Catalog, source_sha256: str | None, accepted: bool, reason: str
) -> None:
    """``install --source`` after ``build --source`` is a cache hit, keyed by the source's content hash: a cached
    build of the same name and version from another tree (an older commit) is not."""
    from attnforge.build.source import parse_source

    source = parse_source("/src/flash-attention" if source_sha256 else "git+https://example.invalid/fa.git@v2.8.3")
    request = Request(backend="flash-attn", source=source, source_sha256=source_sha256)
    plan = resolve(snapshot(H200), catalog, request, cached=[_cached(source_sha256="c" * 64)])
    cand = next(c for c in plan.candidates if c.kind is CandidateKind.CACHE)
    assert cand.accepted is accepted
    assert reason in " ".join(cand.reasons)
    assert (plan.chosen is cand) is accepted


def test_a_source_build_asks_pip_for_the_newest_sdist_inside_a_range(catalog: Catalog) -> None:
    """``flash-attn>=99`` downloads ``flash-attn>=99`` (pip lists the versions it saw when none fits), not the
    newest sdist whatever its version; an exact pin stays the pin."""
    ranged = resolve(snapshot(H200), catalog, Request(backend="flash-attn", version=">=99", from_source=True))
    assert ranged.chosen is not None and ranged.chosen.build is not None
    assert ranged.chosen.build.source.requirement() == "flash-attn>=99"
    assert "flash-attn>=99" in ranged.chosen.description
    pinned = resolve(snapshot(H200), catalog, Request(backend="flash-attn", version="==2.8.3", from_source=True))
    assert pinned.chosen is not None and pinned.chosen.build is not None
    assert pinned.chosen.build.source.requirement() == "flash-attn==2.8.3"


def test_a_wheelhouse_sdist_does_not_hide_a_cached_wheel(catalog: Catalog) -> None:
    """An sdist found in --find-links becomes the request's source (it builds offline) without being hashed: the
    cache still serves its entries by the usual checks."""
    from attnforge.build.source import parse_source

    request = Request(backend="flash-attn", source=parse_source("/wheelhouse/flash_attn-2.8.3.tar.gz"))
    plan = resolve(snapshot(H200), catalog, request, cached=[_cached(source_sha256="c" * 64)])
    assert plan.chosen is not None and plan.chosen.kind is CandidateKind.CACHE


_VERSIONS = st.builds(lambda a, b, c: f"{a}.{b}.{c}", st.integers(0, 4), st.integers(0, 4), st.integers(0, 4))
_OPERATORS = st.sampled_from([">=", ">", "<", "<=", "==", "!=", "~=", "==="])
_CLAUSES = st.tuples(_OPERATORS, _VERSIONS).map(lambda t: t[0] + t[1])


@given(clauses=st.lists(_CLAUSES, min_size=1, max_size=3))
def test_a_spec_called_empty_admits_no_version(clauses: list[str]) -> None:
    """``flash-attn>=3,<2`` was planned as any request (CLI fuzz, 2026-12-03); :func:`_no_version_fits` refuses such
    a spec, and what it calls empty admits none of the versions around its bounds."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from attnforge.resolve.resolver import _no_version_fits

    spec = SpecifierSet(",".join(clauses))
    if _no_version_fits(spec):
        probes = [Version(f"{a}.{b}.{c}") for a in range(6) for b in range(6) for c in range(6)]
        assert not any(spec.contains(v, prereleases=True) for v in probes)


@pytest.mark.parametrize(("text", "empty"), [(">=3,<2", True), (">2,<=2", True), ("==2.8.3,<2.8", True),
                                             ("==2.8.3,!=2.8.3", True), ("===2.8.3,==2.8.4", True),
                                             (">=2,<=2", False), (">=2.8,<3", False), ("~=2.8", False),
                                             ("!=2.8.3,<3", False), ("==2.*,<3", False), ("===2.8.3", False)])
def test_no_version_fits(text: str, empty: bool) -> None:
    from packaging.specifiers import SpecifierSet

    from attnforge.resolve.resolver import _no_version_fits

    assert bool(_no_version_fits(SpecifierSet(text))) is empty
