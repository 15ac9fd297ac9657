"""Keys follow the binary's real ABI: a libtorch stable-ABI build is keyed and labelled once per (CUDA, archs,
minimum torch) and served to any torch from that minimum up (issue 32)."""

from __future__ import annotations

import dataclasses
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from attnforge.cache import CacheKeyInputs, Store
from attnforge.cache.key import CacheKey
from attnforge.catalog import load_catalog
from attnforge.errors import BuildError
from attnforge.install.abi import abi_of_symbols, built_target
from attnforge.install.keys import label_and_key, store_built
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.resolver import resolve
from attnforge.resolve.types import BuildSpec, CandidateKind, Request, SourceKind, SourceSpec
from attnforge.types.binary import AbiKind, target_version
from attnforge.types.local_label import LocalLabel
from tests._fakes import FIXTURES

CPU = SystemSnapshot.load(FIXTURES / "snapshots" / "cpu_dev_torch2.13_cpu.json")


@pytest.mark.parametrize(
    ("symbols", "abi"),
    [
        pytest.param(["aoti_torch_call_dispatcher", "aoti_torch_library_def", "PyModule_Create2"],
                     AbiKind.TORCH_STABLE, id="stable-shims"),
        pytest.param(["torch_call_dispatcher"], AbiKind.TORCH_STABLE, id="stable-dispatcher-2.10"),
        pytest.param(["aoti_torch_empty_strided", "_ZN3c1015SmallVectorBaseIjE8grow_podEPKvmm"], AbiKind.TORCH,
                     id="shims-and-c10-is-per-torch"),
        pytest.param(["_ZN2at4_ops3add4callERKNS_6TensorES4_RKN3c106ScalarE"], AbiKind.TORCH, id="aten"),
        pytest.param(["TVMFFIFunctionCall", "cudaLaunchKernel"], AbiKind.TVM_FFI, id="tvm-ffi"),
        pytest.param(["cudaLaunchKernel", "PyModule_Create2"], AbiKind.TORCH, id="unknown-is-strict"),
    ],
)
def test_the_abi_is_read_from_the_undefined_symbols(symbols: list[str], abi: AbiKind) -> None:
    assert abi_of_symbols(symbols) is abi


def test_torch_target_version_and_the_stable_label_round_trip() -> None:
    assert target_version("nvcc ... -DTORCH_TARGET_VERSION=0x0209000000000000 -O3") == (2, 9)
    assert target_version("-DTORCH_TARGET_VERSION=0x020a000000000000") == (2, 10)
    assert target_version("no flag") is None
    label = LocalLabel(torch=(2, 9), cuda="13.0", archs=((9, 0),), stable_abi=True)
    assert str(label) == "cu130torch2.9.stable.sm90"
    assert LocalLabel.parse(str(label)) == label
    assert label.torch_requirement == "torch>=2.9"
    with pytest.raises(ValueError, match="no C\\+\\+11 ABI"):
        LocalLabel(torch=(2, 9), cuda=None, cxx11_abi=True, stable_abi=True)


def test_a_per_torch_key_is_the_key_it_was_before_the_abi_field() -> None:
    """Every key made before ``abi`` existed is per-torch: its canonical JSON (so its digest) is unchanged."""
    inputs = CacheKeyInputs(name="x", version="1", source_sha256="ab" * 32, python_tag="cp312",
                            platform_tag="linux_x86_64", torch_version="2.11.0+cu130", cxx11_abi=True)
    assert "abi" not in inputs.to_json()
    stable = dataclasses.replace(inputs, abi=AbiKind.TORCH_STABLE, torch_version="2.9", cxx11_abi=None)
    assert stable.to_json()["abi"] == "torch-stable"
    assert CacheKeyInputs.from_json(stable.to_json()) == stable
    assert CacheKeyInputs.from_json(inputs.to_json()) == inputs


def _with_torch(snapshot: SystemSnapshot, version: str, cxx11_abi: bool = True) -> SystemSnapshot:
    assert snapshot.torch is not None
    return dataclasses.replace(snapshot, torch=dataclasses.replace(snapshot.torch, version=version,
                                                                    cxx11_abi=cxx11_abi))


@pytest.mark.integration
@pytest.mark.slow
def test_a_stable_abi_build_is_keyed_once_and_served_to_any_newer_torch(tmp_path: Path) -> None:
    """A real stable-ABI C++ extension (``tests/fixtures/stable_ext_pkg``: ``torch/csrc/stable/`` only,
    ``py_limited_api`` cp310, ``TORCH_TARGET_VERSION`` 2.9) built here with gcc: the binary says stable ABI, the
    build log says torch 2.9; the cache keys and labels it once for torch >= 2.9 and any CPython >= 3.10, and the
    resolver serves the entry to a machine with another torch (not to torch 2.8)."""
    from attnforge.build import execute

    source = tmp_path / "src"
    shutil.copytree(FIXTURES / "stable_ext_pkg", source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    spec = BuildSpec(name="af_stable_fixture", version=None, source=SourceSpec(kind=SourceKind.PATH,
                     location=str(source)), archs=(), max_jobs=2, nvcc_threads=1, env={"MAX_JOBS": "2"},
                     build_root=str(tmp_path / "b"), python=sys.executable)
    store = Store(tmp_path / "home")
    result = execute(spec, home=store.root)
    built_here = _with_torch(CPU, "2.13.0+cpu")
    target = built_target(result.wheel, snapshot=built_here, archs=(),
                          build_flags=result.log_path.read_text(encoding="utf-8"))
    assert (target.abi, target.torch, target.cxx11_abi) == (AbiKind.TORCH_STABLE, "2.9", None)
    assert target.describe() == "torch >= 2.9 (stable ABI)"
    other, node = tmp_path / "other", tmp_path / "node"
    other.mkdir()
    node.mkdir()
    copy = Path(shutil.copy(result.wheel, other))
    node_wheel = Path(shutil.copy(result.wheel, node))
    (tmp_path / "guard").mkdir()
    guard_wheel = Path(shutil.copy(result.wheel, tmp_path / "guard"))
    entry = store_built(store, spec, wheel=result.wheel, log_path=result.log_path,
                        source_sha256=result.source_sha256, snapshot=built_here, owned_dir=result.wheel.parent)
    assert entry.filename == "af_stable_fixture-0.1.0+cputorch2.9.stable-cp310-abi3-linux_x86_64.whl"
    # the same binary stored from a machine with torch 2.11 and the other C++ ABI: the same key
    again = store_built(Store(tmp_path / "home2"), spec, wheel=copy, log_path=result.log_path,
                        source_sha256=result.source_sha256, snapshot=_with_torch(CPU, "2.11.0+cpu", cxx11_abi=False))
    assert again.key == entry.key
    # a fleet node's build (provision.build.build_here) labels and keys it the same way, on its own torch
    labelled, node_inputs = label_and_key(node_wheel, spec, source_sha256=result.source_sha256,
                                          snapshot=_with_torch(CPU, "2.10.0+cpu"), log_path=result.log_path)
    assert labelled.name == entry.filename
    assert str(CacheKey.of(node_inputs)) == entry.key
    with zipfile.ZipFile(entry.path) as zf:
        metadata = zf.read("af_stable_fixture-0.1.0+cputorch2.9.stable.dist-info/METADATA").decode()
    assert "Requires-Dist: torch>=2.9" in metadata
    assert (entry.inputs.abi, entry.inputs.torch_version, entry.inputs.cxx11_abi) == ("torch-stable", "2.9", None)

    catalog = load_catalog()
    for torch, served in (("2.10.0+cpu", True), ("2.14.1+cpu", True), ("2.8.0+cpu", False)):
        plan = resolve(_with_torch(CPU, torch, cxx11_abi=False), catalog,
                       Request(backend="af-stable-fixture"), cached=store.cached_artifacts())
        cached = next(c for c in plan.candidates if c.kind is CandidateKind.CACHE)
        assert cached.accepted is served, (torch, cached.reasons)
        if not served:
            assert "or newer (stable ABI)" in " ".join(cached.reasons)
    # a build that was to bind to one torch (--abi torch's edit) and still made a stable-ABI binary is refused
    recipe = catalog.recipe("flash-attn-3")
    assert recipe is not None and recipe.per_torch is not None
    with pytest.raises(BuildError, match="its binary uses the libtorch stable ABI"):
        label_and_key(guard_wheel, dataclasses.replace(spec, edits=recipe.per_torch_edits()),
                      source_sha256=result.source_sha256, snapshot=built_here, log_path=result.log_path)


@pytest.mark.integration
@pytest.mark.slow
def test_abi_torch_builds_a_stable_abi_project_bound_to_the_building_torch(tmp_path: Path) -> None:
    """``--abi torch`` on a real build: the stable-ABI fixture's setup.py is written like FlashAttention-3's (its
    stable branch taken for torch >= 2.9), and the catalog's own FA3 edit, made in the build tree, makes gcc build
    the op through torch's C++ API instead; the binary reads as bound to this torch, the user's tree is untouched,
    the key names the edit, and the resolver serves it to ``--abi torch`` (or no ``--abi``), not ``torch-stable``."""
    from attnforge.build import execute

    recipe = load_catalog().recipe("flash-attn-3")
    assert recipe is not None and recipe.per_torch is not None
    edit = recipe.per_torch
    source = tmp_path / "src"
    shutil.copytree(FIXTURES / "stable_ext_pkg", source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    before = (source / "setup.py").read_text()
    assert before.count(edit.find) == 1
    spec = BuildSpec(name="af_stable_fixture", version=None, source=SourceSpec(kind=SourceKind.PATH,
                     location=str(source)), archs=(), max_jobs=2, nvcc_threads=1, env={"MAX_JOBS": "2"},
                     build_root=str(tmp_path / "b"), python=sys.executable, edits=(edit,))
    store = Store(tmp_path / "home")
    result = execute(spec, home=store.root)
    assert (source / "setup.py").read_text() == before
    assert "attnforge: edited setup.py in the build tree" in result.log_path.read_text(encoding="utf-8")
    built_here = _with_torch(CPU, "2.13.0+cpu")
    target = built_target(result.wheel, snapshot=built_here, archs=(),
                          build_flags=result.log_path.read_text(encoding="utf-8"))
    assert (target.abi, target.torch) == (AbiKind.TORCH, "2.13.0+cpu")
    (tmp_path / "guard").mkdir()
    guard_wheel = Path(shutil.copy(result.wheel, tmp_path / "guard"))
    with pytest.raises(BuildError, match="its binary is bound to one torch"):  # --abi torch-stable got this
        label_and_key(guard_wheel, dataclasses.replace(spec, edits=(), abi=AbiKind.TORCH_STABLE),
                      source_sha256=result.source_sha256, snapshot=built_here, log_path=result.log_path)
    entry = store_built(store, spec, wheel=result.wheel, log_path=result.log_path,
                        source_sha256=result.source_sha256, snapshot=built_here, owned_dir=result.wheel.parent)
    assert entry.inputs.abi == AbiKind.TORCH
    assert f"edit:setup.py:{edit.digest()}" in entry.inputs.flags
    catalog = load_catalog()
    for abi, served in ((AbiKind.TORCH, True), (None, True), (AbiKind.TORCH_STABLE, False)):
        plan = resolve(built_here, catalog, Request(backend="af-stable-fixture", abi=abi),
                       cached=store.cached_artifacts())
        cached = next(c for c in plan.candidates if c.kind is CandidateKind.CACHE)
        assert cached.accepted is served, (abi, cached.reasons)
