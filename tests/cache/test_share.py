from __future__ import annotations

import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin

import pytest

from attnforge.cache import ArtifactKind, CacheKeyInputs, Store
from attnforge.cache._files import sha256_file
from attnforge.cache.share import export, import_
from attnforge.errors import UsageError
from tests._fakes import FakeClock
from tests.cache.conftest import inputs_for
from tests.cache.wheelmaker import flip_byte, make_wheel


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.extend(v for k, v in attrs if k == "href" and v)


def links(page: Path) -> list[str]:
    parser = _Links()
    parser.feed(page.read_text())
    return parser.hrefs


def test_export_writes_a_pep503_index_whose_links_resolve_to_the_wheels(
    store: Store, tmp_path: Path
) -> None:
    a = make_wheel(tmp_path / "a", name="Af_Pure.Fixture", version="1.0")
    b = make_wheel(tmp_path / "b", name="af-other", version="2.0+cu13.0")
    for w in (a, b):
        store.put(w, inputs_for(w))
    out = tmp_path / "export"
    result = export(store, out)
    assert result.projects == ("af-other", "af-pure-fixture")
    assert result.index_url == (out / "simple").resolve().as_uri()
    assert sorted(links(out / "simple" / "index.html")) == ["af-other/", "af-pure-fixture/"]
    for project, wheel in (("af-pure-fixture", a), ("af-other", b)):
        page = out / "simple" / project / "index.html"
        [href] = links(page)
        url, _, fragment = href.partition("#")
        assert fragment == f"sha256={sha256_file(wheel)}"
        target = Path(unquote(urljoin(page.as_uri(), url).removeprefix("file://")))
        assert target.name == wheel.name
        assert target.read_bytes() == wheel.read_bytes()
        assert json.loads((target.parent / "provenance.json").read_text())["filename"] == wheel.name


def test_export_is_incremental(store: Store, wheel: Path, tmp_path: Path) -> None:
    store.put(wheel, inputs_for(wheel))
    first = export(store, tmp_path / "out")
    second = export(store, tmp_path / "out")
    assert len(first.exported) == 1
    assert second.exported == ()
    assert second.already == first.exported


def test_export_leaves_out_static_libraries_from_the_pip_index_but_carries_them(
    store: Store, tmp_path: Path
) -> None:
    lib = tmp_path / "libflashattention.a"
    lib.write_bytes(b"!<arch>\n" * 100)
    inputs = CacheKeyInputs(name="candle-flash-attn", version="0.9.1", kind=ArtifactKind.STATIC_LIB,
                            source_sha256="34" * 32, python_tag="none", platform_tag="win_amd64")
    key = store.put(lib, inputs).entry.key
    result = export(store, tmp_path / "out")
    assert result.projects == ()
    fresh = Store(tmp_path / "other")
    assert import_(fresh, tmp_path / "out").imported == (key,)
    assert fresh.get(key).read_bytes() == lib.read_bytes()


def test_same_filename_from_two_builds_keeps_the_newest_in_the_index(
    store: Store, clock: FakeClock, wheel: Path, tmp_path: Path
) -> None:
    old = store.put(wheel, inputs_for(wheel, archs=((8, 0),))).entry.key
    clock.now += 60
    new = store.put(wheel, inputs_for(wheel, archs=((9, 0),))).entry.key
    result = export(store, tmp_path / "out")
    [href] = links(tmp_path / "out" / "simple" / "af-pure-fixture" / "index.html")
    assert new.removeprefix("sha256:") in href
    assert any(old in s for s in result.skipped)


def test_import_of_an_export_recovers_every_entry(store: Store, tmp_path: Path) -> None:
    wheels = [make_wheel(tmp_path / str(i), version=f"{i}.0") for i in range(3)]
    log = tmp_path / "build.log"
    log.write_text("compiled\n")
    keys = {store.put(w, inputs_for(w), log_path=log, provenance={"host": "ci"}).entry.key for w in wheels}
    export(store, tmp_path / "out")
    fresh = Store(tmp_path / "fresh")
    result = import_(fresh, tmp_path / "out")
    assert set(result.imported) == keys
    assert result.rejected == ()
    for key in keys:
        entry = fresh.show(key)
        assert fresh.get(key).read_bytes() == Path(store.show(key).path).read_bytes()
        assert entry.log_path is not None
        assert Path(entry.log_path).read_text() == "compiled\n"
        assert entry.provenance["host"] == "ci"
    assert import_(fresh, tmp_path / "out").already == result.imported


def test_import_from_another_cache_root(store: Store, wheel: Path, tmp_path: Path) -> None:
    key = store.put(wheel, inputs_for(wheel)).entry.key
    fresh = Store(tmp_path / "fresh")
    assert import_(fresh, store.root).imported == (key,)


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        pytest.param(lambda d: flip_byte(next(d.glob("*.whl"))), "fails its hash check", id="flipped-byte"),
        pytest.param(lambda d: next(d.glob("*.whl")).unlink(), "missing", id="missing-wheel"),
        pytest.param(
            lambda d: _edit_provenance(d, lambda p: p["inputs"].update(archs=["12.0"])),
            "not the hash of its recorded inputs", id="relabelled-archs",
        ),
        pytest.param(
            lambda d: _edit_provenance(d, lambda p: p.update(filename="../../evil.whl")), "not a plain file name",
            id="path-escape",
        ),
        pytest.param(
            lambda d: _edit_provenance(d, lambda p: p.pop("inputs")), "unreadable", id="no-inputs",
        ),
    ],
)
def test_import_rejects_tampered_exports(  # type: ignore[no-untyped-def]
    store: Store, wheel: Path, tmp_path: Path, tamper, reason: str
) -> None:
    store.put(wheel, inputs_for(wheel))
    export(store, tmp_path / "out")
    [entry_dir] = [p for p in (tmp_path / "out" / "artifacts").iterdir() if not p.name.startswith(".")]
    tamper(entry_dir)
    fresh = Store(tmp_path / "fresh")
    result = import_(fresh, tmp_path / "out")
    assert result.imported == ()
    assert len(result.rejected) == 1
    assert reason in result.rejected[0]
    assert fresh.list() == []


def _edit_provenance(entry_dir: Path, change) -> None:  # type: ignore[no-untyped-def]
    path = entry_dir / "provenance.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_export_skips_a_corrupt_entry_and_says_so(store: Store, tmp_path: Path) -> None:
    good = make_wheel(tmp_path / "g", version="1.0")
    bad = make_wheel(tmp_path / "b", version="2.0")
    store.put(good, inputs_for(good))
    flip_byte(Path(store.put(bad, inputs_for(bad)).entry.path))
    result = export(store, tmp_path / "out")
    assert len(result.exported) == 1
    assert any("corrupt" in s for s in result.errors)
    page = (tmp_path / "out/simple/af-pure-fixture/index.html").read_text()
    assert set(re.findall(r"af_pure_fixture-[\d.]+-", page)) == {"af_pure_fixture-1.0-"}


def test_import_of_a_directory_that_is_not_an_export_is_bad_input(store: Store, tmp_path: Path) -> None:
    (tmp_path / "random").mkdir()
    with pytest.raises(UsageError, match="not an attnforge export"):
        import_(store, tmp_path / "random")


@pytest.mark.parametrize("how", ["itself", "a-link", "its-artifacts-linked"])
def test_importing_the_cache_into_itself_is_refused_and_loses_nothing(store: Store, wheel: Path, tmp_path: Path,
                                                                      how: str) -> None:
    """``cache import $ATTNFORGE_HOME`` stored each entry over its own folder: an entry whose row was lost (what
    ``cache verify`` calls unindexed) was removed before it was read, lost for ``cache repair`` too (CLI fuzz,
    2026-12-03). Refused by any path to the store; the entry is still there for repair."""
    import sqlite3

    key = store.put(wheel, inputs_for(wheel)).entry.key
    folder = next(p for p in (store.root / "artifacts").iterdir() if (p / wheel.name).exists())
    with sqlite3.connect(store.root / "cache.db") as db:
        db.execute("DELETE FROM artifacts")
    source = store.root
    if how == "a-link":
        source = tmp_path / "link"
        source.symlink_to(store.root)
    elif how == "its-artifacts-linked":
        source = tmp_path / "other"
        source.mkdir()
        (source / "artifacts").symlink_to(store.root / "artifacts")
    with pytest.raises(UsageError, match="the attnforge cache itself") as err:
        import_(store, source)
    assert "cache repair" in (err.value.hint or "")
    assert (folder / wheel.name).read_bytes() == wheel.read_bytes()  # nothing moved or removed
    from attnforge.cache.repair import repair

    assert repair(store).indexed == (key,) and [e.key for e in store.list()] == [key]


def test_a_copied_export_still_imports(store: Store, wheel: Path, tmp_path: Path) -> None:
    """An export is relocatable: it is what gets uploaded to a bucket and downloaded elsewhere."""
    key = store.put(wheel, inputs_for(wheel)).entry.key
    export(store, tmp_path / "out")
    shutil.copytree(tmp_path / "out", tmp_path / "moved")
    assert import_(Store(tmp_path / "fresh"), tmp_path / "moved").imported == (key,)


@pytest.mark.parametrize("junk", [
    pytest.param({"schema": 1, "inputs": [1, 2], "filename": "x.whl"}, id="inputs-a-list"),
    pytest.param({"schema": 1, "inputs": {"kind": "wheel"}, "filename": "x.whl"}, id="no-name"),
    pytest.param({"schema": 1, "inputs": {"kind": "wheel", "name": "a"}}, id="no-filename"),
    pytest.param({"schema": 1, "inputs": {"kind": "wheel", "name": 5}, "filename": "x.whl", "sha256": "0"},
                 id="name-an-int"),
    pytest.param({"schema": 1, "inputs": {"kind": "wheel", "name": "zz"}, "filename": 5, "sha256": "0"},
                 id="filename-an-int"),
    pytest.param("same-file-name-newer-no-wheel", id="same-file-name-newer-no-wheel"),
])
def test_an_export_over_a_folder_no_export_wrote_indexes_only_real_wheels(store: Store, wheel: Path, tmp_path: Path,
                                                                           junk: object) -> None:
    """A destination's ``artifacts/`` may hold folders no export of ours wrote: a ``provenance.json`` with a list for
    ``inputs`` or without ``filename`` crashed ``cache export`` after the artifacts were copied (no index), and one
    naming a wheel it does not hold, newer than the real one, took its place in the index: a link to a missing file,
    exit 0 (CLI fuzz, 2026-12-03). Each such folder is left out of the index and said; the real wheel is linked."""
    store.put(wheel, inputs_for(wheel))
    out = tmp_path / "out"
    (out / "artifacts" / "junk").mkdir(parents=True)
    if junk == "same-file-name-newer-no-wheel":
        junk = {"schema": 1, "key": "sha256:" + "0" * 64, "inputs": {"kind": "wheel", "name": "af-pure-fixture"},
                "filename": wheel.name, "sha256": "0" * 64, "created_at": "2999-01-01T00:00:00+00:00"}
    (out / "artifacts" / "junk" / "provenance.json").write_text(json.dumps(junk))
    result = export(store, out)
    assert any(s.startswith("junk: not in the index") for s in result.skipped)
    for page in (out / "simple").rglob("index.html"):
        for href in links(page):
            if not href.endswith("/"):
                target = Path(unquote(urljoin(page.as_uri(), href.partition("#")[0]).removeprefix("file://")))
                assert target.is_file() and "junk" not in target.parts, href
    assert any(wheel.name in href for page in (out / "simple").rglob("index.html") for href in links(page))
