#!/usr/bin/env bash
# make_batches.sh: Ray 2.60.0 and its dependencies for the fleet on a GPU (issue 34), downloaded into
# carry/build-cache (no device time; run from the checkout's root after make_carry.sh, before make_d.sh, which packs
# them into d3/d4). Ray (cp312 manylinux2014, 79 MB) travels like the cu13 libs: an xz tar of its unpacked files
# (64 MB), split; run.sh `stage` joins the parts (JOIN-ray) and `fleet` re-zips it (rezip.py) before pip installs it.
# (Its batches b1-b3 of 2026-11-27..29 no longer fit a call beside the 15 MB tree: 69.9-72.3 of 67.1 MB.)
set -euo pipefail
C=$PWD/carry BC=$PWD/carry/build-cache
P=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
   --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$BC")
python3 -m pip download -q "${P[@]}" ray==2.60.0 msgpack==1.2.4 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 \
    referencing==0.37.0 rpds-py==2026.9.1 attrs==26.1.0 protobuf==7.36.2 2>&1 | grep -v '^WARNING: Location' || true
RAY=ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
if [[ ! -f $BC/ray-2.60.0.tree.tar.xz ]]; then
    t=$(mktemp -d); unzip -q "$BC/$RAY" -d "$t"; tar cf - -C "$t" . | xz -T0 -7 > "$BC/ray-2.60.0.tree.tar.xz"; rm -rf "$t"
fi
