#!/usr/bin/env bash
# make_d.sh: the carries that take FA3 (source or wheel), FA4, the HF stack, Ray and SageAttention to one machine, one
# batch a call (no device time; run from the checkout's root after make_carry.sh). A call takes 64 MiB with the tree,
# counted in disk blocks; the tree is ~22 MiB on disk (2026-12-01), so each batch stays under ~44 MiB:
#   d1  c1's small files (FA3 source tree or wheel, FA4's small wheels, attnforge's deps) + the HF stack's small wheels
#       + the first 23 MiB of the cu13 libs' xz tree                              -> stage, setup, install FA3
#   d2  the rest of the cu13 libs' xz tree + its JOIN                             -> stage (join, re-zip), install FA4
#   d3m the transformers and diffusers wheels                                     -> stage, setup (the five models)
#   d5  d1 without the cu13 part, plus d3m's wheels (hard links, ~37 MiB): FA3 and the five models in one fresh call
#       (no FA4)                                                                  -> stage, setup, install FA3, models
#   d3  diffusers' wheel (6.4 MB) + the first 34 MiB of Ray's xz tree (when make_batches.sh fetched it)
#                                                                                 -> stage, setup (Wan, Flux)
#   d4  the rest of Ray's xz tree + JOIN-ray, Ray's dependencies, SageAttention's source tree
#                                                                                 -> stage, fleet, install Sage
#   d1s d1 without the HF stack and setuptools, with SageAttention's tree and the first part of the cu13 libs' xz tree (q0,
#       split so d1s and e2 weigh the same: 37.9 MiB each on 2026-12-03): the
#       tree grew to ~24.7 MiB on disk (2026-12-02), d1 (43 MB) and d2 (42 MB) no longer fit beside it
#                                                                                 -> stage, setup, install FA3
#   e2  the rest of the cu13 libs' xz tree (q1) + its JOIN                        -> stage (join, re-zip), install FA4
# d5 also takes SageAttention's tree, so a d1s -> e2 -> d5 machine has FA3, FA4, Sage's source and the five models.
set -euo pipefail
C=$PWD/carry BC=$PWD/carry/build-cache
XZ=$BC/nvidia_cutlass_dsl_libs_cu13-4.8.1.tree.tar.xz
rm -rf "$C"/d1 "$C"/d2 "$C"/d3 "$C"/d4 "$C"/d3m "$C"/d5 "$C"/d1a "$C"/d1s "$C"/e2; mkdir -p "$C"/d1 "$C"/d2 "$C"/d3 "$C"/d4 "$C"/d3m
find "$C"/c1 -maxdepth 1 -type f ! -name 'cu13.tree.tar.xz.part*' ! -name SHA256SUMS -exec cp {} "$C"/d1/ \;
cp "$C"/c2/{huggingface_hub,tokenizers,safetensors,importlib_metadata}-*.whl "$C"/d1/
cp "$C"/c3/diffusers-*.whl "$C"/d3/
cp "$C"/c3/transformers-*.whl "$C"/c3/diffusers-*.whl "$C"/d3m/
split -b 23M -d -a 1 "$XZ" "$C/d2/cu13.tree.tar.xz.part"   # part0 -> d1, the rest stay in d2
mv "$C"/d2/cu13.tree.tar.xz.part0 "$C"/d1/
echo "JOIN cu13.tree.tar.xz $(sha256sum < "$XZ" | cut -d' ' -f1) $(cd "$C" && ls d1/cu13.tree.tar.xz.part* d2/cu13.tree.tar.xz.part* | xargs -n1 basename | tr '\n' ' ')" > "$C/d2/JOIN"
RAYXZ=$BC/ray-2.60.0.tree.tar.xz
cp "$C"/c3/SageAttention.tar.gz "$C"/d4/
if [[ -f $RAYXZ ]]; then
    split -b 34M -d -a 1 "$RAYXZ" "$C/d4/ray.tree.tar.xz.part"   # part0 -> d3, the rest stay in d4
    mv "$C"/d4/ray.tree.tar.xz.part0 "$C"/d3/
    cp "$BC"/{msgpack,jsonschema,jsonschema_specifications,referencing,rpds_py,attrs,protobuf}-*.whl "$C"/d4/
    echo "JOIN ray-2.60.0.tree.tar.xz $(sha256sum < "$RAYXZ" | cut -d' ' -f1) $(cd "$C" && ls d3/ray.tree.tar.xz.part* d4/ray.tree.tar.xz.part* | xargs -n1 basename | tr '\n' ' ')" > "$C/d4/JOIN-ray"
fi
mkdir -p "$C"/d5
for f in "$C"/d1/* "$C"/d3m/*; do case $(basename "$f") in cu13.tree.tar.xz.part*) ;; *) ln "$f" "$C/d5/" ;; esac; done
ln "$C"/c3/SageAttention.tar.gz "$C"/d5/
mkdir -p "$C"/d1s "$C"/e2
for f in "$C"/d1/*; do case $(basename "$f") in cu13.tree.tar.xz.part*|huggingface_hub-*|tokenizers-*|safetensors-*|setuptools-*) ;; *) ln "$f" "$C/d1s/" ;; esac; done
ln "$C"/c3/SageAttention.tar.gz "$C"/d1s/
# the split that leaves d1s and e2 the same size (each needs the tree beside it): q0 = (xz - d1s's other files) / 2
others=$(du -cb "$C"/d1s/* | tail -1 | cut -f1); q0=$(( ($(stat -c %s "$XZ") - others) / 2 ))
head -c "$q0" "$XZ" > "$C"/d1s/cu13.tree.tar.xz.q0
tail -c +$(( q0 + 1 )) "$XZ" > "$C"/e2/cu13.tree.tar.xz.q1
echo "JOIN cu13.tree.tar.xz $(sha256sum < "$XZ" | cut -d' ' -f1) cu13.tree.tar.xz.q0 cu13.tree.tar.xz.q1" > "$C/e2/JOIN"
for b in d1 d2 d3 d4 d3m d5 d1s e2; do (cd "$C/$b" && rm -f SHA256SUMS && sha256sum -- * > ../SHA256SUMS.$b && mv ../SHA256SUMS.$b SHA256SUMS); done
tree_kib=$(git ls-files -z | du -ck --files0-from=- | tail -1 | cut -f1)
for b in d1 d2 d3 d4 d3m d5 d1s e2; do
    kib=$(du -sk "$C/$b" | cut -f1)
    awk -v b="$b" -v x="$kib" -v t="$tree_kib" 'BEGIN { printf "%s: %.1f MiB on disk (+ tree %.1f = %.1f of 64 MiB)%s\n", b, x/1024, t/1024, (x+t)/1024, (x+t > 65536 ? ": too big to carry" : "") }'
done
