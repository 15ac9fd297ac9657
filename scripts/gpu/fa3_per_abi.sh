#!/usr/bin/env bash
# fa3_per_abi.sh DEST: FlashAttention-3 built against this exact torch (hopper/flash_api.cpp: ops registered with
# TORCH_LIBRARY, called unboxed) instead of the libtorch stable ABI (hopper/flash_api_stable.cpp: ops registered
# with STABLE_TORCH_LIBRARY, each call boxed and its ~30 arguments converted), which hopper/setup.py picks for every
# torch >= 2.9.0.dev20250830 (lines 645-652 at 0251105a). Built slim (D128, bf16) through `attnforge build` from a
# copy of the staged source tree whose setup.py takes the pre-2.9 branch, then unpacked into DEST with
# `pip install --target`, so the stable build stays installed in the venv and overhead.py can time each:
#
#     python scripts/gpu/overhead.py --backend flash-attn-3 ...                      # the stable-ABI build
#     PYTHONPATH=DEST python scripts/gpu/overhead.py --backend flash-attn-3 ...      # this per-ABI build
#
# Needs run.sh `stage setup` first (the venv, /tmp/src/flash-attention). Why: issue 30 asks FA3's route to cost at
# most SDPA's host time + 5 us; the sixteenth session timed the stable op alone at 15-23 us over SDPA's call.
source "$(dirname "${BASH_SOURCE[0]}")/_lib.sh"
DEST=${1:-/tmp/fa3-per-abi}
SRC=${AF_SRC:-/tmp/src}
copy=/tmp/fa3-per-abi-src
rm -rf "$copy" "$DEST"; mkdir -p "$copy" "$DEST"
cp -r "$SRC/flash-attention" "$copy/"
setup=$copy/flash-attention/hopper/setup.py
grep -q 'if torch_version >= target_version:' "$setup" || { echo "setup.py has no stable-ABI switch to turn off"; exit 2; }
sed -i 's/if torch_version >= target_version:/if False:  # attnforge fa3_per_abi.sh: flash_api.cpp/' "$setup"
# flash_api.cpp includes ATen/cuda/CUDAContextLight.h, which needs cuBLAS/cuSPARSE/cuSOLVER headers: the image's
# toolkit may lack them, torch's nvidia-* wheels carry them
sp=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for h in cusparse.h cublas_v2.h cusolverDn.h; do
    d=$(find "$sp/nvidia" -name "$h" -printf '%h\n' 2>/dev/null | head -1)
    [[ -n $d ]] && CPATH="$d${CPATH:+:$CPATH}"
done
export CPATH="${CPATH:-}"
echo "CPATH=$CPATH"
t0=$SECONDS
attnforge build flash-attn-3 --source "$copy/flash-attention#subdirectory=hopper" --head-dim 128 --dtype bf16 \
    --from-source --offline -v || { echo "per-ABI build failed after $((SECONDS - t0)) s"; exit 1; }
echo "per-ABI build: $((SECONDS - t0)) s"
whl=$(find "$ATTNFORGE_HOME" -name 'flash_attn_3-*.whl' -newer "$setup" | head -1)
[[ -n $whl ]] || { echo "no wheel newer than the patched setup.py under $ATTNFORGE_HOME"; exit 1; }
python -m pip install -q --no-deps --no-index --target "$DEST" "$whl"
ls "$DEST" "$DEST"/flash_attn_3 2>/dev/null
nm -D "$DEST"/flash_attn_3/_C*.so 2>/dev/null | grep -c 'aoti_torch' | sed 's/^/aoti_torch_* symbols (stable ABI shims): /'
