#!/usr/bin/env bash
# status.sh: where the run stands, in a dozen lines. End every device call with it: the reply's output tail is
# what is read first, and it shows the background jobs, the wheelhouse, the installed backends and every step
# that failed during this call. Writes nothing to $OUT.
source "$(dirname "$0")/_lib.sh"

echo
echo "===== status at $(date -u +%FT%TZ): $(( $(date +%s) - AF_CALL_T0 ))s into this call ====="
for job in fa2 bench; do
    state=$(bg_state "$job")
    [[ $state == absent ]] && continue
    extra=""
    if [[ $job == fa2 ]]; then
        extra=" $(grep -ao '\[[0-9]\+/[0-9]\+\]' "$RUN/bg/fa2/output.log" 2>/dev/null | tail -1)"
        [[ -f "$RUN/04-watch/progress.txt" ]] && extra+=" (last watch: $(tail -1 "$RUN/04-watch/progress.txt" | cut -d' ' -f2-))"
    fi
    echo "  $job: $state after $(bg_elapsed_s "$job")s$extra"
done
manifest=$(ls carry/b*/MANIFEST.txt scripts/gpu/MANIFEST.txt 2>/dev/null | head -1)
if [[ -n $manifest ]]; then
    want=$(awk -F'\t' '$1 == "file" || $1 == "split" { print $2 }' "$manifest")
    have=0
    missing=()
    for f in $want; do if [[ -f "$WH/$f" ]]; then have=$((have + 1)); else missing+=("${f%%-[0-9]*}"); fi; done
    echo "  wheelhouse: $have/$(wc -w <<< "$want") files${missing[*]:+; missing: ${missing[*]}}"
fi
if have_venv; then
    echo "  $(attnforge --version 2>&1 | tail -1); installed: $(python -m pip list 2>/dev/null \
        | awk 'tolower($1) ~ /^(flash-attn|flash-attn-4|sageattention|xformers|nvidia-cutlass-dsl)$/ { printf "%s %s, ", $1, $2 }')"
fi
since=$(date -u -d "@$AF_CALL_T0" +%FT%TZ)
failed=$(awk -F'\t' -v t="$since" '$1 >= t && $3 != "note" && $4 != "0" { printf "%s/%s(rc=%s) ", $2, $3, $4 }' \
    "$RUN/steps.tsv" 2>/dev/null)
echo "  failed in this call: ${failed:-none}"
awk -F'\t' -v t="$since" '$1 >= t && $3 == "note" { print "  note: " $6 }' "$RUN/steps.tsv" 2>/dev/null | tail -6
