#!/usr/bin/env bash
# 03-start-fa2-build.sh: start the real FlashAttention-2 source build in its own process session, so it outlives
# this call (741 s on 16 cores last time; a command may run 10 minutes), then return within about a minute.
# Watch it with 04-watch.sh. The machine must stay warm: make the next call within 30 s of this one ending.
#
#   AF_FA2_MODE=attnforge (default)  attnforge install flash-attn --find-links /tmp/wh --offline
#   AF_FA2_MODE=manual               the hand-set build (pip wheel with FLASH_ATTN_CUDA_ARCHS=90, MAX_JOBS=16,
#                                    NVCC_THREADS=2): a fallback that still yields a FlashAttention-2 to bench
#                                    when attnforge's own build path is broken; say so in docs/benchmarks.md.
source "$(dirname "$0")/_lib.sh"
ensure_attnforge || { finish; exit 1; }
mode=${AF_FA2_MODE:-attnforge}
sdist=$(ls "$WH"/flash_attn-2.8.3.post2.tar.gz 2>/dev/null) || { echo "error: sdist not in $WH: run 00-stage.sh b1"; finish; exit 1; }

state=$(bg_state fa2)
if [[ $state == running ]]; then
    note "fa2 build already running for $(bg_elapsed_s fa2) s; not starting another"
    finish
    exit 0
fi

case $mode in
    attnforge)
        bg_start fa2 attnforge install flash-attn --find-links "$WH" --offline ;;
    manual)
        src=/tmp/fa2src
        rm -rf "$src" /tmp/fa2-wheel && mkdir -p "$src" /tmp/fa2-wheel && tar xzf "$sdist" -C "$src"
        bg_start fa2 env FLASH_ATTN_CUDA_ARCHS=90 FLASH_ATTENTION_FORCE_BUILD=TRUE MAX_JOBS=16 NVCC_THREADS=2 \
            bash -c "cd $src/flash_attn-2.8.3.post2 && python -m pip wheel -v --no-build-isolation --no-deps --no-index -w /tmp/fa2-wheel . \
                     && python -m pip install --no-deps --no-index /tmp/fa2-wheel/flash_attn-*.whl" ;;
    *) echo "unknown AF_FA2_MODE=$mode"; exit 2 ;;
esac
note "fa2 build started (mode $mode) at $(date -u +%FT%TZ)"

# Stay a minute: an early failure (bad flag, missing tool, a CLI error) shows up here, not 10 minutes later.
for _ in $(seq 1 12); do
    sleep 5
    [[ $(bg_state fa2) == running ]] || break
done
state=$(bg_state fa2)
echo "fa2 state after $(bg_elapsed_s fa2) s: $state"
tail -n 25 "$RUN/bg/fa2/output.log" | sed 's/^/    | /'
ps -eo pid,etimes,pcpu,rss,args --sort=-pcpu | grep -E 'nvcc|cicc|ptxas|ninja|pip|attnforge' | grep -v grep | head -8 \
    > "$STEP_DIR/processes.txt"
echo "busy compiler processes: $(grep -c -E 'cicc|ptxas|nvcc' "$STEP_DIR/processes.txt")"
[[ $state == running || $state == done:0 ]] || FAILED_STEPS+=("fa2-build($state)")
finish
[[ $state == running || $state == done:0 ]]
