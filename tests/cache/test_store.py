from __future__ import annotations

import errno
import json
import sqlite3
from pathlib import Path

import pytest

from attnforge.cache import ArtifactKind, CacheKey, CacheKeyInputs, Store
from attnforge.cache._files import copy_hashed, sha256_file
from attnforge.cache.prune import prune
from attnforge.errors import CacheError, UsageError
from tests._fakes import FakeClock
from tests.cache.conftest import inputs_for
from tests.cache.wheelmaker import flip_byte, make_wheel


def test_put_then_get_returns_a_verified_copy(store: Store, wheel: Path) -> None:
    result = store.put(wheel, inputs_for(wheel), provenance={"builder": "test"})
    assert result.stored
    path = store.get(result.entry.key)
    assert path != wheel
    assert path.read_bytes() == wheel.read_bytes()
    assert path.name == wheel.name
    assert result.entry.key == str(CacheKey.of(inputs_for(wheel)))
    doc = json.loads((path.parent / "provenance.json").read_text())
    assert doc["key"] == result.entry.key
    assert doc["sha256"] == sha256_file(wheel)
    assert doc["details"] == {"builder": "test"}


def test_metadata_is_in_sqlite_in_wal_mode(store: Store, wheel: Path) -> None:
    store.put(wheel, inputs_for(wheel))
    with sqlite3.connect(store.db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT count(*) FROM artifacts").fetchone()[0] == 1


def test_second_put_of_the_same_inputs_keeps_one_entry(store: Store, wheel: Path) -> None:
    first = store.put(wheel, inputs_for(wheel))
    second = store.put(wheel, inputs_for(wheel))
    assert not second.stored
    assert second.entry.key == first.entry.key
    assert len(store.list()) == 1


def test_build_log_is_kept_with_the_artifact(store: Store, wheel: Path, tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    log.write_text("[1/73] nvcc ...\n")
    entry = store.put(wheel, inputs_for(wheel), log_path=log).entry
    assert entry.log_path is not None
    assert Path(entry.log_path).read_text() == "[1/73] nvcc ...\n"


def test_tampered_artifact_is_quarantined_and_never_returned(store: Store, wheel: Path) -> None:
    entry = store.put(wheel, inputs_for(wheel)).entry
    flip_byte(Path(entry.path))
    with pytest.raises(CacheError, match="corrupt") as info:
        store.get(entry.key)
    assert "sha256" in (info.value.cause or "")
    assert store.list() == []
    assert store.cached_artifacts() == []
    quarantined = list(store.quarantine_dir.iterdir())
    assert len(quarantined) == 1
    assert "sha256" in (quarantined[0] / "reason.txt").read_text()
    with pytest.raises(CacheError, match="no cache entry"):
        store.get(entry.key)


def test_missing_artifact_file_is_quarantined(store: Store, wheel: Path) -> None:
    entry = store.put(wheel, inputs_for(wheel)).entry
    Path(entry.path).unlink()
    with pytest.raises(CacheError, match="corrupt"):
        store.get(entry.key)
    assert store.list() == []


def test_put_over_a_corrupt_entry_replaces_it(store: Store, wheel: Path) -> None:
    entry = store.put(wheel, inputs_for(wheel)).entry
    flip_byte(Path(entry.path))
    again = store.put(wheel, inputs_for(wheel))
    assert again.stored
    assert store.get(entry.key).read_bytes() == wheel.read_bytes()
    assert len(list(store.quarantine_dir.iterdir())) == 1


def test_expected_hash_mismatch_stores_nothing(store: Store, wheel: Path) -> None:
    with pytest.raises(CacheError, match="published sha256"):
        store.put(wheel, inputs_for(wheel), expected_sha256="0" * 64)
    assert store.list() == []
    assert [p.name for p in store.artifacts_dir.iterdir()] == []


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        pytest.param({"name": "other-package"}, "cache key says other-package", id="name"),
        pytest.param({"version": "9.9"}, "version", id="version"),
    ],
)
def test_wheel_must_match_its_inputs(store: Store, wheel: Path, changes: dict[str, str], match: str) -> None:
    with pytest.raises(UsageError, match=match):
        store.put(wheel, inputs_for(wheel, **changes))


def test_static_library_is_stored_by_its_kind(store: Store, tmp_path: Path) -> None:
    lib = tmp_path / "libflashattention.a"
    lib.write_bytes(b"!<arch>\n" + bytes(range(256)) * 8)
    inputs = CacheKeyInputs(
        name="candle-flash-attn", version="0.9.1", kind=ArtifactKind.STATIC_LIB, source_sha256="12" * 32,
        archs=((9, 0),), cuda_version="13.0", python_tag="none", platform_tag="linux_x86_64",
        toolchain=(("nvcc", "13.0"), ("gcc", "12.2.0")),
    )
    entry = store.put(lib, inputs).entry
    assert store.get(entry.key).read_bytes() == lib.read_bytes()
    assert entry.kind is ArtifactKind.STATIC_LIB
    assert store.cached_artifacts() == []  # not a wheel: invisible to the resolver


def test_cached_artifacts_describe_wheels_for_the_resolver(store: Store, wheel: Path) -> None:
    entry = store.put(wheel, inputs_for(wheel, archs=((9, 0), (8, 0)), cuda_version="13.0")).entry
    [art] = store.cached_artifacts()
    assert art.key == entry.key
    assert art.filename == wheel.name
    assert art.name == "af-pure-fixture"
    assert art.version == "0.1.0"
    assert art.archs == ((8, 0), (9, 0))
    assert art.cuda_version == "13.0"
    assert art.sha256 == sha256_file(wheel)


def test_show_and_remove_accept_a_unique_prefix(store: Store, tmp_path: Path) -> None:
    a = make_wheel(tmp_path / "a", version="1.0")
    b = make_wheel(tmp_path / "b", version="2.0")
    ka = store.put(a, inputs_for(a)).entry.key
    kb = store.put(b, inputs_for(b)).entry.key
    assert store.show(ka[:14]).key == ka
    removed = store.remove(kb.removeprefix("sha256:")[:10])
    assert removed.key == kb
    assert not Path(removed.path).exists()
    assert [e.key for e in store.list()] == [ka]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        pytest.param("xyz", UsageError, id="not-hex"),
        pytest.param("ab", UsageError, id="too-short"),
        pytest.param("sha256:" + "f" * 64, CacheError, id="unknown-full-key"),
        pytest.param("ffff", CacheError, id="unknown-prefix"),
    ],
)
def test_bad_or_unknown_keys_give_clear_errors(store: Store, text: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        store.show(text)


def test_prune_by_age_removes_entries_unused_since(store: Store, clock: FakeClock, tmp_path: Path) -> None:
    old = make_wheel(tmp_path / "old", version="1.0")
    new = make_wheel(tmp_path / "new", version="2.0")
    old_key = store.put(old, inputs_for(old)).entry.key
    clock.now += 40 * 86400
    new_key = store.put(new, inputs_for(new)).entry.key
    result = prune(store, older_than_s=30 * 86400)
    assert [e.key for e in result.removed] == [old_key]
    assert [e.key for e in store.list()] == [new_key]
    assert result.freed_bytes == old.stat().st_size


def test_prune_by_size_removes_least_recently_used_first(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    wheels = [make_wheel(tmp_path / str(i), version=f"{i}.0", padding_bytes=4000) for i in range(3)]
    keys = []
    for w in wheels:
        keys.append(store.put(w, inputs_for(w)).entry.key)
        clock.now += 10
    store.get(keys[0])  # the oldest is used again, so the second is now least recently used
    budget = sum(w.stat().st_size for w in wheels) - 1
    result = prune(store, max_size_bytes=budget)
    assert [e.key for e in result.removed] == [keys[1]]
    assert result.kept_bytes <= budget


def test_prune_clears_debris_of_dead_writers(store: Store, wheel: Path) -> None:
    store.put(wheel, inputs_for(wheel))
    (store.artifacts_dir / ".staging-deadbeef-1234").mkdir()
    (store.artifacts_dir / ("e" * 64)).mkdir()  # renamed into place, but its writer died before the commit
    result = prune(store)
    assert sorted(result.debris_removed) == sorted([".staging-deadbeef-1234", "e" * 64])
    assert len(store.list()) == 1


def test_directory_without_a_row_is_not_an_entry(store: Store, wheel: Path) -> None:
    key = CacheKey.of(inputs_for(wheel))
    orphan = store.artifacts_dir / key.digest
    orphan.mkdir(parents=True)
    (orphan / wheel.name).write_bytes(wheel.read_bytes())
    with pytest.raises(CacheError, match="no cache entry"):
        store.get(key)
    assert store.put(wheel, inputs_for(wheel)).stored


def _full_disk_after(limit_bytes: int):  # type: ignore[no-untyped-def]
    def copy(src: Path, dst: Path) -> str:
        if src.stat().st_size > limit_bytes:
            with dst.open("wb") as f:
                f.write(src.read_bytes()[:limit_bytes])
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return copy_hashed(src, dst)

    return copy


def test_disk_full_fails_cleanly_through_the_copy_seam(tmp_path: Path, clock: FakeClock) -> None:
    big = make_wheel(tmp_path / "big", padding_bytes=50_000)
    store = Store(tmp_path / "home", clock=clock, copy_file=_full_disk_after(10_000))
    with pytest.raises(CacheError, match="not enough disk space") as info:
        store.put(big, inputs_for(big))
    assert "prune" in (info.value.hint or "")
    assert store.list() == []
    assert list(store.artifacts_dir.iterdir()) == []
    small = make_wheel(tmp_path / "small")
    assert store.put(small, inputs_for(small)).stored  # the store still works
