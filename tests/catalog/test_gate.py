"""tolerances.toml's [gate.quantized]: read strictly, every bad field named."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnforge.catalog._check import DATA_DIR
from attnforge.catalog.tolerances import load_quantized_gate, load_tolerances
from attnforge.errors import CatalogError

TOLERANCES_FILE = DATA_DIR / "tolerances.toml"


def test_the_packaged_gate_has_issue_17s_bounds_and_sources() -> None:
    gate = load_quantized_gate()
    assert gate is not None
    assert (gate.max_rel_l1, gate.min_cosine) == (0.05, 0.999)
    assert any("issue 17" in s for s in gate.sources)


@pytest.mark.parametrize(("table", "problem"), [
    pytest.param("max_rel_l1 = -1\nmin_cosine = 0.999\nsources = ['x']", "gate.quantized.max_rel_l1",
                 id="negative"),
    pytest.param("max_rel_l1 = 0.05\nmin_cosine = 0.999\nsources = []", "gate.quantized.sources", id="no-source"),
    pytest.param("max_rel_l1 = 0.05\nmin_cosine = 0.999\nsources = ['x']\nmax_l2 = 1", "gate.quantized.max_l2",
                 id="unknown-field"),
])
def test_a_bad_gate_is_a_catalog_error_naming_the_field(tmp_path: Path, table: str, problem: str) -> None:
    text = TOLERANCES_FILE.read_text(encoding="utf-8").split("[gate.quantized]")[0]
    path = tmp_path / "tolerances.toml"
    path.write_text(text + "[gate.quantized]\n" + table + "\n", encoding="utf-8")
    with pytest.raises(CatalogError) as err:
        load_tolerances(path)
    assert any(problem in str(p) for p in err.value.problems)


def test_a_file_without_a_gate_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "tolerances.toml"
    path.write_text(TOLERANCES_FILE.read_text(encoding="utf-8").split("[gate.quantized]")[0], encoding="utf-8")
    assert load_tolerances(path).gate is None
