"""What is written next to every artifact: ``provenance.json`` (carried by exports) and the name checks."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from typing import Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from attnforge import __version__
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
    if version.public != Version(inputs.version).public:
        raise UsageError(f"wheel {filename} is version {version}, but the cache key says {inputs.version}")
