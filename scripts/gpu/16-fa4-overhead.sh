#!/usr/bin/env bash
# 16-fa4-overhead.sh: FlashAttention-4's dispatch overhead after routes were bound to their call (2026-11-23),
# forced (the route is the same hot path as a chosen backend). Two calls (S=scripts/gpu; carry/f1 is carry/b1
# without its source trees):
#   1. carry f1: bash $S/10-stage.sh f1 && bash $S/01-setup.sh
#   2. carry b2: bash $S/10-stage.sh b2; WAIT_S=0 bash $S/12-fa4-wait.sh; bash $S/16-fa4-overhead.sh
source "$(dirname "$0")/_lib.sh"
ensure_attnforge || { finish; exit 1; }
step fa4-overhead 400 python scripts/gpu/overhead.py --backend flash-attn-4 --rounds "${ROUNDS:-20}" \
    --shapes "${SHAPES:-1,8,128,64;1,16,512,128}" --out "$STEP_DIR/overhead_fa4.json"
cat "$STEP_DIR/fa4-overhead.log" 2>/dev/null | tail -n 20
finish "$STEP_DIR/overhead_fa4.json"
