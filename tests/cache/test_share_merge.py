"""``cache export`` next to what was there: another PEP 503 index is merged, never clobbered, and the cache's own
directory is never an export's destination."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from attnforge.cache import Store
from attnforge.cache.share import export
from attnforge.errors import UsageError
from tests.cache.conftest import inputs_for
from tests.cache.test_share import links
from tests.cache.wheelmaker import make_wheel


def _foreign_index(root: Path) -> Path:
    """A PEP 503 index written by another tool: project ``af-foreign`` (its wheel under ``packages/``), and a
    page of its own for ``af-pure-fixture`` with an older release."""
    (root / "simple" / "af-foreign").mkdir(parents=True)
    (root / "simple" / "af-pure-fixture").mkdir(parents=True)
    make_wheel(root / "packages", name="af-foreign", version="1.0")
    make_wheel(root / "packages", name="af-pure-fixture", version="0.0.1")
    (root / "simple" / "index.html").write_text(
        '<!DOCTYPE html><html><body><a href="af-foreign/">af-foreign</a>\n'
        '<a href="af-pure-fixture/">af-pure-fixture</a></body></html>\n')
    (root / "simple" / "af-foreign" / "index.html").write_text(
        '<html><body><a href="../../packages/af_foreign-1.0-py3-none-any.whl" data-requires-python="&gt;=3.8">'
        "af_foreign-1.0-py3-none-any.whl</a></body></html>\n")
    (root / "simple" / "af-pure-fixture" / "index.html").write_text(
        '<html><body><a href="../../packages/af_pure_fixture-0.0.1-py3-none-any.whl">'
        "af_pure_fixture-0.0.1-py3-none-any.whl</a></body></html>\n")
    return root


def test_an_existing_index_keeps_its_projects_and_links(store: Store, tmp_path: Path) -> None:
    dest = _foreign_index(tmp_path / "index")
    foreign_page = (dest / "simple" / "af-foreign" / "index.html").read_text()
    wheel = make_wheel(tmp_path / "dist", version="0.1.0")
    store.put(wheel, inputs_for(wheel))

    result = export(store, dest)
    assert result.projects == ("af-pure-fixture",)
    assert sorted(links(dest / "simple" / "index.html")) == ["af-foreign/", "af-pure-fixture/"]
    assert (dest / "simple" / "af-foreign" / "index.html").read_text() == foreign_page, "not ours: untouched"
    hrefs = links(dest / "simple" / "af-pure-fixture" / "index.html")
    assert "../../packages/af_pure_fixture-0.0.1-py3-none-any.whl" in hrefs, "the index's own release stays"
    assert any(h.startswith("../../artifacts/") and wheel.name in h for h in hrefs)

    again = export(store, dest)  # a second export finds its own links and writes each once
    assert again.already == result.exported
    assert sorted(links(dest / "simple" / "index.html")) == ["af-foreign/", "af-pure-fixture/"]
    assert sorted(links(dest / "simple" / "af-pure-fixture" / "index.html")) == sorted(hrefs)


@pytest.mark.integration
def test_pip_finds_both_the_foreign_and_the_exported_projects(store: Store, tmp_path: Path) -> None:
    dest = _foreign_index(tmp_path / "index")
    wheel = make_wheel(tmp_path / "dist", version="0.1.0")
    store.put(wheel, inputs_for(wheel))
    url = export(store, dest).index_url
    for requirement, filename in (("af-foreign", "af_foreign-1.0-py3-none-any.whl"),
                                  ("af-pure-fixture==0.0.1", "af_pure_fixture-0.0.1-py3-none-any.whl"),
                                  ("af-pure-fixture==0.1.0", wheel.name)):
        got = tmp_path / "got" / requirement
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                               "--index-url", url, "--dest", str(got), requirement], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        assert [p.name for p in got.iterdir()] == [filename]


@pytest.mark.parametrize("where", [pytest.param(".", id="the-home"), pytest.param("artifacts", id="its-artifacts"),
                                   pytest.param("exports/today", id="a-folder-inside"),
                                   pytest.param("..", id="its-parent-when-the-home-is-named-simple")])
def test_the_cache_itself_is_never_an_export_destination(tmp_path: Path, where: str) -> None:
    home = tmp_path / "simple" if where == ".." else tmp_path / "home"
    store = Store(home)
    wheel = make_wheel(tmp_path / "dist")
    key = store.put(wheel, inputs_for(wheel)).entry.key
    before = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    with pytest.raises(UsageError, match="cannot export into") as info:
        export(store, home / where)
    assert info.value.hint is not None and "outside ATTNFORGE_HOME" in info.value.hint
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == before
    assert store.get(key).is_file()
