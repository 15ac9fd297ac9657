"""Wheel sources as data: the shipped file, its checks, names people type, releases -> wheels, the fetcher."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from attnforge.catalog import load_catalog
from attnforge.catalog._check import Collector
from attnforge.errors import CatalogError
from attnforge.fetch.listings import age_text
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.sources import (
    check_against,
    index_url,
    load_wheel_sources,
    parse_wheel_sources,
    resolve_name,
    wheels_from_releases,
)

LISTINGS = Path(__file__).resolve().parent.parent / "fixtures" / "wheels" / "listings"
SNAP = Path(__file__).resolve().parent.parent / "fixtures" / "snapshots"


def test_the_shipped_sources_fit_the_catalog() -> None:
    ws = load_wheel_sources()
    assert check_against(ws, load_catalog()) == []
    assert {"dao-ailab", "mjun0812", "kingbri1", "woct0rdho", "pytorch-flash-attn-3", "pytorch-xformers"} <= set(
        ws.sources
    )
    assert all(s.sources for s in ws.sources.values())  # every source cites where its facts come from
    assert [s.id for s in ws.for_backend("sageattention-2")] == ["woct0rdho"]


def test_bad_fields_are_all_reported() -> None:
    doc = {
        "schema_version": 1,
        "sources": {
            "a": {"kind": "ftp", "backends": ["x"], "distributions": ["x"], "covers": "", "sources": ["s"]},
            "b": {
                "kind": "github-releases",
                "repo": "no-slash",
                "backends": ["x"],
                "distributions": ["x"],
                "covers": "",
                "sources": ["s"],
                "implied": {"torch_match": "sometimes"},
            },
        },
    }
    errors = Collector("t.toml")
    parse_wheel_sources(doc, errors)
    with pytest.raises(CatalogError) as err:
        errors.finish()
    text = "\n".join(err.value.problems)
    assert "sources.a.kind" in text and "sources.b.repo" in text and "sources.b.implied.torch_match" in text


@pytest.mark.parametrize("index", ["http://[::1", "https://[::1/x", "http://127.0.0.1:99999/simple", "http://h:x/",
                                   "https://", "ftp://mirror/simple", "simple"])
def test_an_index_that_is_not_a_url_is_reported_by_the_files_check(index: str) -> None:
    """``http://[::1`` passed as "a URL" (it starts like one) and raised ValueError from ``urlsplit`` when ``plan``
    listed the source, an internal error (CLI fuzz, 2026-12-03): the file's own check names it."""
    doc = {"schema_version": 1, "sources": {"t": {"kind": "pep503", "index": index, "backends": ["x"],
                                                   "distributions": ["x"], "covers": "", "sources": ["s"]}}}
    errors = Collector("t.toml")
    parse_wheel_sources(doc, errors)
    with pytest.raises(CatalogError) as err:
        errors.finish()
    assert "sources.t.index" in "\n".join(err.value.problems)


def test_an_index_with_a_cuda_tag_or_a_port_is_a_url() -> None:
    doc = {"schema_version": 1, "sources": {f"t{i}": {"kind": "pep503", "index": index, "backends": ["x"],
                                                       "distributions": ["x"], "covers": "", "sources": ["s"],
                                                       "grammars": []}
                                             for i, index in enumerate(["https://download.pytorch.org/whl/{cuda_tag}",
                                                                        "http://127.0.0.1:8080/simple",
                                                                        "http://[::1]:3141/root/pypi/+simple/",
                                                                        "file:///srv/wheels/simple"])}}
    errors = Collector("t.toml")
    parse_wheel_sources(doc, errors)
    errors.finish()


@pytest.mark.parametrize(
    ("typed", "backend", "noted"),
    [
        ("sageattention", "sageattention-2", True),
        ("SageAttention", "sageattention-2", True),
        ("flash_attn", "flash-attn", True),
        ("flash_attn_3", "flash-attn-3", True),
        ("fa3", "flash-attn-3", True),
        ("flash-attn", "flash-attn", False),
        ("sageattention-1", "sageattention-1", False),
        ("nonsense", "nonsense", False),
    ],
)
def test_names_people_type(typed: str, backend: str, noted: bool) -> None:
    got, note = resolve_name(typed, load_catalog())
    assert got == backend
    assert (note is not None) == noted


def test_sageattention_2_never_plans_the_pypi_1x_sdist() -> None:
    recipe = load_catalog().recipe("sageattention-2")
    assert recipe is not None
    assert "pypi-sdist" not in recipe.source_kinds
    assert recipe.git_url == "https://github.com/thu-ml/SageAttention.git"


def test_releases_become_wheels_with_their_digest() -> None:
    ws = load_wheel_sources()
    releases = json.loads((LISTINGS / "kingbri1_flash-attention.releases.json").read_text())
    refs = wheels_from_releases(releases, ws.sources["kingbri1"], listed_at="t")
    by_name = {r.filename: r for r in refs}
    ref = by_name["flash_attn-2.8.3+cu128torch2.7.0cxx11abiFALSE-cp312-cp312-win_amd64.whl"]
    assert ref.sha256 == "916ae4d818d2b5a02b3b25e8431251b88a01ce98d08315495dd78242d81f7182"
    assert ref.url.startswith("https://github.com/kingbri1/flash-attention/releases/download/v2.8.3/")
    assert ref.source == "kingbri1" and ref.grammars == ("flash-attn-kingbri1",)
    assert by_name["flash_attn-2.8.3+cu128torch2.8.0cxx11abiFALSE-cp312-cp312-win_amd64.whl"].sha256 is None
    # another distribution's assets in the same release are ignored
    other = [{"assets": [{"name": "triton-3.4.0-cp312-cp312-win_amd64.whl", "browser_download_url": "u"}]}]
    assert wheels_from_releases(other, ws.sources["kingbri1"], listed_at="t") == []


def test_per_cuda_index_url_follows_torch() -> None:
    src = load_wheel_sources().sources["pytorch-flash-attn-3"]
    h200 = SystemSnapshot.load(SNAP / "h200_torch2.11_cu130.json")
    cpu = SystemSnapshot.load(SNAP / "cpu_dev_torch2.13_cpu.json")
    assert index_url(src, h200) == "https://download.pytorch.org/whl/cu130/flash-attn-3/"
    assert index_url(src, cpu) is None


def test_route_times_come_from_the_data() -> None:
    rt = load_wheel_sources().route_times
    assert rt.expected_s("cache", "flash-attn") == 15
    assert rt.expected_s("source", "flash-attn") == 830
    assert rt.expected_s("source", "xformers") == rt.default_source_s


def test_age_text() -> None:
    now = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.timezone.utc)
    assert age_text("2026-11-22T09:00:00+00:00", now) == "3 h old"
    assert age_text("2026-11-20T12:00:00+00:00", now) == "2 days old"
    assert age_text("garbage", now) == "of unknown age"
