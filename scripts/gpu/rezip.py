#!/usr/bin/env python3
"""rezip.py TREE_TAR_XZ WHEEL: a wheel again from the xz tar of its unpacked files (make_carry.sh ships the 92 MB
nvidia-cutlass-dsl-libs-cu13 wheel that way: 66 MB). The files and their RECORD are the original ones, so pip
installs it as it would the original; only the zip container (and so the wheel's own sha256) differs."""

from __future__ import annotations

import sys
import tarfile
import time
import zipfile


def main() -> int:
    src, wheel = sys.argv[1], sys.argv[2]
    with tarfile.open(src, "r:xz") as tar, zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as out:
        n = 0
        for member in tar:
            if not member.isfile():
                continue
            data = tar.extractfile(member)
            assert data is not None
            info = zipfile.ZipInfo(member.name.removeprefix("./"), date_time=time.gmtime(member.mtime)[:6])
            info.external_attr = (member.mode & 0o777 | 0o100000) << 16  # keep the file modes (Ray's binaries)
            out.writestr(info, data.read())
            n += 1
    print(f"{wheel}: {n} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
