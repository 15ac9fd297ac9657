"""The tolerance table: packaged data valid and sourced, bad files reported by dotted path."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnforge.catalog.tolerances import PrecisionKind, load_tolerances
from attnforge.errors import CatalogError

GOOD_ROW = 'atol = 1e-3\nrtol = 1e-3\nmax_rel_l1 = 1e-2\nsources = ["a test"]\n'
HEAD = "schema_version = 1\n"


def test_packaged_rows_cover_the_verified_dtypes_and_cite_sources() -> None:
    tol = load_tolerances()
    for dtype in ("float16", "bfloat16", "float32"):
        row = tol.get(PrecisionKind.EXACT, dtype)
        assert row.sources
        assert 0 < row.rtol < 1
        assert 0 < row.atol < 1
    for dtype in ("float16", "bfloat16"):
        exact, quant = tol.get(PrecisionKind.EXACT, dtype), tol.get(PrecisionKind.QUANTIZED, dtype)
        assert quant.max_rel_l1 > exact.max_rel_l1  # quantized kernels are allowed more error


def test_packaged_tolerances_tighten_with_precision() -> None:
    tol = load_tolerances()
    atols = [tol.get(PrecisionKind.EXACT, d).atol for d in ("bfloat16", "float16", "float32", "float64")]
    assert atols == sorted(atols, reverse=True)


def test_missing_row_names_what_exists() -> None:
    with pytest.raises(CatalogError, match="no tolerance for quantized float32") as info:
        load_tolerances().get(PrecisionKind.QUANTIZED, "float32")
    assert info.value.hint is not None
    assert "exact.float16" in info.value.hint


@pytest.mark.parametrize(("body", "problems"), [
    pytest.param("schema_version = 2\n[exact.float16]\n" + GOOD_ROW, ["schema_version: expected 1, got 2"],
                 id="schema-version"),
    pytest.param(HEAD + "[exact.float16]\natol = -1\nrtol = 1e-3\nmax_rel_l1 = 1\nsources = ['x']\n",
                 ["exact.float16.atol: must be a positive finite number, got -1"], id="negative"),
    pytest.param(HEAD + "[exact.float16]\natol = 'big'\nrtol = 1e-3\nmax_rel_l1 = 1\nsources = []\n",
                 ["exact.float16.atol: expected float, got str 'big'",
                  "exact.float16.sources: must not be empty"],
                 id="wrong-type-and-empty-sources"),
    pytest.param("schema_version = 1\n[exact.float12]\n" + GOOD_ROW + "\n[fuzzy.float16]\n" + GOOD_ROW,
                 ["exact.float12: unknown dtype 'float12'", "fuzzy: unknown field",
                  "quantized: missing table"],
                 id="unknown-dtype-and-kind"),
    pytest.param(HEAD + "[quantized.bfloat16]\natol = 1e-3\nrtol = 1e-3\nsources = ['x']\ncolour = 1\n",
                 ["quantized.bfloat16.max_rel_l1: missing", "quantized.bfloat16.colour: unknown field"],
                 id="missing-and-unknown-field"),
])
def test_bad_files_report_every_problem_with_its_dotted_path(tmp_path: Path, body: str,
                                                             problems: list[str]) -> None:
    path = tmp_path / "tolerances.toml"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(CatalogError) as info:
        load_tolerances(path)
    for p in problems:
        assert any(line.startswith(p) for line in info.value.problems), info.value.problems


def test_not_toml_is_a_catalog_error(tmp_path: Path) -> None:
    path = tmp_path / "tolerances.toml"
    path.write_text("[exact.float16\n", encoding="utf-8")
    with pytest.raises(CatalogError, match="not valid TOML"):
        load_tolerances(path)
