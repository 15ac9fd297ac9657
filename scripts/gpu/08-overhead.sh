#!/usr/bin/env bash
# 08-overhead.sh: dispatch overhead per call on the GPU (overhead.py: the chosen backend called directly vs
# through attnforge.attention, small bf16 shapes, host time per call, median of interleaved rounds), then a last
# `attnforge doctor` whose verdict should now quote verify and bench. OVERHEAD_ARGS passes options through.
source "$(dirname "$0")/_lib.sh"
ensure_attnforge || { finish; exit 1; }
need_call_time 120 "the overhead measurement"

# shellcheck disable=SC2086
step overhead 420 python scripts/gpu/overhead.py --out "$STEP_DIR/overhead.json" ${OVERHEAD_ARGS:-}
step doctor-final-text 180 attnforge doctor
json_step doctor-final 180 attnforge doctor --json
step pip-list-final 60 bash -c 'python -m pip list --format=freeze 2>/dev/null | sort'
finish "$STEP_DIR/overhead.json" "$STEP_DIR/doctor-final-text.log"
