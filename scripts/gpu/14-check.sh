#!/usr/bin/env bash
# 14-check.sh [bench-diffusion|grid|models|route|overhead]...: what runs on the verified, benched machine.
#   bench-diffusion  attnforge bench --shapes diffusion (Flux 4608, Wan 32760)
#   grid             grid_check.py: attnforge.attention vs every backend called directly (exact, allow_quantized)
#   models           models_gpu.py: a tiny Llama through transformers and a tiny Flux transformer through diffusers
#   route            prebuilt_route.py: the FA3 wheel built here, listed through a local GITHUB_API_URL, chosen,
#                    hash-checked and arch-checked in a fresh ATTNFORGE_HOME
#   overhead         overhead.py: host time per call, backend direct vs attnforge.attention
source "$(dirname "$0")/_lib.sh"
ensure_attnforge || { finish; exit 1; }
for what in "$@"; do
    case $what in
        bench-diffusion) json_step bench-diffusion $(( $(call_left_s) - 30 )) attnforge bench --shapes diffusion --mode fwd --json ;;
        grid) step grid-check $(( $(call_left_s) - 30 )) python scripts/gpu/grid_check.py --out "$STEP_DIR/grid.json" --budget-s $(( $(call_left_s) - 90 )) ${GRID_ARGS:-} ;;
        models) step models 400 python scripts/gpu/models_gpu.py --out "$STEP_DIR/models.json" ;;
        route) step prebuilt-route 400 python scripts/gpu/prebuilt_route.py --out "$STEP_DIR/route.json" ;;
        overhead) step overhead 300 python scripts/gpu/overhead.py --out "$STEP_DIR/overhead.json" ${OVERHEAD_ARGS:-} ;;
        *) note "unknown part $what" ;;
    esac
done
finish "$STEP_DIR/grid.json" "$STEP_DIR/models.json" "$STEP_DIR/route.json" "$STEP_DIR/overhead.json" "$STEP_DIR/bench-diffusion.json"
