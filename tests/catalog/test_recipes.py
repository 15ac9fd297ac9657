"""Build recipes and wheel-label grammars from backends.toml."""

from __future__ import annotations

import pytest
from packaging.utils import parse_wheel_filename

from attnforge.catalog import Catalog, load_catalog
from attnforge.catalog.recipes import CudaTag, WheelLabel
from attnforge.catalog.toolchain import Target


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def test_backends_keep_their_fields(catalog: Catalog) -> None:
    fa = catalog.backend("flash-attn")
    assert fa.native_modules == ("flash_attn_2_cuda",)
    assert fa.support.supports_cc((9, 0))


@pytest.mark.parametrize(
    ("recipe", "archs", "env", "value"),
    [
        pytest.param("flash-attn", ["sm_90", "sm_120"], "FLASH_ATTN_CUDA_ARCHS", "90;120", id="fa2-digits"),
        pytest.param(
            "sageattention-2", ["sm_90a", "sm_120a"], "TORCH_CUDA_ARCH_LIST", "9.0;12.0", id="sage-dotted"
        ),
        pytest.param("xformers", ["sm_120a", "sm_80"], "TORCH_CUDA_ARCH_LIST", "8.0;12.0", id="sorted"),
    ],
)
def test_arch_variable_format(catalog: Catalog, recipe: str, archs: list[str], env: str, value: str) -> None:
    r = catalog.recipes[recipe]
    assert r.arch_env == env
    assert r.arch_value(tuple(Target.parse(a) for a in archs)) == value


@pytest.mark.parametrize(
    ("recipe", "cc", "target"),
    [
        pytest.param("flash-attn", (9, 0), "sm_90", id="fa2-h100"),
        pytest.param("flash-attn", (8, 9), "sm_80", id="fa2-ada-uses-sm80-cubin"),
        pytest.param("flash-attn", (12, 1), "sm_120", id="fa2-gb10-uses-sm120"),
        pytest.param("sageattention-2", (9, 0), "sm_90a", id="sage-hopper-90a"),
        pytest.param("flash-attn-3", (12, 0), None, id="fa3-no-blackwell-consumer"),
    ],
)
def test_recipe_target_for_gpu(
    catalog: Catalog, recipe: str, cc: tuple[int, int], target: str | None
) -> None:
    got = catalog.recipes[recipe].target_for(cc, catalog.tools.runs_on)
    assert (str(got) if got else None) == target


def test_unknown_names_get_the_generic_recipe(catalog: Catalog) -> None:
    r = catalog.recipe("my-own-kernel")
    assert r is not None
    assert r.arch_env == "TORCH_CUDA_ARCH_LIST"
    assert catalog.recipe("sdpa-flash") is None


@pytest.mark.parametrize("gid", sorted(load_catalog().wheel_grammars))
def test_every_grammar_reads_its_example_and_round_trips(catalog: Catalog, gid: str) -> None:
    grammar = catalog.wheel_grammars[gid]
    _, version, _, _ = parse_wheel_filename(grammar.example)
    assert version.local is not None
    label = grammar.parse(version.local)
    assert label is not None
    assert grammar.format(label).lower() == version.local
    assert grammar.parse(grammar.format(label)) == label


def test_upstream_label_fields(catalog: Catalog) -> None:
    g = catalog.wheel_grammars["flash-attn-upstream"]
    assert g.parse("cu12torch2.8cxx11abitrue") == WheelLabel(
        grammar="flash-attn-upstream", cuda=CudaTag(major=12, minor=None), torch="2.8", cxx11_abi=True
    )
    assert g.parse("cu128torch2.8") is None


@pytest.mark.parametrize(
    ("digits", "major", "minor"),
    [
        pytest.param("12", 12, None, id="major"),
        pytest.param("128", 12, 8, id="12.8"),
        pytest.param("118", 11, 8, id="11.8"),
        pytest.param("130", 13, 0, id="13.0"),
    ],
)
def test_cuda_tag(digits: str, major: int, minor: int | None) -> None:
    tag = CudaTag.parse(digits)
    assert (tag.major, tag.minor) == (major, minor)
    assert str(tag) == digits
