"""A fleet whose kinds differ only in torch (>= 2.9) plans one FlashAttention-3 build: its hopper build uses the
libtorch stable ABI from torch 2.9 (the recipe's ``stable_abi_from``), so the build's wheel key is torch >= 2.9."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from attnforge.catalog import load_catalog
from attnforge.fleet.kinds import Node, group_nodes, kind_of
from attnforge.fleet.plan import build_wheel_key, plan_fleet
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.types import Request

H200 = SystemSnapshot.load(Path(__file__).resolve().parents[1] / "fixtures" / "snapshots" / "h200_torch2.11_cu130.json")


def _on_torch(version: str, cxx11_abi: bool = True) -> SystemSnapshot:
    assert H200.torch is not None
    return dataclasses.replace(H200, torch=dataclasses.replace(H200.torch, version=version, cxx11_abi=cxx11_abi))


def _nodes(*versions: str) -> list[Node]:
    return [Node(node_id=f"n{i}", address="file", snapshot=_on_torch(v, cxx11_abi=i % 2 == 0))
            for i, v in enumerate(versions)]


def test_three_torch_versions_from_2_9_share_one_fa3_build() -> None:
    groups = group_nodes(_nodes("2.9.1+cu130", "2.10.0+cu130", "2.11.0+cu130"))
    assert len(groups) == 3, "three machine kinds (torch and C++ ABI differ)"
    plan = plan_fleet(groups, load_catalog(), [Request(backend="flash-attn-3", from_source=True)])
    assert len(plan.builds) == 1 == plan.artifacts
    (build,) = plan.builds
    assert set(build.kinds) == {g.kind.id for g in groups}
    assert (build.wheel.torch_version, build.wheel.cxx11_abi) == (">=2.9", None)


def test_an_older_torch_or_a_per_torch_recipe_keeps_its_own_key() -> None:
    catalog = load_catalog()
    older = kind_of(_on_torch("2.8.0+cu130")).wheel
    assert build_wheel_key(older, catalog.recipe("flash-attn-3")) == older
    newer = kind_of(_on_torch("2.11.0+cu130")).wheel
    assert build_wheel_key(newer, catalog.recipe("flash-attn")) == newer
    groups = group_nodes(_nodes("2.8.0+cu130", "2.11.0+cu130"))
    plan = plan_fleet(groups, catalog, [Request(backend="flash-attn-3", from_source=True)])
    assert len(plan.builds) == 2


def test_abi_torch_plans_one_build_per_torch_each_bound_to_it() -> None:
    """``fleet plan --abi torch``: the kinds that shared one stable-ABI build now get one build each, each spec
    carrying the catalog's per-torch edit, and their keys differ from the stable build's."""
    from attnforge.types.binary import AbiKind

    catalog = load_catalog()
    recipe = catalog.recipe("flash-attn-3")
    assert recipe is not None and recipe.per_torch is not None
    groups = group_nodes(_nodes("2.9.1+cu130", "2.10.0+cu130", "2.11.0+cu130"))
    stable = plan_fleet(groups, catalog, [Request(backend="flash-attn-3", from_source=True)])
    bound = plan_fleet(groups, catalog, [Request(backend="flash-attn-3", from_source=True, abi=AbiKind.TORCH)])
    assert len(stable.builds) == 1 and len(bound.builds) == 3
    assert {b.wheel.torch_version for b in bound.builds} == {"2.9.1+cu130", "2.10.0+cu130", "2.11.0+cu130"}
    assert all(b.spec.edits == recipe.per_torch_edits() and b.spec.abi is AbiKind.TORCH for b in bound.builds)
    assert stable.builds[0].key not in {b.key for b in bound.builds}
    assert len({b.key for b in bound.builds}) == 3
