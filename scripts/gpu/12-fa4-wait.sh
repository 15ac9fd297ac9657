#!/usr/bin/env bash
# 12-fa4-wait.sh: FlashAttention-4 from the carried wheels, then wait (up to WAIT_S) for the background builds.
# FA4's requirements go in first with --no-deps: nvidia-cutlass-dsl 4.8.1 names the cu12 libs with no marker,
# but a 13.x driver loads only the cu13 flavour, so only that one travels; `attnforge install` then finds every
# requirement present and installs the FA4 wheel itself (hash-recorded, verified in a child process).
source "$(dirname "$0")/_lib.sh"
ensure_attnforge || { finish; exit 1; }
if ! python -c 'import flash_attn.cute' 2>/dev/null; then
    step fa4-requirements 300 python -m pip install -q --no-index --no-deps "$WH"/quack_kernels-*.whl \
        "$WH"/apache_tvm_ffi-*.whl "$WH"/torch_c_dlpack_ext-*.whl "$WH"/nvidia_cutlass_dsl-4*.whl \
        "$WH"/nvidia_cutlass_dsl_libs_core-*.whl "$WH"/nvidia_cutlass_dsl_libs_base-*.whl \
        "$WH"/nvidia_cutlass_dsl_libs_cu13-*.whl
    step fa4-install 420 attnforge install flash-attn-4 --find-links "$WH" --offline --no-verify
fi
WAIT_S=${WAIT_S:-300}
t0=$(date +%s)
while [[ $(bg_state builds) == running ]] && (( $(date +%s) - t0 < WAIT_S )); do sleep 10; done
note "builds: $(bg_state builds) after $(bg_elapsed_s builds)s; $(tr '\n' ' ' < "$RUN/bg/times.tsv" 2>/dev/null)"
cp "$RUN/bg/fa3.log" "$STEP_DIR/fa3-install.log" 2>/dev/null
cp "$RUN/bg/sage.log" "$STEP_DIR/sage-install.log" 2>/dev/null
finish "$RUN/bg/times.tsv"
