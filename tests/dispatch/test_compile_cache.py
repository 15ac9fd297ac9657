"""The JIT compile caches persist under ``$ATTNFORGE_HOME/compile`` (issue 30): set before a backend module is
imported, the user's own settings win, a home that cannot be written leaves the defaults, and a second process
that compiles nothing it compiled before leaves the artifact count unchanged (real processes, real Inductor)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge._system import compile_cache as cc

ROOT = Path(__file__).resolve().parents[2]


def test_the_caches_go_under_the_home_and_fa4s_is_switched_on(tmp_path: Path) -> None:
    env = {"ATTNFORGE_HOME": str(tmp_path)}
    caches = cc.ensure(env)
    assert env[cc.FA4_ENABLED] == "1"
    assert env[cc.FA4_DIR] == str(tmp_path / "compile" / "flash-attn-cute")
    assert env[cc.INDUCTOR_DIR] == str(tmp_path / "compile" / "inductor")
    assert {s.source for s in caches.settings} == {cc.Source.ATTNFORGE} and caches.note == ""
    env["ATTNFORGE_HOME"] = str(tmp_path / "other")  # ours follow a new home (each test has its own)
    assert cc.ensure(env).folders[1] == tmp_path / "other" / "compile" / "inductor"


def test_the_users_settings_win(tmp_path: Path) -> None:
    env = {"ATTNFORGE_HOME": str(tmp_path), cc.INDUCTOR_DIR: "/mine", cc.FA4_ENABLED: "0"}
    caches = cc.ensure(env)
    assert (env[cc.INDUCTOR_DIR], env[cc.FA4_ENABLED]) == ("/mine", "0")
    by_var = {s.variable: s for s in caches.settings}
    assert by_var[cc.INDUCTOR_DIR].source is cc.Source.USER and by_var[cc.FA4_ENABLED].source is cc.Source.USER
    assert f"{cc.INDUCTOR_DIR}=/mine (user)" in caches.lines()


def test_a_home_that_cannot_hold_the_caches_leaves_the_defaults_and_does_not_fail(tmp_path: Path) -> None:
    """A shared read-only home: here ``compile`` is a file, so no folder can be made under it (as root too)."""
    home = tmp_path / "shared"
    home.mkdir()
    (home / "compile").write_text("not a folder", encoding="utf-8")
    env = {"ATTNFORGE_HOME": str(home)}
    caches = cc.ensure(env)
    assert cc.FA4_DIR not in env and cc.INDUCTOR_DIR not in env and cc.FA4_ENABLED not in env
    assert "not writable" in caches.note
    assert all(s.source is cc.Source.DEFAULT for s in caches.settings)



def test_a_home_that_can_no_longer_hold_the_caches_takes_back_all_of_ours(tmp_path: Path) -> None:
    """Our settings from an earlier home go, FA4's switch too: left on, FA4 would cache in its own default folder."""
    env = {"ATTNFORGE_HOME": str(tmp_path / "first")}
    cc.ensure(env)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "compile").write_text("not a folder", encoding="utf-8")
    env["ATTNFORGE_HOME"] = str(shared)
    cc.ensure(env)
    assert cc.FA4_DIR not in env and cc.INDUCTOR_DIR not in env and cc.FA4_ENABLED not in env


_CHILD = """
import json, torch
from attnforge._system import compile_cache
from attnforge.backends.flex import _default_compiler
caches = compile_cache.ensure()
before = compile_cache.count_artifacts(caches.folders)
fn = _default_compiler(lambda x: torch.sin(x) * 2 + 1)
fn(torch.ones(8))
print(json.dumps({"new": compile_cache.count_artifacts(caches.folders) - before, "dir": str(caches.folders[1])}))
"""


@pytest.mark.slow
def test_a_second_process_compiles_nothing_it_compiled_before(cli_env: dict[str, str]) -> None:
    env = {k: v for k, v in cli_env.items() if k not in (cc.INDUCTOR_DIR, cc.FA4_DIR, cc.FA4_ENABLED)}

    def child() -> dict[str, object]:
        done = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]

    first, second = child(), child()
    assert str(first["dir"]).startswith(env["ATTNFORGE_HOME"])
    assert isinstance(first["new"], int) and first["new"] > 0  # compiled, and the files landed under the home
    assert second["new"] == 0  # read back from the cache: nothing compiled again


def test_recreate_folder_makes_only_a_missing_compile_cache_folder_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FA4's folder as FA4 read it at import (its module's ``CUTE_DSL_CACHE_DIR``, which a later home no longer
    names in the environment) and the variables' folders are made again when a lookup misses them; an existing
    folder, a path outside every cache, or another error are left alone (False)."""
    import sys
    import types

    imported = tmp_path / "first-home" / "compile" / "flash-attn-cute"
    fa4 = types.ModuleType("flash_attn.cute.cache_utils")
    fa4.CUTE_DSL_CACHE_DIR = str(imported)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flash_attn.cute.cache_utils", fa4)
    env = {cc.INDUCTOR_DIR: str(tmp_path / "home" / "compile" / "inductor")}

    def miss(path: Path) -> FileNotFoundError:
        return FileNotFoundError(2, "No such file or directory", str(path))

    lock = imported / "fp" / "fwd" / "k.lock"
    assert cc.recreate_folder(miss(lock), env)
    assert lock.parent.is_dir()
    assert not cc.recreate_folder(miss(lock), env)  # there now: a second miss is the backend's own
    inductor = tmp_path / "home" / "compile" / "inductor" / "fx" / "ab.lock"
    assert cc.recreate_folder(miss(inductor), env)
    outside = tmp_path / "elsewhere" / "x.lock"
    assert not cc.recreate_folder(miss(outside), env)
    assert not outside.parent.exists()
    assert not cc.recreate_folder(PermissionError(13, "denied", str(lock)), env)
    assert not cc.recreate_folder(FileNotFoundError("no filename"), env)


class _Fa4Cache:
    """FA4 4.0.0b36's ``JITPersistentCache`` where it touches the disk (flash_attn/cute/cache_utils.py lines 173-290):
    the folder made once, in ``__init__``, and a lock file opened in it (``os.open`` with ``O_CREAT``) at every lookup
    that misses memory."""

    def __init__(self, cache_path: Path) -> None:
        cache_path.mkdir(parents=True, exist_ok=True)
        self.cache_path = cache_path

    def _lock_path(self, sha256_hex: str) -> Path:
        return self.cache_path / f"{sha256_hex}.lock"

    def lookup(self, sha256_hex: str) -> bool:
        fd = os.open(str(self._lock_path(sha256_hex)), os.O_RDONLY | os.O_CREAT)
        os.close(fd)
        return (self.cache_path / f"{sha256_hex}.o").exists()


def test_fa4_caches_make_a_removed_folder_again_on_every_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder removed while the process ran (a cleaned cache, a removed home): FA4's lookup raised
    FileNotFoundError from then on (H200, 2026-12-01); once attnforge imported FA4 through an adapter, every cache of
    the interface module makes its folder again first, whoever calls FA4. Wrapped once; a cache in memory only (no
    ``cache_path``) and a module that is no FA4 are left alone."""
    import shutil
    import sys
    import types

    from attnforge.backends._base import AdapterBase, Requirement

    interface = types.ModuleType(cc.FA4_INTERFACE)
    folder = tmp_path / "home" / "compile" / "flash-attn-cute" / "fp"

    def fwd() -> None: ...

    def bwd() -> None: ...

    def combine() -> None: ...

    fwd.compile_cache = _Fa4Cache(folder / "fwd")  # type: ignore[attr-defined]
    bwd.compile_cache = _Fa4Cache(folder / "bwd")  # type: ignore[attr-defined]
    combine.compile_cache = {}  # type: ignore[attr-defined]  # FA4's in-memory cache: no folder
    interface._flash_attn_fwd, interface._flash_attn_bwd, interface.combine = fwd, bwd, combine  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, cc.FA4_INTERFACE, interface)

    shutil.rmtree(tmp_path / "home")
    with pytest.raises(FileNotFoundError):  # FA4 as it is: the lookup fails until the process restarts
        fwd.compile_cache.lookup("ab")  # type: ignore[attr-defined]

    adapter = AdapterBase(name="flash-attn-4", caps=None, requirement=Requirement(  # type: ignore[arg-type]
        modules=(cc.FA4_INTERFACE,)))  # module() reads no capability
    assert adapter.module() is interface  # the adapter's import makes the caches keep their folders
    assert cc.keep_fa4_folders() == 0  # once: nothing left to change
    assert fwd.compile_cache.lookup("ab") is False  # type: ignore[attr-defined]  # a miss, not an error
    assert (folder / "fwd" / "ab.lock").exists()
    shutil.rmtree(tmp_path / "home")
    assert bwd.compile_cache.lookup("cd") is False  # type: ignore[attr-defined]  # removed again: made again
    assert fwd.compile_cache.lookup("ab") is False  # type: ignore[attr-defined]
    assert combine.compile_cache == {}  # type: ignore[attr-defined]


def test_keep_fa4_folders_without_fa4_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.delitem(sys.modules, cc.FA4_INTERFACE, raising=False)
    assert cc.keep_fa4_folders() == 0
