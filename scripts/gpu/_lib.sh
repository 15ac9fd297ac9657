# Shared helpers for scripts/gpu/run.sh (sourced, never run). See scripts/gpu/README.md.
#
# Layout on the GPU machine (everything under /tmp survives between calls while the machine stays warm):
#   /tmp/wh        the offline wheelhouse (run.sh `stage` fills it from the carried batches carry/c1..c3)
#   /tmp/afvenv    the virtual environment attnforge and the backends are installed into (run.sh `setup`)
#   /tmp/afhome    ATTNFORGE_HOME: the artifact cache and the verify/bench records
#   /tmp/afrun     every output and log of every step, one folder per script; steps.tsv is the running summary
#   $OUT           what comes back from the call: afrun.tar.gz (all of /tmp/afrun), summary.txt, and at most a
#                  few headline files (the device returns at most 8 files)
# A step that fails is recorded (rc, duration) and the script goes on to the next step.

set -uo pipefail

AF_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$AF_ROOT" || exit 2
OUT=${OUT:-/tmp/af-out}
RUN=${AF_RUN:-/tmp/afrun}
WH=${AF_WH:-/tmp/wh}
VENV=${AF_VENV:-/tmp/afvenv}
TAIL_LINES=${TAIL_LINES:-12}
export ATTNFORGE_HOME=${ATTNFORGE_HOME:-/tmp/afhome}
export PYTHONUNBUFFERED=1
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_RETRIES=0 PIP_TIMEOUT=5 PIP_NO_CACHE_DIR=1
export COLUMNS=${COLUMNS:-150}
# The device has no network: the shipped wheel sources (GitHub, download.pytorch.org) would only time out.
# prebuilt_route.py turns them back on, pointed at its own stand-in server.
export ATTNFORGE_WHEEL_SOURCES=${ATTNFORGE_WHEEL_SOURCES:-off}
mkdir -p "$OUT" "$RUN" "$WH" "$ATTNFORGE_HOME"

# The interpreter that holds torch (the image's python3, itself a venv at /opt/torch/.venv), found before our
# venv goes first on PATH.
if [[ -z "${AF_OUTER_PY:-}" ]]; then
    AF_OUTER_PY=$(command -v python3)
    case "$AF_OUTER_PY" in "$VENV"/*) AF_OUTER_PY=$(cat "$RUN/outer_python" 2>/dev/null || echo python3) ;; esac
fi
export AF_OUTER_PY
[[ -d /usr/local/cuda/bin ]] && export PATH="$PATH:/usr/local/cuda/bin"
if [[ -x "$VENV/bin/python" ]]; then
    export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH"
fi

SCRIPT_NAME=$(basename "${0%.sh}")
STEP_DIR="$RUN/$SCRIPT_NAME"
mkdir -p "$STEP_DIR"
SCRIPT_T0=$(date +%s)
STEPS_START=$(( $( (wc -l < "$RUN/steps.tsv") 2>/dev/null || echo 0) + 1 ))
FAILED_STEPS=()

# The call's clock: start every device command with `export AF_CALL_T0=$(date +%s);` so each script knows how
# much of the call is left (a command may run 600 s; AF_CALL_BUDGET_S leaves a margin for the transfers back).
AF_CALL_T0=${AF_CALL_T0:-$SCRIPT_T0}
AF_CALL_BUDGET_S=${AF_CALL_BUDGET_S:-560}

now_s() { date +%s.%N; }

# call_left_s: seconds left of this call's budget.
call_left_s() { echo $(( AF_CALL_BUDGET_S - ($(date +%s) - AF_CALL_T0) )); }

# need_call_time SECONDS WHAT: false (and a note) when the call has less than SECONDS left: the stage skips it.
need_call_time() {
    local left
    left=$(call_left_s)
    if (( left < $1 )); then
        note "skipped $2: ${left}s left in this call, it needs ~$1s: run it first in the next call"
        return 1
    fi
}

# step NAME LIMIT_S CMD...: run CMD under a time limit, log to $STEP_DIR/NAME.log, record rc and duration.
step() {
    local name=$1 limit=$2
    shift 2
    local log="$STEP_DIR/$name.log" t0 t1 rc dur
    t0=$(now_s)
    echo "=== [$SCRIPT_NAME/$name] $*"
    local cmd="$*"
    { echo "# ${cmd//$'\n'/ }"; echo "# started $(date -u +%FT%TZ)"; } > "$log"
    timeout --kill-after=15 "$limit" "$@" >> "$log" 2>&1
    rc=$?
    t1=$(now_s)
    dur=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    echo "# rc=$rc duration_s=$dur" >> "$log"
    tail -n "$TAIL_LINES" "$log" | sed 's/^/    /'
    [[ $rc -eq 124 || $rc -eq 137 ]] && echo "    (timed out after ${limit}s)"
    printf '%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$SCRIPT_NAME" "$name" "$rc" "$dur" >> "$RUN/steps.tsv"
    [[ $rc -ne 0 ]] && FAILED_STEPS+=("$name(rc=$rc)")
    return $rc
}

# note TEXT: a line in this script's notes and in the summary.
note() {
    echo "  > $*"
    printf '%s\t%s\tnote\t-\t-\t%s\n' "$(date -u +%FT%TZ)" "$SCRIPT_NAME" "$*" >> "$RUN/steps.tsv"
}

# json_step NAME LIMIT_S CMD...: like step, but stdout alone goes to $STEP_DIR/NAME.json (stderr to NAME.log).
json_step() {
    local name=$1 limit=$2
    shift 2
    local t0 t1 rc dur
    t0=$(now_s)
    echo "=== [$SCRIPT_NAME/$name] $* > $name.json"
    timeout --kill-after=15 "$limit" "$@" > "$STEP_DIR/$name.json" 2> "$STEP_DIR/$name.log"
    rc=$?
    t1=$(now_s)
    dur=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    echo "# rc=$rc duration_s=$dur" >> "$STEP_DIR/$name.log"
    tail -n 4 "$STEP_DIR/$name.log" | sed 's/^/    /'
    printf '%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$SCRIPT_NAME" "$name" "$rc" "$dur" >> "$RUN/steps.tsv"
    [[ $rc -ne 0 ]] && FAILED_STEPS+=("$name(rc=$rc)")
    return $rc
}

# have_venv: the venv from the setup stage exists and attnforge runs from it.
have_venv() { [[ -x "$VENV/bin/attnforge" ]]; }

# ensure_attnforge: the editable install points at this checkout (the repo copy may move between calls).
ensure_attnforge() {
    have_venv || { echo "error: $VENV/bin/attnforge missing: run the setup stage first (scripts/gpu/run.sh setup)"; return 1; }
    local where
    [[ -x "$VENV/bin/python" ]] && export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH"
    where=$("$VENV/bin/python" -c 'import attnforge, os; print(os.path.realpath(attnforge.__file__))' 2>/dev/null)
    if [[ "$where" != "$AF_ROOT"/src/* ]]; then
        echo "attnforge imports from '${where:-nowhere}', not $AF_ROOT/src: pointing it here again"
        local fallback
        fallback=$(ls "$VENV"/lib/python3*/site-packages/attnforge_src_fallback.pth 2>/dev/null)
        if [[ -n $fallback ]]; then
            echo "$AF_ROOT/src" > "$fallback"
        else
            "$VENV/bin/python" -m pip install -q --no-index --find-links "$WH" --no-build-isolation --no-deps -e "$AF_ROOT"
        fi
    fi
}

# finish [HEADLINE_FILE...]: summary on stdout (the call's output tail) and the outputs into $OUT.
finish() {
    local f
    # The device returns at most 8 files: keep two for afrun.tar.gz and summary.txt (the tarball has everything).
    for f in "$@"; do
        [[ -f "$f" ]] || continue
        if [[ -f "$OUT/$(basename "$f")" ]] || (( $(find "$OUT" -maxdepth 1 -type f | wc -l) < 6 )); then
            cp "$f" "$OUT/"
        fi
    done
    {
        echo "# attnforge GPU run: every step so far (utc, script, step, rc, duration_s[, note])"
        cat "$RUN/steps.tsv" 2>/dev/null
    } > "$OUT/summary.txt"
    # Everything under /tmp/afrun, minus anything over 8 MB (a wheel would never belong here).
    (cd "$(dirname "$RUN")" && find "$(basename "$RUN")" -type f -size -8M -print0 \
        | tar --null -czf "$OUT/afrun.tar.gz" -T - 2>/dev/null)
    echo
    echo "----- $SCRIPT_NAME: $(( $(date +%s) - SCRIPT_T0 )) s -----"
    tail -n +"$STEPS_START" "$RUN/steps.tsv" | awk -F'\t' '{ printf "  %-28s rc=%-4s %8s s  %s\n", $3, $4, $5, $6 }'
    if ((${#FAILED_STEPS[@]})); then echo "  FAILED: ${FAILED_STEPS[*]}"; else echo "  all steps ok"; fi
    echo "  outputs: \$OUT/afrun.tar.gz (all of $RUN), \$OUT/summary.txt $(for f in "$@"; do [[ -f "$f" ]] && printf '$OUT/%s ' "$(basename "$f")"; done)"
}
