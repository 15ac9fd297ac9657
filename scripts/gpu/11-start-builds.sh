#!/usr/bin/env bash
# 11-start-builds.sh: the two source builds of issue 19, one after the other in one background job (each gets all
# 16 cores; the slim FlashAttention-3 build time is the figure the issue names):
#   1. attnforge install flash-attn-3 --head-dim 128 --dtype bf16 --source /tmp/src/flash-attention#subdirectory=hopper
#   2. attnforge install sageattention-2 --source /tmp/src/SageAttention
# Each writes its own timing line to $RUN/bg/builds/times.tsv (name, rc, seconds).
source "$(dirname "$0")/_lib.sh"
ensure_attnforge || { finish; exit 1; }
SRC=${AF_SRC:-/tmp/src}
step plan-fa3-slim 120 attnforge plan flash-attn-3 --head-dim 128 --dtype bf16 \
    --source "$SRC/flash-attention#subdirectory=hopper"
json_step plan-fa3-slim-json 120 attnforge plan flash-attn-3 --head-dim 128 --dtype bf16 \
    --source "$SRC/flash-attention#subdirectory=hopper" --json
cat > "$RUN/builds.sh" <<EOS
set -u
t=\$(date +%s); attnforge install flash-attn-3 --head-dim 128 --dtype bf16 --source "$SRC/flash-attention#subdirectory=hopper" -v > "$RUN/bg/fa3.log" 2>&1; rc=\$?
printf 'fa3-slim-install\t%s\t%s\n' \$rc \$((\$(date +%s) - t)) >> "$RUN/bg/times.tsv"
t=\$(date +%s); attnforge install sageattention-2 --source "$SRC/SageAttention" -v > "$RUN/bg/sage.log" 2>&1; rc=\$?
printf 'sage-install\t%s\t%s\n' \$rc \$((\$(date +%s) - t)) >> "$RUN/bg/times.tsv"
EOS
mkdir -p "$RUN/bg"
bg_start builds bash "$RUN/builds.sh"
sleep 45
note "builds after 45 s: $(bg_state builds); $(grep -ao '\[[0-9]\+/[0-9]\+\]' "$RUN/bg/fa3.log" 2>/dev/null | tail -1)"
finish
