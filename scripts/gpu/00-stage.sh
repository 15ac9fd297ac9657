#!/usr/bin/env bash
# 00-stage.sh BATCH...: copy carried batches (carry/b1 ...) into the wheelhouse /tmp/wh, checking every sha256
# against the batch's MANIFEST.txt and joining split wheels once all their parts have arrived.
# The call must carry the batch: run(carry=["carry/b1"], command="bash scripts/gpu/00-stage.sh b1 && ...").
source "$(dirname "$0")/_lib.sh"

(($#)) || { echo "usage: $0 BATCH... (e.g. b1)"; exit 2; }
rc_all=0
for batch in "$@"; do
    dir=$batch
    [[ -d "$dir" ]] || dir="carry/$batch"
    step "stage-$(basename "$dir")" 300 "$AF_OUTER_PY" scripts/gpu/stage.py "$dir" "$WH" || rc_all=1
done
ls -la "$WH" > "$STEP_DIR/wheelhouse-listing.txt"
finish
exit $rc_all
