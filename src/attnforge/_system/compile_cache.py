"""Where JIT-compiled kernels persist between processes: FlashAttention-4's CuTe DSL cache and Inductor's
(FlexAttention), both under ``$ATTNFORGE_HOME/compile/`` unless the user pointed them elsewhere.

Without it every process compiles again: FA4's on-disk cache is off by default (``FLASH_ATTENTION_CUTE_DSL_
CACHE_ENABLED`` defaults to ``"0"``, ``flash_attn/cute/cache_utils.py``), and Inductor's default folder is in the
system temp dir, which a container or a reboot empties (docs/research/levers-2026-11-26.md section 2;
issue 30: a 50-call workload of new classes did not finish in 300 s, each paying FA4's JIT and Flex's compile).

FA4 reads its two variables when ``flash_attn.cute`` is imported, Inductor reads its own at each compile
(``torch/_inductor/runtime/cache_dir_utils.py``), so :func:`ensure` runs before attnforge imports a backend's
module (:mod:`attnforge.backends._base`) or compiles FlexAttention (:mod:`attnforge.backends.flex`): in the
runtime, the verify child and the bench child alike. A variable the user set wins (and so does Inductor's own
default once an earlier ``torch.compile`` of this process wrote it back into the environment); a home that cannot
be written leaves the defaults (a shared read-only home must not make attention fail).

:func:`count_artifacts` counts the compiled files in the folders: a second process that compiles nothing leaves
the count unchanged (issue 30's "0 compiles, counted, not assumed").
"""

from __future__ import annotations

import contextlib
import getpass
import os
import sys
import tempfile
import threading
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from attnforge._compat import StrEnum
from attnforge._system.paths import home_dir

FA4_ENABLED = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
FA4_DIR = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
INDUCTOR_DIR = "TORCHINDUCTOR_CACHE_DIR"
#: the folders under ``$ATTNFORGE_HOME`` per variable
FOLDERS = {FA4_DIR: Path("compile", "flash-attn-cute"), INDUCTOR_DIR: Path("compile", "inductor")}


class Source(StrEnum):
    """Who chose a variable's value."""

    ATTNFORGE = "attnforge"  # set by :func:`ensure` to a folder under $ATTNFORGE_HOME
    USER = "user"  # set before attnforge looked (by the user, or by an earlier torch.compile of this process)
    DEFAULT = "default"  # unset: the home was not writable, the library's own default applies


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheSetting:
    """One variable as :func:`ensure` left it.

    Attributes:
        variable: the environment variable.
        value: its value (None: unset).
        source: who chose it.
    """

    variable: str
    value: str | None
    source: Source


@dataclass(frozen=True, slots=True, kw_only=True)
class CompileCaches:
    """The compile caches of this process (:func:`ensure`).

    Attributes:
        settings: the three variables.
        note: why attnforge left a variable alone ("" when it set them all).
    """

    settings: tuple[CacheSetting, ...]
    note: str = ""

    @property
    def folders(self) -> tuple[Path, ...]:
        """The cache folders in use (set or chosen by the user; not the libraries' defaults)."""
        return tuple(Path(s.value) for s in self.settings if s.variable != FA4_ENABLED and s.value)

    def lines(self) -> list[str]:
        """One line per variable, for ``explain``/``doctor``/``warmup``."""
        return [f"{s.variable}={s.value if s.value is not None else '(unset)'} ({s.source.value})"
                for s in self.settings]


_LOCK = threading.Lock()
#: what ensure() wrote, per variable: a value still equal to it is ours, and follows a new ATTNFORGE_HOME
_OURS: dict[str, str] = {}


def ensure(environ: MutableMapping[str, str] | None = None) -> CompileCaches:
    """Point the compile caches into ``$ATTNFORGE_HOME/compile/`` unless the user already set them.

    Idempotent and cheap after the first call; never raises.

    Args:
        environ: the environment to read and write (``os.environ`` when None; tests pass a dict).

    Returns:
        The settings and, when a variable was left alone, why.
    """
    env: MutableMapping[str, str] = os.environ if environ is None else environ
    with _LOCK:
        notes: list[str] = []
        try:
            home = home_dir(env)
        except Exception as exc:  # platformdirs missing or broken: leave the defaults
            home, reason = None, f"no attnforge home ({type(exc).__name__})"
            notes.append(reason)
        settings = []
        for variable, folder in FOLDERS.items():
            current = env.get(variable)
            if current is not None and _OURS.get(variable) != current:
                settings.append(CacheSetting(variable=variable, value=current, source=Source.USER))
                continue
            target = home / folder if home is not None else None
            if target is None or not _writable(target):
                if current is not None:  # ours from an earlier home; that home is not ours to keep using
                    del env[variable]
                    _OURS.pop(variable, None)
                if target is not None:
                    notes.append(f"{target} is not writable: {variable} left at the library's default")
                settings.append(CacheSetting(variable=variable, value=None, source=Source.DEFAULT))
                continue
            env[variable] = _OURS[variable] = str(target)
            settings.append(CacheSetting(variable=variable, value=str(target), source=Source.ATTNFORGE))
        enabled = env.get(FA4_ENABLED)
        fa4_dir = next(s for s in settings if s.variable == FA4_DIR)
        if enabled is not None and _OURS.get(FA4_ENABLED) != enabled:
            settings.insert(0, CacheSetting(variable=FA4_ENABLED, value=enabled, source=Source.USER))
        elif fa4_dir.value is None:
            if enabled is not None:  # ours from an earlier home: FA4's cache would stay on in its own default folder
                del env[FA4_ENABLED]
                _OURS.pop(FA4_ENABLED, None)
            settings.insert(0, CacheSetting(variable=FA4_ENABLED, value=None, source=Source.DEFAULT))
        else:
            env[FA4_ENABLED] = _OURS[FA4_ENABLED] = "1"
            settings.insert(0, CacheSetting(variable=FA4_ENABLED, value="1", source=Source.ATTNFORGE))
        return CompileCaches(settings=tuple(settings), note="; ".join(notes))


def recreate_folder(exc: BaseException, environ: Mapping[str, str] | None = None) -> bool:
    """Make again the folder of a compile cache file that ``exc`` (a :class:`FileNotFoundError`) did not find, when
    that folder is inside a compile cache and is missing; True when it made it (the caller may try once more), False
    for anything else. Never raises.

    Why: FlashAttention-4 makes its cache's folders once, when ``flash_attn.cute`` is imported
    (``JITPersistentCache.__init__``, flash_attn/cute/cache_utils.py, 4.0.0b36), and opens a lock file in them at each
    compile lookup; once the folder was removed while the process ran (a cleaned cache, a removed home), every later
    lookup raised FileNotFoundError until the process restarted (H200, 2026-12-01: the GPU suite's FA4 capture test,
    after pytest removed the home of the test that first imported FA4). The folders asked: the two variables' (as set
    now), and FA4's own as it read it at import (``CUTE_DSL_CACHE_DIR``, else its default under the temp dir)."""
    try:
        if not isinstance(exc, FileNotFoundError) or not exc.filename:
            return False
        env = os.environ if environ is None else environ
        path = Path(os.fsdecode(exc.filename)).absolute()
        roots = [Path(v).absolute() for v in (env.get(FA4_DIR), env.get(INDUCTOR_DIR)) if v]
        fa4 = sys.modules.get("flash_attn.cute.cache_utils")
        if fa4 is not None:
            own = getattr(fa4, "CUTE_DSL_CACHE_DIR", None)
            roots.append(Path(own).absolute() if own else
                         Path(tempfile.gettempdir(), getpass.getuser(), "flash_attention_cute_dsl_cache"))
        folder = path.parent
        if folder.is_dir() or not any(folder.is_relative_to(root) for root in roots):
            return False
        folder.mkdir(parents=True, exist_ok=True)
        return True
    except Exception:  # an odd filename, an unwritable folder, no user name: nothing made, the caller's error stands
        return False


#: the module whose functions carry FA4's compile caches (``_flash_attn_fwd.compile_cache`` ...)
FA4_INTERFACE = "flash_attn.cute.interface"
_KEPT = "_attnforge_keeps_folder"


def keep_fa4_folders() -> int:
    """Make every persistent compile cache of an imported FlashAttention-4 make its folder again, when missing, before
    it opens a lock file there; returns how many caches it changed this call. Idempotent; never raises; does nothing
    when ``flash_attn.cute.interface`` is not imported or FA4's cache is in memory only.

    Why: FA4 makes each cache's folder once, when its module is imported (``JITPersistentCache.__init__``), and opens
    ``<folder>/<key hash>.lock`` at every lookup that misses its in-memory cache (``_try_load_from_storage``,
    ``_try_export_to_storage`` through ``_lock_path``: flash_attn/cute/cache_utils.py, flash-attn-4 4.0.0b36, lines
    173-290). A folder removed while the process ran (a cleaned cache, a removed home) made every such lookup raise
    FileNotFoundError until the process restarted, on every path that calls FA4: the dispatcher's route, the padded
    decode lane, the first-use measurement, FA4's public function (H200, 2026-12-01: 14 of the GPU suite's FA4 tests
    after pytest removed the home of the test that first imported FA4). Wrapping each instance's ``_lock_path`` costs
    one ``mkdir`` per lookup that reaches the disk (it then loads or compiles a kernel: milliseconds to seconds), none
    on a call FA4 finds in memory. A version without these attributes is left as it is (duck-typed)."""
    module = sys.modules.get(FA4_INTERFACE)
    if module is None:
        return 0
    changed = 0
    try:
        for value in list(vars(module).values()):
            cache = getattr(value, "compile_cache", None)
            folder = getattr(cache, "cache_path", None)
            lock_path = getattr(cache, "_lock_path", None)
            if not isinstance(folder, Path) or not callable(lock_path) or getattr(cache, _KEPT, False):
                continue

            def keeping(key_hash: str, _folder: Path = folder, _lock_path: object = lock_path) -> object:
                with contextlib.suppress(OSError):  # not writable now: FA4's own open then says why, as before
                    _folder.mkdir(parents=True, exist_ok=True)
                return _lock_path(key_hash)  # type: ignore[operator]

            cache._lock_path = keeping  # type: ignore[union-attr]
            setattr(cache, _KEPT, True)
            changed += 1
    except Exception:  # another FA4's internals: its caches stay as they are
        return changed
    return changed


def count_artifacts(folders: tuple[Path, ...] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """The number of files in the compile cache folders (``folders``, else the ones the environment names):
    compiling a kernel adds some, loading one from the cache adds none. A missing folder counts 0."""
    env = os.environ if environ is None else environ
    if folders is None:
        folders = tuple(Path(v) for v in (env.get(FA4_DIR), env.get(INDUCTOR_DIR)) if v)
    total = 0
    for folder in folders:
        for _root, _dirs, files in os.walk(folder):
            total += sum(1 for f in files if not f.endswith(".lock"))
    return total


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK | os.X_OK)
