#!/usr/bin/env bash
# 13-verify-bench.sh: the cache-hit reinstall of the slim FA3 (pip uninstall, attnforge install again: timed),
# `attnforge verify` of everything (each backend in its own child: a crash cannot stop it), then
# `attnforge bench --shapes grid` and `--shapes diffusion` (the new shape classes), with a plot.
source "$(dirname "$0")/_lib.sh"
ensure_attnforge || { finish; exit 1; }
SRC=${AF_SRC:-/tmp/src}
if [[ $(bg_state builds) == running ]]; then note "the builds still run: waiting"; fi
while [[ $(bg_state builds) == running ]] && (( $(call_left_s) > 420 )); do sleep 10; done
if python -c 'import flash_attn_interface' 2>/dev/null && [[ ! -f $STEP_DIR/cache-hit.done ]]; then
    step fa3-uninstall 120 python -m pip uninstall -y flash-attn-3
    step fa3-cache-hit-reinstall 300 attnforge install flash-attn-3 --head-dim 128 --dtype bf16 \
        --source "$SRC/flash-attention#subdirectory=hopper" --no-verify && touch "$STEP_DIR/cache-hit.done"
fi
json_step verify-all 600 attnforge verify --json
step verify-text 60 python -c 'import json,sys; d=json.load(open(sys.argv[1])); [print(r.get("backend"), r.get("ok"), (r.get("summary") or "")[:150]) for r in d.get("results", d.get("backends", []))]' "$STEP_DIR/verify-all.json"
need_call_time 200 "the bench"
BENCH_ARGS=${BENCH_ARGS:---shapes grid --head-dim 64 --head-dim 128 --head-dim 256}
# shellcheck disable=SC2086
json_step bench-grid $(( $(call_left_s) - 60 )) attnforge bench $BENCH_ARGS --json --plot "$STEP_DIR/bench-grid.png"
finish "$STEP_DIR/verify-all.json" "$STEP_DIR/bench-grid.json" "$STEP_DIR/bench-grid.png"
