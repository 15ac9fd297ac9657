#!/usr/bin/env bash
# make_batches.sh: the issue-34 carries b1..b3 from make_carry.sh's c1..c3 plus Ray (no device time; run from the
# root of the checkout the device calls send, after make_carry.sh). Each batch + the tree stays under 67.1 MB:
#   b1  c1 (FA3 source tree, FA4 wheels, cu13 libs part 0, attnforge's deps) + the HF stack (hub, tokenizers,
#       safetensors, importlib_metadata, transformers 5.23, diffusers 0.42.1)               -> setup, install FA3
#   b2  the cu13 libs parts 1-3 + JOIN (FA4) + the first part of Ray's xz tree               -> install FA4
#   b3  SageAttention's tree, Ray's dependencies and the rest of Ray's xz tree + JOIN-ray      -> fleet, Sage
#   b4  made after the first machine: b1 without the FA3 source, with the FA3 wheel it built (pullwheels)
# Ray 2.60.0 (cp312 manylinux2014, 79 MB) travels like the cu13 libs: an xz tar of its unpacked files, split; run.sh
# `stage` joins the parts (JOIN-ray) and `fleet` re-zips it (rezip.py) before pip installs it.
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
rm -rf "$C"/b1 "$C"/b2 "$C"/b3; mkdir -p "$C"/b1 "$C"/b2 "$C"/b3
cp "$C"/c1/* "$C"/b1/; cp "$C"/c2/{huggingface_hub,tokenizers,safetensors,importlib_metadata}-*.whl "$C"/c3/{transformers,diffusers}-*.whl "$C"/b1/
cp "$C"/c2/cu13.tree.tar.xz.part[1-9] "$C"/c2/JOIN "$C"/b2/
cp "$C"/c3/SageAttention.tar.gz "$BC"/{msgpack,jsonschema,jsonschema_specifications,referencing,rpds_py,attrs,protobuf}-*.whl "$C"/b3/
XZ=$BC/ray-2.60.0.tree.tar.xz
split -b 10M -d -a 1 "$XZ" "$C/b3/ray.tree.tar.xz.part"   # part0 -> b2, the rest -> b3
mv "$C"/b3/ray.tree.tar.xz.part0 "$C"/b2/
echo "JOIN ray-2.60.0.tree.tar.xz $(sha256sum < "$XZ" | cut -d' ' -f1) $(cd "$C" && ls b2/ray.tree.tar.xz.part* b3/ray.tree.tar.xz.part* | xargs -n1 basename | tr '\n' ' ')" > "$C/b3/JOIN-ray"
rm -f "$C"/b1/SHA256SUMS
for b in b1 b2 b3; do (cd "$C/$b" && rm -f SHA256SUMS && sha256sum -- * > SHA256SUMS.new && mv SHA256SUMS.new SHA256SUMS); done
tree_bytes=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
for b in b1 b2 b3; do
    bytes=$(du -cb "$C/$b" | tail -1 | cut -f1)
    awk -v b="$b" -v x="$bytes" -v t="$tree_bytes" 'BEGIN { printf "%s: %.1f MB (+ tree %.1f MB = %.1f of 67.1 MB)\n", b, x/1e6, t/1e6, (x+t)/1e6 }'
done
