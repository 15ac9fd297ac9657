#!/usr/bin/env bash
# make_d.sh: the two carries d1, d2 that take FA3 (source or wheel), FA4 and the HF stack to one machine in two calls
# (no device time; run from the checkout's root after make_carry.sh). The tree is ~15 MB (2026-11-30), so each batch
# stays under ~52 MB (d1 50.1, d2 48.3 with the 17 MiB split):
#   d1  c1's small files (FA3 source tree or wheel, FA4's small wheels, attnforge's deps) + the HF stack + the first
#       17 MiB of the cu13 libs' xz tree                                          -> stage, setup, install FA3
#   d2  the rest of the cu13 libs' xz tree + its JOIN                             -> stage (join, re-zip), install FA4
#   d3  diffusers' wheel (6.4 MB) + the first 40 MiB of Ray's xz tree (when make_batches.sh fetched it)
#                                                                                 -> stage, setup (Wan, Flux)
#   d4  the rest of Ray's xz tree + JOIN-ray, Ray's dependencies, SageAttention's source tree
#                                                                                 -> stage, fleet, install Sage
set -euo pipefail
C=$PWD/carry BC=$PWD/carry/build-cache
XZ=$BC/nvidia_cutlass_dsl_libs_cu13-4.8.1.tree.tar.xz
rm -rf "$C"/d1 "$C"/d2 "$C"/d3 "$C"/d4; mkdir -p "$C"/d1 "$C"/d2 "$C"/d3 "$C"/d4
find "$C"/c1 -maxdepth 1 -type f ! -name 'cu13.tree.tar.xz.part*' ! -name SHA256SUMS -exec cp {} "$C"/d1/ \;
cp "$C"/c2/{huggingface_hub,tokenizers,safetensors,importlib_metadata}-*.whl "$C"/c3/transformers-*.whl "$C"/d1/
cp "$C"/c3/diffusers-*.whl "$C"/d3/
split -b 17M -d -a 1 "$XZ" "$C/d2/cu13.tree.tar.xz.part"   # part0 -> d1, the rest stay in d2
mv "$C"/d2/cu13.tree.tar.xz.part0 "$C"/d1/
echo "JOIN cu13.tree.tar.xz $(sha256sum < "$XZ" | cut -d' ' -f1) $(cd "$C" && ls d1/cu13.tree.tar.xz.part* d2/cu13.tree.tar.xz.part* | xargs -n1 basename | tr '\n' ' ')" > "$C/d2/JOIN"
RAYXZ=$BC/ray-2.60.0.tree.tar.xz
cp "$C"/c3/SageAttention.tar.gz "$C"/d4/
if [[ -f $RAYXZ ]]; then
    split -b 40M -d -a 1 "$RAYXZ" "$C/d4/ray.tree.tar.xz.part"   # part0 -> d3, the rest stay in d4
    mv "$C"/d4/ray.tree.tar.xz.part0 "$C"/d3/
    cp "$BC"/{msgpack,jsonschema,jsonschema_specifications,referencing,rpds_py,attrs,protobuf}-*.whl "$C"/d4/
    echo "JOIN ray-2.60.0.tree.tar.xz $(sha256sum < "$RAYXZ" | cut -d' ' -f1) $(cd "$C" && ls d3/ray.tree.tar.xz.part* d4/ray.tree.tar.xz.part* | xargs -n1 basename | tr '\n' ' ')" > "$C/d4/JOIN-ray"
fi
for b in d1 d2 d3 d4; do (cd "$C/$b" && sha256sum -- * > ../SHA256SUMS.$b && mv ../SHA256SUMS.$b SHA256SUMS); done
tree_bytes=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
for b in d1 d2 d3 d4; do
    bytes=$(du -cb "$C/$b" | tail -1 | cut -f1)
    awk -v b="$b" -v x="$bytes" -v t="$tree_bytes" 'BEGIN { printf "%s: %.1f MB (+ tree %.1f MB = %.1f of 67.1 MB)\n", b, x/1e6, t/1e6, (x+t)/1e6 }'
done
