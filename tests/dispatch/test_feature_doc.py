"""docs/features.md is generated from the capability data and must match it."""

from __future__ import annotations

from pathlib import Path

from attnforge.backends.capabilities import load_capabilities
from attnforge.backends.feature_table import packaged_page

DOC = Path(__file__).resolve().parents[2] / "docs" / "features.md"


def test_the_features_page_is_in_sync_with_the_catalog() -> None:
    assert DOC.read_text(encoding="utf-8") == packaged_page(), (
        "docs/features.md is stale: run PYTHONPATH=src python -m attnforge.backends.feature_table docs/features.md")


def test_the_page_shows_every_backend_and_what_it_claims() -> None:
    page = packaged_page()
    for bid, caps in load_capabilities().items():
        row = next(line for line in page.splitlines() if line.startswith(f"| `{bid}` |"))
        restricted = int((bool(caps.mask_max_seqlen_q) or caps.mask_with is not None) and "mask" in caps.features)
        assert row.count("yes") >= len(caps.features) - restricted
        assert row.count("decode only") == int(bool(caps.mask_max_seqlen_q) and "mask" in caps.features)
        if restricted and caps.mask_with is not None:  # "beside softcap, window only"
            assert f"beside {', '.join(sorted(caps.mask_with))} only" in row
    assert "| `exact` |" in page and "| `sdpa` |" in page
