"""``--abi``: a source build bound to the building torch (the recipe's per-torch edit) or to the libtorch stable
ABI, asked for in the request and checked before any compiler runs; cached builds and prebuilt wheels of the other
ABI are not taken."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from attnforge.build.execute import apply_edit
from attnforge.catalog import DATA_DIR, load_catalog
from attnforge.catalog.recipes import SourceEdit
from attnforge.errors import BuildError, CatalogError, ResolveError
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.buildspec import build_spec
from attnforge.resolve.preflight import abi_check
from attnforge.resolve.resolver import abi_problem
from attnforge.resolve.types import Request
from attnforge.types.binary import AbiKind

SNAPSHOTS = Path(__file__).parents[1] / "fixtures" / "snapshots"
H200 = SystemSnapshot.load(SNAPSHOTS / "h200_torch2.11_cu130.json")  # torch 2.11: FA3 builds the stable ABI
H100_28 = SystemSnapshot.load(SNAPSHOTS / "h100_torch2.8_cu128.json")  # torch 2.8: FA3 builds flash_api.cpp


def test_abi_torch_on_a_stable_abi_recipe_edits_the_build_tree_and_names_another_tree() -> None:
    catalog = load_catalog()
    recipe = catalog.recipe("flash-attn-3")
    assert recipe is not None and recipe.per_torch is not None
    plain = build_spec(H200, catalog, Request(backend="flash-attn-3"))
    bound = build_spec(H200, catalog, Request(backend="flash-attn-3", abi=AbiKind.TORCH))
    assert plain.edits == ()
    # the plan offers it, with what the catalog's recipe says it saves (data with a source, not a literal in code)
    assert recipe.per_torch.gain and any("--abi torch binds it to this torch instead: " + recipe.per_torch.gain in n
                                         for n in plain.notes), plain.notes
    assert bound.edits == recipe.per_torch_edits()
    assert not any("--abi torch binds it" in n for n in bound.notes)
    assert bound.build_root != plain.build_root  # a kept tree of one is never resumed as the other
    assert any("--abi torch: bound to torch 2.11.0+cu130" in n for n in bound.notes)
    stable = build_spec(H200, catalog, Request(backend="flash-attn-3", abi=AbiKind.TORCH_STABLE))
    assert stable.edits == () and stable.build_root == plain.build_root


def test_abi_torch_where_the_project_binds_to_torch_anyway_edits_nothing() -> None:
    spec = build_spec(H100_28, load_catalog(), Request(backend="flash-attn-3", abi=AbiKind.TORCH))
    assert spec.edits == ()
    assert any("as the project builds it" in n for n in spec.notes)
    plain = build_spec(H100_28, load_catalog(), Request(backend="flash-attn-3"))
    assert not any("--abi torch binds it" in n for n in plain.notes)  # nothing to offer on torch 2.8


@pytest.mark.parametrize(
    ("snapshot", "backend", "said"),
    [
        pytest.param(H100_28, "flash-attn-3", "only with torch >= 2.9; this is torch 2.8.0+cu128", id="old-torch"),
        pytest.param(H200, "flash-attn", "flash-attn has no libtorch stable-ABI build", id="no-stable-build"),
    ],
)
def test_abi_torch_stable_that_the_build_cannot_give_is_refused_before_compiling(
        snapshot: SystemSnapshot, backend: str, said: str) -> None:
    with pytest.raises(ResolveError) as err:
        build_spec(snapshot, load_catalog(), Request(backend=backend, abi=AbiKind.TORCH_STABLE))
    assert said in (err.value.cause or "")
    assert "drop --abi torch-stable" in (err.value.hint or "")


def test_abi_torch_on_a_stable_abi_recipe_without_a_known_edit_is_refused() -> None:
    recipe = load_catalog().recipe("flash-attn-3")
    assert recipe is not None
    check = abi_check(H200, dataclasses.replace(recipe, per_torch=None),
                      Request(backend="flash-attn-3", abi=AbiKind.TORCH))
    assert check is not None and not check.ok
    assert "knows no switch" in check.reason and check.fix and "drop --abi torch" in check.fix
    assert abi_check(H200, recipe, Request(backend="flash-attn-3")) is None  # no --abi: nothing asked
    generic = load_catalog().recipe("my-ext")  # a --source project the catalog does not know: its binary tells
    assert generic is not None
    check = abi_check(H200, generic, Request(backend="my-ext", abi=AbiKind.TORCH_STABLE))
    assert check is not None and check.ok and "read from the built binary" in check.reason


@pytest.mark.parametrize(
    ("asked", "stable", "refused"),
    [(None, True, False), (None, False, False), (None, None, False), (AbiKind.TORCH, True, True),
     (AbiKind.TORCH, False, False), (AbiKind.TORCH, None, True), (AbiKind.TORCH_STABLE, True, False),
     (AbiKind.TORCH_STABLE, False, True), (AbiKind.TORCH_STABLE, None, True)],
)
def test_a_binary_of_the_other_abi_is_not_taken(asked: AbiKind | None, stable: bool | None, refused: bool) -> None:
    problem = abi_problem(Request(backend="flash-attn-3", abi=asked), stable=stable)
    assert (problem is not None) is refused


@pytest.mark.parametrize(
    ("filename", "implied", "asked", "taken"),
    [("flash_attn_3-3.0.0+cu130torch2.9.stable-cp310-abi3-linux_x86_64.whl", None, AbiKind.TORCH, False),
     ("flash_attn_3-3.0.0+cu130torch2.9.stable-cp310-abi3-linux_x86_64.whl", None, AbiKind.TORCH_STABLE, True),
     ("flash_attn_3-3.0.0+cu130torch2.11.cxx11abitrue-cp312-cp312-linux_x86_64.whl", None, AbiKind.TORCH, True),
     # the PyTorch index's FA3 wheels carry no label; the index implies the stable ABI (wheel_sources.toml)
     ("flash_attn_3-3.0.0-cp39-abi3-manylinux_2_28_x86_64.whl", "at-least", AbiKind.TORCH, False),
     ("flash_attn_3-3.0.0-cp39-abi3-manylinux_2_28_x86_64.whl", "at-least", AbiKind.TORCH_STABLE, True),
     # neither a label nor an index says: not taken under --abi, taken without it
     ("flash_attn_3-3.0.0-cp39-abi3-manylinux_2_28_x86_64.whl", None, AbiKind.TORCH, False),
     ("flash_attn_3-3.0.0-cp39-abi3-manylinux_2_28_x86_64.whl", None, None, True)],
)
def test_a_prebuilt_wheel_is_judged_by_its_label_or_its_index(filename: str, implied: str | None,
                                                               asked: AbiKind | None, taken: bool) -> None:
    from attnforge.resolve.resolver import resolve
    from attnforge.resolve.types import CandidateKind, WheelRef

    ref = WheelRef(filename=filename, url=f"file:///wh/{filename}", implied_cuda="130" if implied else None,
                   implied_torch="2.9" if implied else None, implied_torch_match=implied)
    plan = resolve(H200, load_catalog(), Request(backend="flash-attn-3", abi=asked), wheels=[ref])
    wheel = next(c for c in plan.candidates if c.kind is CandidateKind.WHEEL)
    abi_reasons = [r for r in wheel.reasons if "--abi" in r]
    assert bool(abi_reasons) is not taken, wheel.reasons


def test_the_edit_is_made_once_in_the_copy_and_a_changed_source_is_refused(tmp_path: Path) -> None:
    edit = SourceEdit(file="setup.py", find="if new_torch:", replace="if False:")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setup.py").write_text("if new_torch:\n    a = 1\n")
    apply_edit(tree, edit)
    assert (tree / "setup.py").read_text() == "if False:\n    a = 1\n"
    for text, count in (("if old_torch:\n", "0 times"), ("if new_torch:\nif new_torch:\n", "2 times")):
        (tree / "setup.py").write_text(text)
        with pytest.raises(BuildError, match=count) as err:
            apply_edit(tree, edit)
        assert "drop --abi torch" in (err.value.hint or "")
        assert (tree / "setup.py").read_text() == text  # nothing half-written
    with pytest.raises(BuildError, match=r"cannot edit missing\.py"):
        apply_edit(tree, dataclasses.replace(edit, file="missing.py"))


def test_a_per_torch_edit_is_checked_where_the_catalog_is_read(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data)
    text = (data / "backends.toml").read_text()
    text = text.replace('find = "if torch_version >= target_version:"', 'find = ""\nfrom = 3', 1)
    text = text.replace("[recipes.flash-attn.slim]", '[recipes.flash-attn.per_torch]\nfile = "setup.py"\n'
                        'find = "x"\nreplace = "y"\nsources = ["here"]\n\n[recipes.flash-attn.slim]', 1)
    text = text.replace('find = "py_limited_api=True,"', 'find = ""\nto = 1', 1)  # one of the edits made with it
    (data / "backends.toml").write_text(text)
    with pytest.raises(CatalogError) as err:
        load_catalog(data)
    problems = "\n".join(err.value.problems)
    assert "recipes.flash-attn-3.per_torch.find: must not be empty" in problems
    assert "recipes.flash-attn-3.per_torch: unknown field(s) ['from']" in problems
    assert "recipes.flash-attn.per_torch: only a recipe with stable_abi_from" in problems
    assert "recipes.flash-attn-3.per_torch.also[1].find: must not be empty" in problems
    assert "recipes.flash-attn-3.per_torch.also[1]: unknown field(s) ['to']" in problems


def test_abi_torch_on_fa3_adds_the_lean_entry_and_leaves_the_limited_api() -> None:
    """FA3's ``--abi torch`` edits, in order: the binding one first, then the lean entry's (``flash_attn_3._C``
    becomes a pybind11 module, so the build leaves ``py_limited_api`` and its wheel is tagged for the building
    Python); the entry sets the version :mod:`attnforge.backends._fa3_direct` calls."""
    from attnforge.backends import _fa3_direct

    recipe = load_catalog().recipe("flash-attn-3")
    assert recipe is not None and recipe.per_torch is not None
    edits = recipe.per_torch_edits()
    assert edits[0] == recipe.per_torch and len(edits) == 6
    assert [e.file for e in edits].count("flash_api.cpp") == 2
    entry = edits[-1].replace
    assert f'm.attr("attnforge_entry") = {_fa3_direct.ENTRY_VERSION};' in entry
    assert "PYBIND11_MODULE(_C, m)" in entry and entry.endswith(edits[-1].find)
    assert any("py_limited_api=False" in e.replace for e in edits)


@pytest.mark.parametrize(
    ("version", "asked", "taken"),
    [("3.0.0+cu130torch2.9.stable", AbiKind.TORCH, False), ("3.0.0+cu130torch2.9.stable", None, True),
     ("3.0.0+cu130torch2.11.cxx11abitrue", AbiKind.TORCH, True),
     ("3.0.0+cu130torch2.11.cxx11abitrue", AbiKind.TORCH_STABLE, False),
     ("3.0.0", AbiKind.TORCH, True)],  # no attnforge label: its ABI is not known, the installed build stands
)
def test_an_installed_build_of_the_other_abi_is_not_kept(version: str, asked: AbiKind | None, taken: bool) -> None:
    from attnforge.probe.snapshot import InstalledBackend
    from attnforge.resolve.resolver import resolve
    from attnforge.resolve.types import CandidateKind

    fa3 = InstalledBackend(backend="flash-attn-3", distribution="flash-attn-3", version=version, imports=True)
    snapshot = dataclasses.replace(H200, backends=(*(b for b in H200.backends if b.backend != "flash-attn-3"), fa3))
    plan = resolve(snapshot, load_catalog(), Request(backend="flash-attn-3", abi=asked))
    installed = next(c for c in plan.candidates if c.kind is CandidateKind.INSTALLED)
    assert installed.accepted is taken, installed.reasons
