"""Undo what an interrupted compile left behind: empty artifacts in the Inductor and Triton caches.

A ``verify`` killed while ``torch.compile`` (FlexAttention) was compiling left a 0-byte ``.so`` in Inductor's
cache; every later compile of that graph loaded it and failed, so FlexAttention stayed "failed" on that machine
until the file was deleted by hand (issue 31, item 5: 2 of 8 interrupted runs). Verify therefore, when a case
raises, looks for such files in the caches the compile uses, removes them and runs the case once more
(:func:`attnforge.verify.check.verify_backend`).

The cache locations are read, not chosen: ``TORCHINDUCTOR_CACHE_DIR`` (whoever set it: the user, or attnforge's
runtime), else torch's default (``torch/_inductor/runtime/cache_dir_utils.py``, ``default_cache_dir``:
``$TMPDIR/torchinductor_$USER``); ``TRITON_CACHE_DIR``, else Triton's ``~/.triton/cache``
(``triton/runtime/cache.py``, ``default_cache_dir``). They are looked up only once a case failed
(:class:`CompileCaches`): torch's helper lives in ``torch._inductor``, whose import loads TorchDynamo (about 1.2 s on
a 2-core machine), and a verify where every case passes never needs the folders.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

#: Files a compile writes whole and a later compile loads as they are: empty means a writer was killed.
#: (``.lock`` files are empty by design and are never touched.)
ARTIFACT_SUFFIXES = frozenset({".so", ".py", ".cubin", ".ptx", ".pyd", ".dll", ".hsaco", ".json"})
#: Folders of Inductor's cache whose entries (no suffix) are pickled graphs: empty is never valid there.
ENTRY_DIRS = frozenset({"fxgraph", "aotautograd"})
#: An empty file younger than this may be one a compile in another process is writing right now: left alone.
MIN_AGE_S = 60.0
#: The most files one scan looks at (a shared cache can be large; the scan runs only after a failed case).
MAX_SCANNED = 200_000


def compile_cache_dirs(environ: Mapping[str, str]) -> tuple[Path, ...]:
    """The Inductor and Triton cache folders a compile in a process with ``environ`` uses (existing or not).

    Asked only once a case failed (:class:`CompileCaches`): torch's default comes from its own helper, whose
    import loads TorchDynamo (about 1.2 s on a 2-core machine)."""
    inductor = environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not inductor:
        try:
            from torch._inductor.runtime.cache_dir_utils import default_cache_dir

            inductor = default_cache_dir()
        except Exception:  # torch missing or moved the helper: its documented default
            import getpass
            import tempfile

            inductor = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    triton = environ.get("TRITON_CACHE_DIR") or str(Path.home() / ".triton" / "cache")
    return tuple(dict.fromkeys(Path(p).absolute() for p in (inductor, triton)))


@dataclass(frozen=True)  # no slots: frozen slotted dataclasses do not unpickle on Python 3.10
class CompileCaches:
    """The cache folders of :func:`compile_cache_dirs` for ``environ``, looked up when first called: verify asks
    only after a case raised, so a passing verify never imports ``torch._inductor``. Picklable (a verify child
    gets it in its job)."""

    environ: Mapping[str, str]

    def __call__(self) -> tuple[Path, ...]:
        return compile_cache_dirs(self.environ)


def empty_artifacts(roots: Iterable[Path], *, now_s: float | None = None,
                    min_age_s: float = MIN_AGE_S) -> list[Path]:
    """Every empty compiled artifact under ``roots`` older than ``min_age_s`` (by its mtime, against
    ``now_s``, default the clock), sorted. Unreadable folders are skipped; never raises."""
    now = time.time() if now_s is None else now_s
    found: list[Path] = []
    scanned = 0
    for root in roots:
        for folder, dirs, names in os.walk(root, onerror=lambda _err: None):
            dirs[:] = [d for d in dirs if d != "locks"]
            entry_dir = any(part in ENTRY_DIRS for part in Path(folder).relative_to(root).parts)
            for name in names:
                scanned += 1
                if scanned > MAX_SCANNED:
                    return sorted(found)
                path = Path(folder) / name
                if name.endswith(".lock") or not (entry_dir or path.suffix in ARTIFACT_SUFFIXES):
                    continue
                try:
                    st = path.lstat()
                except OSError:
                    continue
                if st.st_size == 0 and os.path.isfile(path) and now - st.st_mtime >= min_age_s:
                    found.append(path)
    return sorted(found)


def remove_empty_artifacts(roots: Iterable[Path], *, now_s: float | None = None,
                           min_age_s: float = MIN_AGE_S) -> list[Path]:
    """Remove :func:`empty_artifacts` under ``roots``; the paths actually removed (never raises)."""
    removed = []
    for path in empty_artifacts(roots, now_s=now_s, min_age_s=min_age_s):
        try:
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed
