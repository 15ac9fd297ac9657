"""Which files do flash-attn (FlashAttention-2) and flash-attn-4 both install, and whose content is on disk
now?

Both wheels ship ``flash_attn/cute/*`` (FA2's sdist carries an older copy of the CuTe sources). pip does not
check file ownership: whichever package is installed last overwrites the shared files, and uninstalling one
deletes files the other still lists. Prints one JSON document: per shared path, whether the bytes on disk
match
flash-attn's RECORD hash, flash-attn-4's, or neither. Stdlib only; run with the venv's python.
"""

from __future__ import annotations

import base64
import hashlib
import json
from importlib import metadata


def record(dist_name: str) -> dict[str, tuple[str, object]]:
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        return {}
    out = {}
    for f in dist.files or []:
        if f.hash is not None and str(f).startswith("flash_attn/"):
            out[str(f)] = (f.hash.value, f)
    return out


def on_disk_hash(f: object) -> str | None:
    try:
        data = f.locate().read_bytes()  # type: ignore[attr-defined]
    except OSError:
        return None
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def main() -> int:
    fa2, fa4 = record("flash-attn"), record("flash-attn-4")
    shared = sorted(set(fa2) & set(fa4))
    rows = {}
    for path in shared:
        disk = on_disk_hash(fa4[path][1])
        owner = (
            "missing"
            if disk is None
            else "flash-attn-4"
            if disk == fa4[path][0]
            else "flash-attn"
            if disk == fa2[path][0]
            else "neither"
        )
        rows[path] = owner
    summary: dict[str, int] = {}
    for owner in rows.values():
        summary[owner] = summary.get(owner, 0) + 1
    print(
        json.dumps(
            {
                "flash_attn_files": len(fa2),
                "flash_attn_4_files": len(fa4),
                "shared": len(shared),
                "content_on_disk_matches": summary,
                "paths": rows,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
