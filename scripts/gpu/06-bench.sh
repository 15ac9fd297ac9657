#!/usr/bin/env bash
# 06-bench.sh [start] [wait] [check]: `attnforge bench --json --plot`, then check_dispatch.py on the bench shapes.
# With no argument: start, wait, check. The bench runs in its own process session, so a grid longer than one
# call survives: if `wait` runs out of time, call `06-bench.sh wait check` at once.
#
#   BENCH_ARGS    extra arguments for `attnforge bench` (default: none = its default grid). To fit one call,
#                 restrict the grid, e.g. BENCH_ARGS="--causal off --mode fwd" (check `attnforge bench --help`
#                 on the merged code first: the options are those of issue 7).
#   BENCH_WAIT_S  how long `wait` waits at most (default 480 s; it also stops 30 s before the call's budget)
#   CHECK_ARGS    extra arguments for check_dispatch.py (e.g. "--max-shapes 12 --no-retime")
#   BENCH_FORCE=1 start even while the FA2 build runs (it refuses otherwise: the compile jobs skew timings)
source "$(dirname "$0")/_lib.sh"
ensure_attnforge || { finish; exit 1; }
(($#)) || set -- start wait check
wait_s=${BENCH_WAIT_S:-480}
bench_args=${BENCH_ARGS:-}

for what in "$@"; do
    case $what in
    start)
        step bench-help 60 attnforge bench --help
        if [[ $(bg_state bench) == running ]]; then note "bench already running"; continue; fi
        if [[ $(bg_state fa2) == running && -z ${BENCH_FORCE:-} ]]; then
            note "bench not started: the FA2 build is still running (16 compile jobs would skew the timings)"
            FAILED_STEPS+=("bench(not started)")
            continue
        fi
        rm -f "$STEP_DIR/bench.json" "$STEP_DIR/bench.png"
        # shellcheck disable=SC2086 # BENCH_ARGS is a list of options on purpose
        bg_start bench bash -c "attnforge bench $bench_args --json --plot '$STEP_DIR/bench.png' > '$STEP_DIR/bench.json' 2> '$STEP_DIR/bench-stderr.log'"
        note "bench started: attnforge bench $bench_args --json --plot bench.png"
        ;;
    wait)
        [[ $(bg_state bench) == absent ]] && { note "nothing to wait for: no bench was started"; continue; }
        last=-999
        while [[ $(bg_state bench) == running ]] && (( $(time_left_s "$wait_s") > 0 && $(call_left_s) > 30 )); do
            e=$(bg_elapsed_s bench)
            if (( e - last >= 30 )); then
                echo "bench: ${e}s, $(tail -c 300 "$STEP_DIR/bench-stderr.log" 2>/dev/null | tr '\r' '\n' | grep -v '^\s*$' | tail -1)"
                last=$e
            fi
            sleep 5
        done
        state=$(bg_state bench)
        note "bench: $state after $(bg_elapsed_s bench)s"
        if [[ $state == running ]]; then
            finish "$STEP_DIR/bench.png"
            echo "NEXT: bash scripts/gpu/06-bench.sh wait check (at once: the bench is still running)"
            exit 3
        fi
        [[ $state == done:0 ]] || FAILED_STEPS+=("bench($state)")
        tail -n 20 "$STEP_DIR/bench-stderr.log" 2>/dev/null | sed 's/^/    | /'
        python - "$STEP_DIR/bench.json" <<'EOF' || true
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except Exception as exc:
    sys.exit(f"  bench JSON unreadable: {exc}")
rows = doc.get("rows") or doc.get("results") or doc.get("records") or []
print(f"  bench JSON: {len(rows)} rows; keys {sorted(doc)[:12]}")
EOF
        ;;
    check)
        if [[ $(bg_state bench) != done:* ]]; then note "check skipped: bench $(bg_state bench)"; continue; fi
        need_call_time 90 "check_dispatch.py"
        limit=${CHECK_TIMEOUT_S:-$(( $(call_left_s) - 10 ))}
        # shellcheck disable=SC2086
        step check-dispatch "$limit" python scripts/gpu/check_dispatch.py --out "$STEP_DIR/dispatch.json" ${CHECK_ARGS:-}
        ;;
    *) echo "unknown part '$what' (start, wait, check)"; exit 2 ;;
    esac
done
finish "$STEP_DIR/bench.png" "$STEP_DIR/bench.json" "$STEP_DIR/dispatch.json"
