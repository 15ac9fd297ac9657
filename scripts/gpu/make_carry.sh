#!/usr/bin/env bash
# make_carry.sh [WHEELS_H100]: pack carry/c1..c3 for the issue-25 run (no device time; run from the root of the
# checkout the device calls send, e.g. `cd /work/main && bash scripts/gpu/make_carry.sh`).
#   WHEELS_H100  the slim FA3 + SageAttention wheels the early build call brought back (default carry/wheels-h100)
# Downloads (PyPI, python 3.12 manylinux) into carry/build-cache what is not there yet: the FlashAttention-4 pins
# (flash-attn-4 4.0.0b36, quack-kernels, cutlass-dsl 4.8.1 and its cu13 libs), transformers 5.23.0 + diffusers
# 0.42.1 and the newer hub/tokenizers/safetensors they need (the image has transformers 5.17), platformdirs and
# pyelftools (attnforge's deps the image lacks), setuptools (the SPDX license string needs >= 77), and the
# flash-attention hopper/ + cutlass include/ and SageAttention trees (source fallback only; FA_REPO CUTLASS_REPO
# SAGE_REPO env vars name git clones). The 92 MB cu13 libs wheel travels as an xz tar of its unpacked files
# (66 MB: 26 MB less than the wheel) split across c1 and c2; run.sh `stage` joins it and re-zips a wheel.
# Each batch: files + SHA256SUMS (of every file as it travels) + JOIN lines; each under 58 MB (64 MiB a call,
# the tree ~5 MB).
set -euo pipefail
ROOT=$PWD  # the checkout whose carry/ travels (run from its root)
C=$ROOT/carry BC=$ROOT/carry/build-cache W=${1:-$ROOT/carry/wheels-h100}
mkdir -p "$BC"
P=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
   --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
   --platform manylinux2014_x86_64 -d "$BC")
PINS=(flash-attn-4==4.0.0b36 quack-kernels==0.6.5 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5
      nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
      nvidia-cutlass-dsl-libs-cu13==4.8.1 transformers==5.23.0 diffusers==0.42.1 huggingface-hub==1.33.0
      tokenizers==0.23.3 safetensors==0.8.0 importlib_metadata==10.2.0 platformdirs==4.14.5 pyelftools==0.33
      setuptools==84.2.1)
python3 -m pip download -q "${P[@]}" "${PINS[@]}" 2>&1 | grep -v '^WARNING: Location' || true
CU13=nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
if [[ ! -f $BC/nvidia_cutlass_dsl_libs_cu13-4.8.1.tree.tar.xz ]]; then  # ~4 min on 2 cores
    # x86 BCJ filter + preset 9e: 61.0 MB where -6 gave 66.1 (2026-12-03); the tree had grown to 26.2 MiB and d1s + e2
    # (each beside it, 64 MiB a call) no longer fit two calls. Python's lzma (rezip.py) reads the filter chain
    t=$(mktemp -d); unzip -q "$BC/$CU13" -d "$t"
    tar cf - -C "$t" . | xz -T0 --x86 --lzma2=preset=9e > "$BC/nvidia_cutlass_dsl_libs_cu13-4.8.1.tree.tar.xz"; rm -rf "$t"
fi
if [[ ! -f $BC/flash-attention.tar.gz && -n ${FA_REPO:-} ]]; then
    t=$(mktemp -d); mkdir -p "$t/flash-attention/csrc/cutlass" "$t/SageAttention"
    git -C "$FA_REPO" archive HEAD README.md LICENSE hopper | tar x -C "$t/flash-attention"
    sub=$(git -C "$FA_REPO" ls-tree HEAD csrc/cutlass | awk '{print $3}')
    git -C "$CUTLASS_REPO" archive "$sub" include tools/util/include LICENSE.txt | tar x -C "$t/flash-attention/csrc/cutlass"
    git -C "$SAGE_REPO" ls-tree -r --name-only HEAD | grep -v -E '^assets/|\.(png|jpg|pdf|gif|mp4)$' \
        | xargs git -C "$SAGE_REPO" archive HEAD | tar x -C "$t/SageAttention"
    tar czf "$BC/flash-attention.tar.gz" -C "$t" flash-attention
    tar czf "$BC/SageAttention.tar.gz" -C "$t" SageAttention; rm -rf "$t"
fi
[[ -f $BC/flash-attention.tar.gz ]] || cp "$ROOT"/carry/early/src/*.tar.gz "$BC/" 2>/dev/null || true

shopt -s nullglob  # a fresh checkout has no early-call wheels: FA3 and Sage are then built on the device
rm -rf "$C"/c1 "$C"/c2 "$C"/c3
mkdir -p "$C"/c1 "$C"/c2 "$C"/c3
put() { local batch=$1; shift; for f in "$@"; do cp "$f" "$C/$batch/"; done; }
put c1 "$BC"/flash-attention.tar.gz "$W"/flash_attn_3-*.whl "$W"/sageattention-*.whl "$BC"/flash_attn_4-*.whl "$BC"/quack_kernels-*.whl \
    "$BC"/apache_tvm_ffi-*.whl "$BC"/torch_c_dlpack_ext-*.whl "$BC"/nvidia_cutlass_dsl-4*.whl \
    "$BC"/nvidia_cutlass_dsl_libs_core-*.whl "$BC"/nvidia_cutlass_dsl_libs_base-*.whl "$BC"/platformdirs-*.whl \
    "$BC"/pyelftools-*.whl "$BC"/setuptools-*.whl
XZ=$BC/nvidia_cutlass_dsl_libs_cu13-4.8.1.tree.tar.xz
split -b 18M -d -a 1 "$XZ" "$C/c1/cu13.tree.tar.xz.part"   # part0 -> c1, the rest -> c2
mv "$C"/c1/cu13.tree.tar.xz.part[1-9] "$C/c2/"
echo "JOIN cu13.tree.tar.xz $(sha256sum < "$XZ" | cut -d' ' -f1) $(cd "$C" && ls c1/cu13.tree.tar.xz.part* c2/cu13.tree.tar.xz.part* | xargs -n1 basename | tr '\n' ' ')" > "$C/c2/JOIN"
put c2 "$BC"/huggingface_hub-*.whl "$BC"/tokenizers-*.whl "$BC"/safetensors-*.whl "$BC"/importlib_metadata-*.whl
put c3 "$BC"/transformers-*.whl "$BC"/diffusers-*.whl "$BC"/SageAttention.tar.gz
for b in c1 c2 c3; do (cd "$C/$b" && sha256sum -- * | grep -v ' SHA256SUMS$' > SHA256SUMS); done
tree_bytes=$(git -C "$ROOT" ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
for b in c1 c2 c3; do
    bytes=$(du -cb "$C/$b" | tail -1 | cut -f1)
    awk -v b="$b" -v n="$(ls "$C/$b" | wc -l)" -v x="$bytes" -v t="$tree_bytes" \
        'BEGIN { printf "%s: %d files, %.1f MB (+ tree %.1f MB = %.1f of 67.1 MB)\n", b, n, x/1e6, t/1e6, (x+t)/1e6 }'
done
