#!/usr/bin/env python3
"""Stage one carried batch into the device's wheelhouse, joining split files once all their parts are there.

Usage: ``python3 scripts/gpu/stage.py BATCH_DIR WHEELHOUSE`` (called by ``00-stage.sh``). Reads
``BATCH_DIR/MANIFEST.txt`` (written by ``make_wheelhouse.py``), copies the batch's whole files and parts after
checking each sha256, joins every split file whose parts have all arrived (``cat NAME.part* > NAME``, checked
against the joined file's sha256), and prints what the wheelhouse still lacks. Stdlib only. Exit 0 when this
batch staged cleanly (even if other batches are still to come), 1 on a missing or corrupt file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_manifest(path: Path) -> list[dict[str, str]]:
    keys = ("kind", "name", "size_bytes", "sha256", "batch", "of")
    rows = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            rows.append(dict(zip(keys, line.split("\t"), strict=True)))
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__)
        return 2
    batch_dir, wheelhouse = Path(argv[1]), Path(argv[2])
    manifest = batch_dir / "MANIFEST.txt"
    if not manifest.exists():
        print(
            f"error: {manifest} is missing: was the batch carried? (run's carry=['carry/{batch_dir.name}'])"
        )
        return 1
    rows = read_manifest(manifest)
    batch = batch_dir.name
    parts_dir = wheelhouse / ".parts"
    parts_dir.mkdir(parents=True, exist_ok=True)
    bad = 0

    for row in rows:
        if row["batch"] != batch or row["kind"] not in ("file", "part"):
            continue
        src = batch_dir / row["name"]
        dst = (wheelhouse if row["kind"] == "file" else parts_dir) / row["name"]
        if dst.exists() and dst.stat().st_size == int(row["size_bytes"]) and sha256_of(dst) == row["sha256"]:
            print(f"already staged  {row['name']}")
            continue
        if not src.exists():
            print(f"MISSING         {src}")
            bad += 1
            continue
        got = sha256_of(src)
        if got != row["sha256"]:
            print(f"CORRUPT         {src}: sha256 {got} != {row['sha256']}")
            bad += 1
            continue
        tmp = dst.with_name(dst.name + ".tmp")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
        print(f"staged          {row['name']} ({int(row['size_bytes']):,} bytes)")

    missing = []
    for row in rows:
        if row["kind"] == "file" and not (wheelhouse / row["name"]).exists():
            missing.append(f"{row['name']} (batch {row['batch']})")
        if row["kind"] != "split":
            continue
        target = wheelhouse / row["name"]
        if target.exists() and sha256_of(target) == row["sha256"]:
            continue
        parts = sorted(
            (r for r in rows if r["kind"] == "part" and r["of"] == row["name"]), key=lambda r: r["name"]
        )
        absent = [p for p in parts if not (parts_dir / p["name"]).exists()]
        if absent:
            missing.append(
                f"{row['name']} (waits for parts in {', '.join(sorted({p['batch'] for p in absent}))})"
            )
            continue
        tmp = target.with_name(target.name + ".tmp")
        with tmp.open("wb") as out:
            for p in parts:
                with (parts_dir / p["name"]).open("rb") as f:
                    shutil.copyfileobj(f, out, 1 << 20)
        got = sha256_of(tmp)
        if got != row["sha256"]:
            tmp.unlink()
            print(f"CORRUPT JOIN    {row['name']}: sha256 {got} != {row['sha256']}")
            bad += 1
            continue
        os.replace(tmp, target)
        for p in parts:
            (parts_dir / p["name"]).unlink()
        print(f"joined          {row['name']} from {len(parts)} parts ({int(row['size_bytes']):,} bytes)")

    if not any(parts_dir.iterdir()):
        parts_dir.rmdir()
    complete = sum(1 for r in rows if r["kind"] in ("file", "split") and (wheelhouse / r["name"]).exists())
    total = sum(1 for r in rows if r["kind"] in ("file", "split"))
    print(f"wheelhouse {wheelhouse}: {complete}/{total} files complete")
    for m in missing:
        print(f"  still missing: {m}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
