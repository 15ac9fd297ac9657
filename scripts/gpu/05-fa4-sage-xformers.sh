#!/usr/bin/env bash
# 05-fa4-sage-xformers.sh [sage] [xformers] [fa4] [verify]: install the other backends as a user would, from the
# offline wheelhouse, and verify everything. With no argument: all four, in that order.
#
#   sage      attnforge install sageattention-1 (Triton, no native modules; quantized)
#   xformers  attnforge install xformers, then find the real reason its extension does not load: the
#             XFORMERS_MORE_DETAILS=1 import, a direct dlopen of _C.so, ldd, and the same with the CUDA 12
#             runtime (libcudart.so.12 from nvidia-cuda-runtime-cu12, unpacked, not installed) on LD_LIBRARY_PATH;
#             then what `attnforge doctor --json` says about it
#   fa4       attnforge install flash-attn-4 (needs every batch staged: the cutlass libs wheels), the `cutlass`
#             import through its .pth file, and which package owns the flash_attn/cute files FA2 also ships.
#             Installing or uninstalling flash-attn after flash-attn-4 overwrites or deletes FA4's copies of
#             those files (flash_attn_overlap.py shows which): 07-cache.sh force-reinstalls the FA4 wheel at
#             its end for that reason, so FA4 may be installed while the FA2 build is still running.
#   verify    attnforge verify --json: every backend, or only those in VERIFY_BACKENDS (e.g. "flash-attn-4")
source "$(dirname "$0")/_lib.sh"
ensure_attnforge || { finish; exit 1; }
(($#)) || set -- sage xformers fa4 verify

# install_backend LIMIT_S ID [ALT_ID]: ALT_ID is tried when ID is refused as bad usage (exit 2, an unknown id).
# The limits are short on purpose: these are wheel installs (seconds), and one stuck behind a lock the running
# FA2 build holds should cost minutes, not the whole call.
install_backend() {
    local limit=$1 id=$2 alt=${3:-}
    step "install-$id" "$limit" attnforge install "$id" --find-links "$WH" --offline
    local rc=$?
    if [[ $rc -eq 2 && -n $alt ]]; then
        step "install-$alt" "$limit" attnforge install "$alt" --find-links "$WH" --offline
        rc=$?
    fi
    return $rc
}

for what in "$@"; do
    case $what in
    sage)
        install_backend 180 sageattention-1 sageattention
        step sage-import 180 python -c 'import sageattention, torch; from sageattention import sageattn; print(sageattention.__file__)'
        ;;
    xformers)
        install_backend 180 xformers
        note "attnforge install xformers: rc=$? (a refusal that names the cause is the right outcome)"
        rm -rf /tmp/xf /tmp/cu12rt
        step xformers-raw-install 180 python -m pip install -q --no-deps --no-index --target /tmp/xf "$WH"/xformers-0.0.35-*.whl
        step xformers-more-details 180 env PYTHONPATH=/tmp/xf XFORMERS_MORE_DETAILS=1 python -c 'import xformers, xformers.ops; print("imported", xformers.__version__)'
        step xformers-info 180 env PYTHONPATH=/tmp/xf python -m xformers.info
        json_step xformers-probe 240 env PYTHONPATH="/tmp/xf:$AF_ROOT/src" XFORMERS_MORE_DETAILS=1 python scripts/gpu/xformers_probe.py
        mkdir -p /tmp/cu12rt && unzip -q -o "$WH"/nvidia_cuda_runtime_cu12-*.whl -d /tmp/cu12rt
        json_step xformers-probe-cudart12 240 env PYTHONPATH="/tmp/xf:$AF_ROOT/src" XFORMERS_MORE_DETAILS=1 \
            LD_LIBRARY_PATH="/tmp/cu12rt/nvidia/cuda_runtime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" python scripts/gpu/xformers_probe.py
        python - "$STEP_DIR/xformers-probe.json" "$STEP_DIR/xformers-probe-cudart12.json" <<'EOF' || true
import json, sys
for path in sys.argv[1:]:
    try:
        d = json.load(open(path))
    except Exception as exc:
        print(f"  {path}: unreadable ({exc})"); continue
    print(f"  {path.rsplit('/', 1)[-1]}: dlopen={d.get('dlopen_C_so')!s:.160} not_found={d.get('ldd_not_found')}")
    print(f"    attention: {d.get('memory_efficient_attention')}")
EOF
        json_step doctor-after-xformers 180 attnforge doctor --json
        step doctor-after-xformers-text 180 attnforge doctor
        ;;
    fa4)
        need_call_time 150 "the flash-attn-4 install"
        missing=$(for w in nvidia_cutlass_dsl_libs_cu13 nvidia_cutlass_dsl_libs_cu12 nvidia_cutlass_dsl_libs_base nvidia_cutlass_dsl-4 flash_attn_4; do
            ls "$WH"/$w*.whl >/dev/null 2>&1 || echo "$w"; done)
        if [[ -n $missing ]]; then
            note "fa4 skipped: wheelhouse lacks ${missing//$'\n'/ }: stage every batch (00-stage.sh b2 b3 b4) first"
            FAILED_STEPS+=("fa4(wheelhouse incomplete)")
            continue
        fi
        json_step flash-attn-overlap-before 60 python scripts/gpu/flash_attn_overlap.py
        install_backend 300 flash-attn-4
        step fa4-import 300 python -c 'import cutlass, flash_attn.cute as fc; from flash_attn.cute import flash_attn_func; print("cutlass", cutlass.__file__); print("flash_attn.cute", fc.__file__)'
        step fa4-pth 60 bash -c 'd=$(python -c "import sysconfig; print(sysconfig.get_paths()[\"purelib\"])"); ls "$d"/*.pth; cat "$d"/nvidia_cutlass_dsl_packages.pth; python -m pip list 2>/dev/null | grep -i -E "cutlass|flash|quack|tvm|dlpack"'
        json_step flash-attn-overlap-after 60 python scripts/gpu/flash_attn_overlap.py
        step fa2-still-imports 180 python -c 'import flash_attn, flash_attn_2_cuda; from flash_attn import flash_attn_func; print("flash_attn", flash_attn.__version__)'
        ;;
    verify)
        vname=verify-all
        [[ -n ${VERIFY_BACKENDS:-} ]] && vname="verify-${VERIFY_BACKENDS// /-}"
        # shellcheck disable=SC2086 # a list of backend ids on purpose
        json_step "$vname" "$(( $(call_left_s) > 120 ? $(call_left_s) : 120 ))" attnforge verify ${VERIFY_BACKENDS:-} --json
        python - "$STEP_DIR/$vname.json" <<'EOF' || true
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except Exception as exc:
    sys.exit(f"  verify JSON unreadable: {exc}")
rows = doc.get("results") or doc.get("backends") or doc.get("records") or []
if isinstance(rows, dict):
    rows = [dict(v, backend=k) if isinstance(v, dict) else {"backend": k, "value": v} for k, v in rows.items()]
for r in rows:
    if isinstance(r, dict):
        print(f"  {r.get('backend', r.get('name', '?')):<18} ok={r.get('ok', r.get('passed'))!s:<6} {str(r.get('summary', ''))[:110]}")
EOF
        ;;
    *) echo "unknown part '$what' (sage, xformers, fa4, verify)"; exit 2 ;;
    esac
done
finish "$STEP_DIR/${vname:-verify-all}.json"
