"""What is written next to every artifact: ``provenance.json`` (carried by exports) and the name checks."""

from __future__ import annotations

import datetime as _dt
import os
import stat
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from attnforge import __version__, _serde
from attnforge._system.files import open_nofollow
from attnforge.cache.key import CacheKey, CacheKeyInputs
from attnforge.errors import UsageError

PROVENANCE = "provenance.json"
BUILD_LOG = "build.log"
#: Version of provenance.json; readers refuse other versions.
PROVENANCE_SCHEMA = 1


def provenance_doc(
    *, key: CacheKey, inputs: CacheKeyInputs, filename: str, sha256: str, size_bytes: int,
    created_at_s: float, has_log: bool, extra: Mapping[str, Any],
) -> dict[str, Any]:
    """The ``provenance.json`` kept next to every artifact (and carried by exports)."""
    return {
        "schema": PROVENANCE_SCHEMA,
        "key": str(key),
        "inputs": inputs.to_json(),
        "filename": filename,
        "sha256": sha256,
        "size_bytes": size_bytes,
        "created_at": _dt.datetime.fromtimestamp(created_at_s, tz=_dt.timezone.utc).isoformat(),
        "log": BUILD_LOG if has_log else None,
        "stored_by": f"attnforge {__version__}",
        "details": dict(extra),
    }


def check_wheel_name(filename: str, inputs: CacheKeyInputs) -> None:
    try:
        name, version, _, _ = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        raise UsageError(f"not a wheel file name: {filename}", cause=str(exc)) from None
    if canonicalize_name(name) != inputs.name:
        raise UsageError(f"wheel {filename} is {name}, but the cache key says {inputs.name}")
    try:
        recorded = Version(inputs.version)
    except InvalidVersion:  # a hand-edited provenance.json: its entry is refused, not the whole repair or import
        raise UsageError(f"the cache key's version {inputs.version!r} is not a version (PEP 440)") from None
    if version.public != recorded.public:
        raise UsageError(f"wheel {filename} is version {version}, but the cache key says {inputs.version}")


#: Size limits of what ``cache import`` accepts (bigger files are rejected and named in quarantine, never
#: copied). A wheel: torch's own CUDA wheels are ~2.5 GiB and the largest attention-kernel wheels ~0.5 GiB,
#: so 4 GiB leaves room and still refuses a multi-GiB sparse file. provenance.json: ours are ~1-2 KiB; a
#: 300 MB one once made every later `cache list` use 1.5 GB of memory, so 1 MiB is plenty. build.log: a
#: verbose FlashAttention build writes tens of MB; 256 MiB keeps every real log.
MAX_WHEEL_BYTES = 4 << 30
MAX_PROVENANCE_BYTES = 1 << 20
MAX_LOG_BYTES = 256 << 20


def read_provenance(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(doc, None)`` for a sound ``folder/provenance.json``, else ``(None, why)``.

    Never follows a symlink and never reads more than :data:`MAX_PROVENANCE_BYTES`.
    """
    path = folder / PROVENANCE
    problem = regular_file_problem(path, MAX_PROVENANCE_BYTES)
    if problem is not None:
        return None, problem
    try:
        with open_nofollow(path) as f:
            data = f.read(MAX_PROVENANCE_BYTES + 1)
        doc = _serde.loads(data)
    except (OSError, ValueError) as exc:
        return None, f"{PROVENANCE} is unreadable ({exc})"
    if not isinstance(doc, dict) or doc.get("schema") != PROVENANCE_SCHEMA:
        return None, f"{PROVENANCE} is not an attnforge provenance of schema {PROVENANCE_SCHEMA}"
    return doc, None


def regular_file_problem(path: Path, limit_bytes: int) -> str | None:
    """Why ``path`` is not a regular file (checked with ``lstat``, so a symlink is named as one) of at most
    ``limit_bytes``; None when it is."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path.name} is missing"
    except OSError as exc:
        return f"{path.name} cannot be read ({exc.strerror or exc})"
    except ValueError:  # a NUL in a name read from a provenance.json: no file can have it
        return f"{path.name!r} is not a file name (it holds a NUL byte)"
    if stat.S_ISLNK(st.st_mode):
        return f"{path.name} is a symlink (to {os.readlink(path)!r}); symlinks are never followed"
    if not stat.S_ISREG(st.st_mode):
        return f"{path.name} is not a regular file"
    if st.st_size > limit_bytes:
        return f"{path.name} is {st.st_size} bytes, over the limit of {limit_bytes}"
    return None


def provenance_problem(folder: Path, *, key: str, sha256: str, filename: str, inputs: Mapping[str, Any]) -> str | None:
    """Why ``folder/provenance.json`` does not describe this entry (missing, unreadable, disagreeing), or None."""
    doc, problem = read_provenance(folder)
    if doc is None:
        return problem
    for name, want in (("key", key), ("sha256", sha256), ("filename", filename), ("inputs", dict(inputs))):
        if doc.get(name) != want:
            return f"{PROVENANCE} disagrees with the database on {name}"
    return None


def unsafe_member(wheel: Path) -> str | None:
    """The first member of ``wheel`` whose name could write outside the install dir (``../``, absolute,
    a drive or backslashes), or why it is not a zip; None when every member is safe."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
    except (OSError, zipfile.BadZipFile) as exc:
        return f"{wheel.name} is not a readable zip ({exc})"
    for name in names:
        parts = name.replace("\\", "/").split("/")
        if name.startswith(("/", "\\")) or "\\" in name or ".." in parts or (":" in parts[0]):
            return f"{wheel.name} has a member named {name!r}, which would be written outside its install dir"
    return None
