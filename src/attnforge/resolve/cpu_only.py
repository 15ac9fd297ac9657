"""Is a local source a C++-only torch extension (``CppExtension``, no CUDA sources)?

Such a source builds with a host C++ compiler against any torch, a CPU-only one included: the CUDA questions
of the preflight (torch's CUDA, nvcc, archs) do not apply to it. Only a local directory or sdist can be read
before the build; a git URL or a download is assumed to need CUDA.
"""

from __future__ import annotations

import re
import tarfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

from attnforge.resolve.types import SourceKind, SourceSpec

_CUDA_FILE = re.compile(r"\.(?:cu|cuh)$", re.IGNORECASE)
_CPP_FILE = re.compile(r"\.(?:cpp|cc|cxx|c)$", re.IGNORECASE)
_BUILD_FILES = ("setup.py", "pyproject.toml", "CMakeLists.txt")
_CUDA_WORDS = re.compile(r"\bCUDAExtension\b|\bCUDA_HOME\b|\bnvcc\b|enable_language\s*\(\s*CUDA|LANGUAGES[^)]*CUDA")
_SKIP_DIRS = {".git", "build", "dist", "__pycache__", ".venv", "node_modules"}
_MAX_FILES = 50_000


def cpu_only_source(source: SourceSpec | None, *, os: str) -> str | None:
    """Why ``source`` is a C++-only extension (the preflight's note), or None when it may need CUDA.

    ``os`` is the snapshot's (``linux``, ``windows``): on Windows every source takes the CUDA checks (MSVC and the
    toolkit are found together there).
    """
    if os == "windows" or source is None or source.kind is not SourceKind.PATH:
        return None
    root = Path(source.location)
    if source.subdirectory and root.is_dir():
        root = root / source.subdirectory
    if root.is_dir():
        names = list(_walk(root))
        texts = [_read(root / n) for n in _BUILD_FILES if (root / n).is_file()]
    elif root.is_file():
        names, texts = _archive(root)
    else:
        return None
    if any(_CUDA_FILE.search(n) for n in names) or any(_CUDA_WORDS.search(t) for t in texts):
        return None
    if not any(_CPP_FILE.search(n) for n in names):
        return None
    return (f"{root.name} has C++ sources and no CUDA ones (.cu/.cuh, CUDAExtension): a C++-only extension, "
            "built with the host compiler against any torch; the CUDA checks do not apply")


def _walk(root: Path) -> Iterable[str]:
    count = 0
    stack = [root]
    while stack and count < _MAX_FILES:
        for entry in stack.pop().iterdir():
            count += 1
            if entry.is_dir() and not entry.is_symlink():
                if entry.name not in _SKIP_DIRS and not entry.name.endswith(".egg-info"):
                    stack.append(entry)
            else:
                yield entry.name


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[:1_000_000]
    except OSError:
        return ""


def _archive(path: Path) -> tuple[list[str], list[str]]:
    """Member names and build-file texts of an sdist (``.tar.gz`` or ``.zip``); empty when unreadable."""
    names: list[str] = []
    texts: list[str] = []
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()[:_MAX_FILES]
                for n in names:
                    if n.count("/") == 1 and n.rsplit("/", 1)[-1] in _BUILD_FILES:
                        texts.append(zf.read(n)[:1_000_000].decode("utf-8", "replace"))
        elif tarfile.is_tarfile(path):
            with tarfile.open(path) as tf:
                for member in tf:
                    names.append(member.name)
                    if member.isfile() and member.name.count("/") == 1 and \
                            member.name.rsplit("/", 1)[-1] in _BUILD_FILES:
                        f = tf.extractfile(member)
                        texts.append(f.read(1_000_000).decode("utf-8", "replace") if f else "")
                    if len(names) >= _MAX_FILES:
                        break
    except (OSError, zipfile.BadZipFile, tarfile.TarError):
        return [], []
    return names, texts
