#!/usr/bin/env bash
# make_carry19.sh FA_REPO CUTLASS_REPO SAGE_REPO: build carry/b1..b3 for the issue-19 run (no device time).
#   FA_REPO       a git clone of Dao-AILab/flash-attention (its HEAD is used; the run of 2026-11-22 used 0251105a)
#   CUTLASS_REPO  a git clone of NVIDIA/cutlass holding the commit flash-attention's csrc/cutlass submodule names
#   SAGE_REPO     a git clone of thu-ml/SageAttention at its head (d1a57a5 on 2026-11-22; the tag v2.2.0 returns garbage
#                 on Hopper: docs/benchmarks.md)
# The FlashAttention-3 tree that builds offline: hopper/ + README.md + LICENSE, and csrc/cutlass's include/ and
# tools/util/include/ at the submodule's commit (~31 MB, 2.8 MB gzipped). Wheels for CPython 3.12 manylinux:
# FlashAttention-4 and what it needs (the same pins as wheelhouse.lock, without the cu12 cutlass libs: installed
# with --no-deps), diffusers/transformers for the model checks. The 92 MB cu13 libs wheel is split in three.
set -euo pipefail
FA=$1 CUT=$2 SAGE=$3
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
C=$ROOT/carry T=$(mktemp -d)
rm -rf "$C"/b1 "$C"/b2 "$C"/b3
mkdir -p "$C"/b1/src "$C"/b1/wh "$C"/b2/wh "$C"/b3/wh "$T/st/flash-attention/csrc/cutlass" "$T/st/SageAttention" "$T/wh"
git -C "$FA" archive HEAD README.md LICENSE hopper | tar x -C "$T/st/flash-attention"
sub=$(git -C "$FA" ls-tree HEAD csrc/cutlass | awk '{print $3}')
git -C "$CUT" archive "$sub" include tools/util/include LICENSE.txt | tar x -C "$T/st/flash-attention/csrc/cutlass"
# the mirror may lack large binary assets: take every text/source file of the tag
git -C "$SAGE" ls-tree -r --name-only HEAD | grep -v -E '^assets/|\.(png|jpg|pdf|gif|mp4)$' \
    | xargs git -C "$SAGE" archive HEAD | tar x -C "$T/st/SageAttention"
tar czf "$C/b1/src/flash-attention.tar.gz" -C "$T/st" flash-attention
tar czf "$C/b1/src/SageAttention-2.2.0.tar.gz" -C "$T/st" SageAttention
P=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
   --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
   --platform manylinux2014_x86_64 -d "$T/wh")
python3 -m pip download -q "${P[@]}" flash-attn-4==4.0.0b36 quack-kernels==0.6.5 apache-tvm-ffi==0.1.15.post2 \
    torch-c-dlpack-ext==0.1.5 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 \
    nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 platformdirs==4.14.5 \
    setuptools==84.2.1 pyelftools==0.33 diffusers==0.42.1 transformers==5.23.0 importlib_metadata
(cd "$T/wh" && sha256sum ./*.whl) > "$C/b1/wh.sha"
mv "$T"/wh/diffusers-* "$T"/wh/transformers-* "$T"/wh/importlib_metadata-* "$C/b3/wh/"
cu13=$(ls "$T"/wh/nvidia_cutlass_dsl_libs_cu13-*.whl)
split -b 32505856 "$cu13" "$T/cu13.part" && rm "$cu13"
mv "$T/cu13.partaa" "$C/b1/wh/"; mv "$T/cu13.partab" "$T/cu13.partac" "$C/b2/wh/"
mv "$T"/wh/*.whl "$C/b1/wh/"
du -sh "$C"/b*
