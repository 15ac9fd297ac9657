"""Kinds and the fleet plan, pure (no Ray): recorded snapshots, the one resolver, builds == distinct wheel keys."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from attnforge.build.source import parse_source
from attnforge.catalog import load_catalog
from attnforge.fleet.build import size_task
from attnforge.fleet.kinds import Node, group_nodes, kind_of
from attnforge.fleet.plan import plan_fleet
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.types import Request
from attnforge.types.cc import ComputeCapability

SNAPSHOTS = Path(__file__).resolve().parents[1] / "fixtures" / "snapshots"
NVCC_EXT = Path(__file__).resolve().parent / "fixtures" / "nvcc_ext"


def _load(file: str, **gpu: object) -> SystemSnapshot:
    doc = json.loads((SNAPSHOTS / file).read_text())
    for g in doc["gpus"]:
        g.update(gpu)
    return SystemSnapshot.from_json(json.dumps(doc))


def four_kinds() -> list[Node]:
    """H200 and B200 on torch 2.11/cu130 (one wheel key), H100 and an RTX 6000 Ada (8.9) on torch 2.8/cu128
    (another): four kinds, two builds."""
    snaps = [_load("h200_torch2.11_cu130.json"),
             _load("h200_torch2.11_cu130.json", name="NVIDIA B200", compute_capability=[10, 0]),
             _load("h100_torch2.8_cu128.json"),
             _load("h100_torch2.8_cu128.json", name="NVIDIA RTX 6000 Ada Generation", compute_capability=[8, 9])]
    return [Node(node_id=f"n{i}", address="file", snapshot=s) for i, s in enumerate(snaps)]


def _request() -> Request:
    return Request(backend="af-nvcc-fixture", source=parse_source(str(NVCC_EXT)), from_source=True)


def test_kinds_split_on_compute_capability_and_torch_but_share_wheel_keys() -> None:
    kinds = [kind_of(n.snapshot) for n in four_kinds()]
    assert len(set(kinds)) == 4
    assert len({k.wheel for k in kinds}) == 2
    assert kinds[0].describe().endswith("sm_90") and kinds[1].describe().endswith("sm_100")


def test_four_kinds_need_two_builds_each_a_union_fatbin() -> None:
    plan = plan_fleet(group_nodes(four_kinds()), load_catalog(), [_request()])
    assert len(plan.builds) == 2 == plan.artifacts
    archs = sorted(b.archs for b in plan.builds)
    assert archs == [(ComputeCapability(8, 9), ComputeCapability(9, 0)),
                     (ComputeCapability(9, 0), ComputeCapability(10, 0))]
    assert [r.detail for r in plan.routes].count("build 1 of 2") == 2
    assert len({b.key for b in plan.builds}) == 2
    for b in plan.builds:
        assert b.spec.env["TORCH_CUDA_ARCH_LIST"] in ("9.0;10.0", "8.9;9.0")


def test_many_nodes_of_one_kind_plan_like_one() -> None:
    nodes = four_kinds()
    many = [dataclasses.replace(nodes[i % 4], node_id=f"n{i}") for i in range(400)]
    plan = plan_fleet(group_nodes(many), load_catalog(), [_request()])
    assert len(plan.kinds) == 4 and sum(len(g.nodes) for g in plan.kinds) == 400
    assert len(plan.builds) == 2


def test_a_kind_that_cannot_be_served_says_why() -> None:
    win = SystemSnapshot.load(SNAPSHOTS / "windows_vs17.10_cuda12.3_torch2.5_cu124.json")
    plan = plan_fleet(group_nodes([Node(node_id="w", address="f", snapshot=win)]), load_catalog(), [_request()])
    (route,) = plan.routes
    assert route.route == "none" and plan.unserved == 1
    assert any("MSVC" in r or "_MSC_VER" in r for r in route.reasons)


@pytest.mark.parametrize(("cpus", "memory_gib", "want_cpus", "want_gib"), [
    pytest.param(16, 128, 16, 80, id="roomy-node: the spec's 16 jobs x 5 GiB"),
    pytest.param(2, 128, 2, 10, id="2-cpu node: MAX_JOBS lowered to 2"),
    pytest.param(4, 8, 4, 7.2, id="small RAM: capped to 90% of the node"),
])
def test_ray_task_sizing_follows_the_jobs_rule(cpus: int, memory_gib: float, want_cpus: int,
                                               want_gib: float) -> None:
    from attnforge.resolve.buildspec import plan_build

    snap = _load("h200_torch2.11_cu130.json")
    spec = plan_build(snap, load_catalog(), _request()).spec
    assert spec is not None and spec.max_jobs * spec.nvcc_threads == 16
    sized = size_task(spec, gib_per_thread=5, node_cpus=cpus, node_memory_bytes=memory_gib * 2**30)
    assert sized.num_cpus == want_cpus
    assert sized.memory_bytes == pytest.approx(want_gib * 2**30, rel=0.01)
    assert sized.spec.env["MAX_JOBS"] == str(min(16, cpus))


def test_a_prebuilt_wheel_beats_a_build_and_counts_once_across_kinds(tmp_path: Path) -> None:
    import zipfile

    from attnforge.fetch.indexes import list_find_links

    name = "flash_attn-2.8.3+cu130torch2.11.cxx11abitrue.sm80sm90-cp312-cp312-linux_x86_64.whl"
    with zipfile.ZipFile(tmp_path / name, "w") as zf:
        zf.writestr("flash_attn-2.8.3.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: cp312-cp312-linux_x86_64\n")
    nodes = [Node(node_id="h200", address="f", snapshot=_load("h200_torch2.11_cu130.json")),
             Node(node_id="a100", address="f", snapshot=_load("h200_torch2.11_cu130.json", name="NVIDIA A100",
                                                                compute_capability=[8, 0]))]
    request = Request(backend="flash-attn", find_links=(str(tmp_path),), offline=True)
    plan = plan_fleet(group_nodes(nodes), load_catalog(), [request],
                      wheels={"flash-attn": list_find_links(str(tmp_path))})
    assert [r.route for r in plan.routes] == ["wheel", "wheel"]
    assert plan.builds == () and plan.artifacts == 1


def test_a_cpp_only_source_sizes_its_ray_tasks_with_gccs_memory() -> None:
    """The fleet's Ray task for a C++-only source reserves the C++-only recipe's 2 GiB per compile job, as a single
    machine's plan sizes it (resolve.buildspec.build_recipe), not the CUDA recipe's 5; a CUDA source keeps 5."""
    ext_pkg = SNAPSHOTS.parent / "ext_pkg"
    cpp = Request(backend="af-ext-fixture", source=parse_source(str(ext_pkg)), from_source=True)
    catalog = load_catalog()
    gib = {b.gib_per_thread for b in plan_fleet(group_nodes(four_kinds()), catalog, [cpp]).builds}
    assert gib == {catalog.recipes["torch-cpp-extension"].gb_per_nvcc_thread} == {2}
    assert {b.gib_per_thread for b in plan_fleet(group_nodes(four_kinds()), catalog, [_request()]).builds} == {5}
