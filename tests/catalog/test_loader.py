"""The loader names every bad field of every file at once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attnforge.catalog import DATA_DIR, load_catalog
from attnforge.errors import CatalogError


def _copy_data(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data)
    return data


def test_packaged_catalog_loads() -> None:
    cat = load_catalog()
    assert {"flash-attn", "flash-attn-3", "sageattention-2", "xformers"} <= set(cat.recipes)
    assert cat.tools.gpus


def test_broken_files_report_every_bad_path(tmp_path: Path) -> None:
    data = _copy_data(tmp_path)
    tc = (data / "toolchain.toml").read_text()
    tc = tc.replace('names = ["sm_89", "sm_90"]', 'names = ["sm_89", "sm90"]', 1)
    tc = tc.replace('cuda_min = "12.4"', 'cuda_min = "twelve"', 1)
    tc = tc.replace('runs_on = "exact"', 'runs_on = "sometimes"', 1)
    tc = tc.replace(
        'version = "2.8"\ncuda = ["12.6", "12.8", "12.9"]\npypi_default = "12.8"',
        'version = "2.8"\ncuda = ["12.6", "12.8", "12.9"]\npypi_default = "12.4"',
        1,
    )
    tc = tc.replace('cc = "9.0"\narch = "Hopper"', 'cc = "nine"\narch = "Hopper"\ncolour = "green"', 1)
    (data / "toolchain.toml").write_text(tc)
    bt = (data / "backends.toml").read_text()
    bt = bt.replace('arch_format = "digits"', 'arch_format = "hex"', 1)
    bt = bt.replace(
        'targets = ["sm_80", "sm_90", "sm_100", "sm_110", "sm_120"]', 'targets = ["sm_80", "sm_9000"]', 1
    )
    bt = bt.replace('label = "cu{cuda}torch{torch}cxx11abi{cxx11abi}"', 'label = "cu{cuda}torch{pytorch}"', 1)
    (data / "backends.toml").write_text(bt)

    with pytest.raises(CatalogError) as err:
        load_catalog(data)
    problems = "\n".join(err.value.problems)
    expected = [
        "toolchain.toml: targets[5].names[1]",
        "toolchain.toml: host_compilers[4].cuda_min",
        "toolchain.toml: compat.arch_specific.runs_on",
        "toolchain.toml: torch[4].pypi_default",
        "toolchain.toml: gpus[6].cc",
        "toolchain.toml: gpus[6].colour: unknown field",
        "backends.toml: recipes.flash-attn.arch_format",
        "backends.toml: recipes.flash-attn.targets[1]",
        "backends.toml: wheel_grammars.flash-attn-upstream.label",
    ]
    for path in expected:
        assert path in problems
    assert len(err.value.problems) >= len(expected)
    assert "toolchain.toml" in err.value.message
    assert "backends.toml" in err.value.message


def test_missing_file_is_a_catalog_error(tmp_path: Path) -> None:
    data = _copy_data(tmp_path)
    (data / "toolchain.toml").unlink()
    with pytest.raises(CatalogError, match="cannot read catalog file"):
        load_catalog(data)


def test_one_loader_checks_schema_and_top_keys_and_caches_the_packaged_file(tmp_path: Path) -> None:
    from attnforge.catalog._check import load_file
    from attnforge.catalog.msvc import load_msvc
    from attnforge.catalog.tolerances import load_tolerances

    bad = tmp_path / "x.toml"
    bad.write_text("schema_version = 2\nstray = 1\n")
    with pytest.raises(CatalogError) as info:
        load_file("x.toml", lambda doc, errors: doc, path=bad, top_keys={"rows"})
    assert info.value.problems == ("schema_version: expected 1, got 2", "stray: unknown field")
    assert load_msvc() is load_msvc()  # the packaged file is read once
    assert load_tolerances() is load_tolerances()
    ok = tmp_path / "y.toml"
    ok.write_text("schema_version = 1\nrows = 3\n")
    assert load_file("y.toml", lambda doc, errors: doc["rows"], path=ok, top_keys={"rows"}) == 3
