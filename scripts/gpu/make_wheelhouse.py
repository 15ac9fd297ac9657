#!/usr/bin/env python3
"""Build the offline wheelhouse for the lent GPU machine and pack it into carry batches.

Runs on the development machine (it needs PyPI), never on the GPU machine. It downloads the exact files pinned
in ``wheelhouse.lock`` (checking each sha256 against the pin), splits every file larger than ``--part-mib``
into
``NAME.partaa``, ``NAME.partab``, ... (the names ``split -b`` gives; ``cat NAME.part* > NAME`` joins them),
packs
whole files and parts into folders ``carry/b1``, ``carry/b2``, ... of at most ``--batch-bytes`` each (one
folder
travels per device call: the working tree that travels is limited to 64 MiB), and writes
``carry/MANIFEST.txt``
(one copy inside every batch folder too) for ``00-stage.sh``.

Usage (from the repository root, where ``carry/`` is git-ignored)::

    python3 scripts/gpu/make_wheelhouse.py            # download, verify, split, pack, write the manifest
    python3 scripts/gpu/make_wheelhouse.py --deps     # also print every wheel's Requires-Dist (re-pinning
    aid)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PYPI_JSON = "https://pypi.org/pypi/{project}/json"


@dataclass(frozen=True, slots=True, kw_only=True)
class Pin:
    project: str
    version: str
    filename: str
    sha256: str
    size_bytes: int
    why: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Piece:
    """One thing that travels: a whole file or one part of a split file."""

    name: str
    size_bytes: int
    sha256: str
    of: str  # the joined file a part belongs to; "-" for a whole file


def read_lock(path: Path) -> list[Pin]:
    pins = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        project, version, filename, sha, size, why = line.split("\t")
        pins.append(
            Pin(
                project=project, version=version, filename=filename, sha256=sha, size_bytes=int(size), why=why
            )
        )
    return pins


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(pin: Pin, dest: Path) -> None:
    """Download ``pin`` into ``dest`` unless a file with the pinned sha256 is already there."""
    target = dest / pin.filename
    if target.exists() and sha256_of(target) == pin.sha256:
        return
    index_url = PYPI_JSON.format(project=pin.project)
    with urllib.request.urlopen(index_url, timeout=120) as resp:  # noqa: S310 - fixed https URL
        meta = json.load(resp)
    files = [u for u in meta["releases"].get(pin.version, []) if u["filename"] == pin.filename]
    if not files:
        sys.exit(f"error: {pin.filename} is not a file of {pin.project} {pin.version} on PyPI")
    if files[0]["digests"]["sha256"] != pin.sha256:
        sys.exit(f"error: PyPI's sha256 for {pin.filename} differs from the pin in wheelhouse.lock")
    url = urllib.parse.urljoin(index_url, files[0]["url"])
    tmp = target.with_suffix(target.suffix + ".part-download")
    with urllib.request.urlopen(url, timeout=600) as resp, tmp.open("wb") as out:  # noqa: S310
        shutil.copyfileobj(resp, out, 1 << 20)
    got = sha256_of(tmp)
    if got != pin.sha256:
        tmp.unlink()
        sys.exit(f"error: {pin.filename}: sha256 {got} != pinned {pin.sha256}")
    os.replace(tmp, target)


def part_suffixes() -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return [f".part{a}{b}" for a in letters for b in letters]


def split_file(path: Path, part_bytes: int, dest: Path) -> list[Piece]:
    pieces = []
    with path.open("rb") as f:
        for suffix in part_suffixes():
            block = f.read(part_bytes)
            if not block:
                break
            name = path.name + suffix
            (dest / name).write_bytes(block)
            pieces.append(
                Piece(
                    name=name, size_bytes=len(block), sha256=hashlib.sha256(block).hexdigest(), of=path.name
                )
            )
    return pieces


def pack(small: list[Piece], parts: list[Piece], batch_bytes: int) -> list[list[Piece]]:
    """Batch 1 holds every whole file (the first call needs them); parts go first-fit, largest first."""
    batches: list[list[Piece]] = [list(small)]
    if sum(p.size_bytes for p in small) > batch_bytes:
        sys.exit("error: the whole files alone exceed one batch; lower --part-mib")
    for part in sorted(parts, key=lambda p: -p.size_bytes):
        for batch in batches:
            if sum(p.size_bytes for p in batch) + part.size_bytes <= batch_bytes:
                batch.append(part)
                break
        else:
            batches.append([part])
    return batches


def place(src: Path, dst: Path) -> None:
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def print_deps(wheelhouse: Path, pins: list[Pin]) -> None:
    for pin in pins:
        if not pin.filename.endswith(".whl"):
            continue
        with zipfile.ZipFile(wheelhouse / pin.filename) as zf:
            meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            lines = zf.read(meta).decode().splitlines()
        reqs = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Requires-Dist:")]
        print(f"{pin.filename}\n  " + ("\n  ".join(reqs) if reqs else "(no Requires-Dist)"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lock", type=Path, default=HERE / "wheelhouse.lock")
    ap.add_argument("--out", type=Path, default=REPO / "carry", help="the git-ignored carry folder")
    ap.add_argument("--part-mib", type=int, default=31, help="split files larger than this (MiB)")
    ap.add_argument(
        "--batch-bytes",
        type=int,
        default=60_000_000,
        help="most bytes per carried batch folder (the tree that travels is capped at 64 MiB)",
    )
    ap.add_argument("--deps", action="store_true", help="print every wheel's Requires-Dist")
    args = ap.parse_args()

    pins = read_lock(args.lock)
    wheelhouse = args.out / "wheelhouse"
    wheelhouse.mkdir(parents=True, exist_ok=True)
    for pin in pins:
        fetch(pin, wheelhouse)
        print(f"ok  {pin.size_bytes:>11,}  {pin.filename}")
    if args.deps:
        print_deps(wheelhouse, pins)

    part_bytes = args.part_mib * 1024 * 1024
    staging = args.out / ".parts"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    small: list[Piece] = []
    parts: list[Piece] = []
    for pin in pins:
        path = wheelhouse / pin.filename
        if pin.size_bytes > part_bytes:
            parts += split_file(path, part_bytes, staging)
        else:
            small.append(Piece(name=pin.filename, size_bytes=pin.size_bytes, sha256=pin.sha256, of="-"))
    batches = pack(small, parts, args.batch_bytes)

    for old in args.out.glob("b[0-9]*"):
        shutil.rmtree(old)
    batch_of: dict[str, str] = {}
    for i, batch in enumerate(batches, start=1):
        folder = args.out / f"b{i}"
        folder.mkdir()
        for piece in batch:
            src = staging / piece.name if piece.of != "-" else wheelhouse / piece.name
            place(src, folder / piece.name)
            batch_of[piece.name] = folder.name
    shutil.rmtree(staging)

    rows = [
        "# attnforge GPU wheelhouse: what travels in which carry batch (written by make_wheelhouse.py)",
        "# kind: file = carried whole; split = joined on the device from its parts (cat NAME.part* > NAME);",
        "#       part = one piece of a split file. sha256 of a split file is that of the joined file.",
        "# kind\tname\tsize_bytes\tsha256\tbatch\tof",
    ]
    for pin in pins:
        if pin.size_bytes > part_bytes:
            where = sorted({batch_of[p.name] for p in parts if p.of == pin.filename})
            rows.append(f"split\t{pin.filename}\t{pin.size_bytes}\t{pin.sha256}\t{'+'.join(where)}\t-")
        else:
            rows.append(f"file\t{pin.filename}\t{pin.size_bytes}\t{pin.sha256}\t{batch_of[pin.filename]}\t-")
    rows += [f"part\t{p.name}\t{p.size_bytes}\t{p.sha256}\t{batch_of[p.name]}\t{p.of}" for p in parts]
    for i, batch in enumerate(batches, start=1):
        rows.append(f"# batch b{i}: {sum(p.size_bytes for p in batch):,} bytes in {len(batch)} files")
    manifest = "\n".join(rows) + "\n"
    (args.out / "MANIFEST.txt").write_text(manifest)
    (HERE / "MANIFEST.txt").write_text(manifest)  # the tracked copy: what the carried batches must hold
    for i in range(1, len(batches) + 1):
        (args.out / f"b{i}" / "MANIFEST.txt").write_text(manifest)
    print(manifest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
