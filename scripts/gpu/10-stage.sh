#!/usr/bin/env bash
# 10-stage.sh BATCH...: the issue-19 run's staging (carry/b1..b3, made by make_carry19.sh here): wheels into
# /tmp/wh (sha256 checked against carry/b1/wh.sha once b1 arrived), source trees unpacked under /tmp/src, and the
# split cutlass-dsl cu13 wheel joined once its three parts are there.
source "$(dirname "$0")/_lib.sh"
SRC=${AF_SRC:-/tmp/src}
mkdir -p "$SRC"
for batch in "$@"; do
    dir=carry/$batch
    [[ -d $dir ]] || { note "batch $batch not carried"; continue; }
    [[ -d $dir/wh ]] && cp -n "$dir"/wh/* "$WH"/
    [[ -f $dir/wh.sha ]] && cp "$dir/wh.sha" "$WH/wh.sha"
    for t in "$dir"/src/*.tar.gz; do [[ -f $t ]] && tar xzf "$t" -C "$SRC"; done
done
if [[ ! -f $WH/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl ]] \
    && [[ -f $WH/cu13.partaa && -f $WH/cu13.partab && -f $WH/cu13.partac ]]; then
    cat "$WH"/cu13.part?? > "$WH/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl"
    rm -f "$WH"/cu13.part??
fi
if [[ -f $WH/wh.sha ]]; then
    step sha-check 120 bash -c "cd '$WH' && sed 's#  .*/#  #' wh.sha | sha256sum --check --ignore-missing --quiet"
fi
ls -la "$WH" "$SRC" > "$STEP_DIR/staged.txt"
finish
