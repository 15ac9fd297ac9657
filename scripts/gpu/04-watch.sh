#!/usr/bin/env bash
# 04-watch.sh [MAX_WAIT_S]: follow the background FlashAttention-2 build until it ends, MAX_WAIT_S (default 540)
# pass, or the call's budget (AF_CALL_T0 + AF_CALL_BUDGET_S, less 20 s) runs out, printing the ninja step [n/N]
# with an ETA every 30 s. When it has ended: the build time, attnforge's build log, the wheel in the cache and an
# import check (verify runs at the end of 07-cache.sh, after the cache round trip).
# Exit 0: built and installed; 3: still running (call again at once); 1: failed (the log tail says why).
source "$(dirname "$0")/_lib.sh"
max_wait_s=${1:-${AF_WATCH_S:-540}}
log="$RUN/bg/fa2/output.log"

[[ $(bg_state fa2) == absent ]] && { echo "no fa2 build was started (03-start-fa2-build.sh)"; finish; exit 1; }

# progress: the last ninja [n/N] in the install output or in the newest build log attnforge keeps.
progress() {
    local newest best=""
    # attnforge keeps its build log in the cache home or its build root: any fresh *.log under /tmp will do.
    newest=$(find "$ATTNFORGE_HOME" /tmp -maxdepth 6 -name '*.log' -newer "$RUN/bg/fa2/start_epoch" \
        -not -path "$RUN/*" -printf '%T@ %p\n' 2>/dev/null | sort -n | tail -1 | cut -d' ' -f2-)
    for f in "$log" $newest; do
        [[ -f "$f" ]] || continue
        local p
        p=$(grep -ao '\[[0-9]\+/[0-9]\+\]' "$f" | tail -1)
        [[ -n $p ]] && best=$p
    done
    echo "${best:-[?/?]}"
}

last_print=-999
while [[ $(bg_state fa2) == running ]]; do
    elapsed=$(bg_elapsed_s fa2)
    if (( $(date +%s) - SCRIPT_T0 >= max_wait_s || $(call_left_s) <= 20 )); then break; fi
    if (( elapsed - last_print >= 30 )); then
        p=$(progress)
        n=${p#[}; n=${n%%/*}; total=${p#*/}; total=${total%]}
        eta="?"
        if [[ $n =~ ^[0-9]+$ && $total =~ ^[0-9]+$ && $n -gt 0 ]]; then eta="$(( elapsed * (total - n) / n ))s"; fi
        echo "fa2: ${elapsed}s elapsed, step $p, eta ~$eta, load $(cut -d' ' -f1 /proc/loadavg)"
        echo "$(date -u +%FT%TZ) ${elapsed}s $p eta=$eta" >> "$STEP_DIR/progress.txt"
        last_print=$elapsed
    fi
    sleep 5
done

state=$(bg_state fa2)
elapsed=$(bg_elapsed_s fa2)
echo "fa2 state: $state after ${elapsed}s (step $(progress))"
cp "$log" "$STEP_DIR/fa2-install-output.log" 2>/dev/null
if [[ $state == running ]]; then
    note "fa2 still building after ${elapsed}s at $(progress): call 04-watch.sh again at once"
    finish
    exit 3
fi

printf '%s\t%s\n' "fa2_build_rc" "${state#done:}" "fa2_build_wall_s" "$elapsed" > "$STEP_DIR/fa2-build.tsv"
note "fa2 build ended: $state, wall ${elapsed}s (start to end of 'attnforge install flash-attn')"
tail -n 30 "$log" | sed 's/^/    | /'
# Keep attnforge's own build log (the full compiler output) next to the install output.
mkdir -p "$STEP_DIR/buildlogs"
find "$ATTNFORGE_HOME" /tmp -maxdepth 6 -name '*.log' -newer "$RUN/bg/fa2/start_epoch" -not -path "$RUN/*" \
    -size -8M -printf '%s %p\n' -exec cp --backup=numbered {} "$STEP_DIR/buildlogs/" \; 2>/dev/null \
    > "$STEP_DIR/buildlogs/where.txt"
find "$ATTNFORGE_HOME" /tmp/fa2-wheel -name 'flash_attn-*.whl' -printf '%s %p\n' 2>/dev/null | tee "$STEP_DIR/fa2-wheels.txt"

if [[ $state == done:0 ]]; then
    step fa2-import 120 python -c 'import flash_attn, flash_attn_2_cuda; print(flash_attn.__version__, flash_attn.__file__)'
    step fa2-pip-show 60 python -m pip show -f flash-attn
else
    FAILED_STEPS+=("fa2-build($state)")
    step fa2-diagnose 120 attnforge diagnose "$log"
fi
finish "$STEP_DIR/fa2-install-output.log"
[[ $state == done:0 ]]
