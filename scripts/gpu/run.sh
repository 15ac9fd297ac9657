#!/usr/bin/env bash
# run.sh STAGE...: the one staged GPU runner (issue 23 item 5, issue 25). Stages, in the order a run needs them:
#   stage     carried batches carry/c1..c3 -> /tmp/wh (sha256 checked, split files joined, the cu13 libs re-zipped)
#   setup     venv on the image's torch (bridge .pth), attnforge editable from this checkout, carried deps,
#             transformers 5.23 + diffusers 0.42.1 (each when staged; diffusers may come later); no network
#   install   slim FA3 + SageAttention from the early call's wheels (install --find-links --offline: the
#             cache/wheel route and its verify; source build only if no wheel), FA4 from its wheels
#   verify    attnforge verify --json, every backend (flex with its features)
#   check     grid_check.py in a fresh ATTNFORGE_HOME holding only the verify records (no bench): measure on
#             first use (CHECK_LABEL=check-after after bench keeps the bench records)
#   bench     attnforge bench --shapes grid --json (+ diffusion if time)
#   features  features_check.py: the Gemma-2-style call vs FlexAttention called directly
#   models    models_gpu.py: tiny Gemma-2, Llama (transformers), Flux (diffusers) through the integrations
#   decode    decode_probe.py: a padded decode step's SDPA calls, packed GQA vs enable_gqa, and generate
#   e2e       models_e2e.py: real layer shapes (Llama-3-8B, Qwen2.5, Gemma-2-9B, Flux-dev, Wan-2.1) vs the defaults
#   stall     stall_workload.py twice (two processes, one home): longest call after warm-up, compiles in the second
#   overhead  overhead.py: per-call overhead over SDPA, FA3, FA4 called directly
#   layout    layout_flush.py: short kernels on bshd vs bhsd views, L2 flush vs none, host µs per call
#   cachehit  pip uninstall + attnforge install (cache hit) vs plain pip from a cache export
#   route     prebuilt_route.py: the wheel route through a local GitHub API stand-in, with its arch check
#   pytest    the suite's GPU-marked tests (dispatcher, FlexAttention features); PYTEST_ARGS narrows them
#   maskreuse mask_reuse.py: layers sharing one padded mask, SDPA direct vs attention() (the kept mask preparation)
#   fleet     Ray from the carried wheels, `fleet verify` / `fleet bench` / `fleet report` on a local one-node Ray
#   abi       a second venv on the same home: `attnforge install flash-attn-3` a cache hit (no compile), one call
# Every stage is time-boxed from AF_CALL_T0 (export it first: a call is 600 s, AF_CALL_BUDGET_S=560 by default),
# records rc/duration/log of every step and goes on after a failure; all under /tmp/afrun; each call ends with
# $OUT/afrun.tar.gz and $OUT/summary.txt. See scripts/gpu/README.md for the plan of calls.
source "$(dirname "$0")/_lib.sh"
S=$AF_ROOT/scripts/gpu
SRC=${AF_SRC:-/tmp/src}
mkdir -p "$SRC"

stage_stage() {
    local b f
    for b in c1 c2 c3 ${AF_BATCHES:-}; do
        [[ -d carry/$b ]] || continue
        step "sha-$b" 120 bash -c "cd carry/$b && sha256sum --check --quiet SHA256SUMS" || note "batch $b: sha256 mismatch"
        for f in carry/"$b"/*; do
            case $f in *.tar.gz) tar xzf "$f" -C "$SRC" ;; */SHA256SUMS) ;; *) cp -n "$f" "$WH/" ;; esac
        done
    done
    if [[ -f $WH/JOIN && ! -f $WH/cu13.done ]]; then
        read -r _ name sha parts < "$WH/JOIN"
        if (cd "$WH" && ls $parts >/dev/null 2>&1); then
            (cd "$WH" && cat $parts > "$name")
            if [[ $(sha256sum < "$WH/$name" | cut -d' ' -f1) == "$sha" ]]; then
                step cu13-rezip 300 "${AF_OUTER_PY}" "$S/rezip.py" "$WH/$name" \
                    "$WH/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl" \
                    && touch "$WH/cu13.done" && rm -f "$WH"/cu13.tree.tar.xz*
            else note "joined $name: sha256 mismatch"; fi
        else note "cu13 libs incomplete: $(cd "$WH" && ls cu13.tree.tar.xz.* 2>/dev/null | tr '\n' ' ')"; fi
    fi
    local j
    for j in "$WH"/JOIN-*; do  # other split files (the ray wheel): "JOIN name sha256 part..." once all parts are here
        [[ -f $j ]] || continue
        read -r _ name sha parts < "$j"
        [[ -f $WH/$name ]] && continue
        if (cd "$WH" && ls $parts >/dev/null 2>&1); then
            (cd "$WH" && cat $parts > "$name.tmp")
            if [[ $(sha256sum < "$WH/$name.tmp" | cut -d' ' -f1) == "$sha" ]]; then mv "$WH/$name.tmp" "$WH/$name"
            else note "joined $name: sha256 mismatch"; rm -f "$WH/$name.tmp"; fi
        else note "$name incomplete: waiting for the other parts"; fi
    done
    ls -la "$WH" "$SRC" > "$STEP_DIR/staged.txt" 2>&1
}

stage_setup() {
    echo "$AF_OUTER_PY" > "$RUN/outer_python"
    if [[ ! -x $VENV/bin/python ]]; then
        step make-venv 120 "$AF_OUTER_PY" -m venv --system-site-packages "$VENV" \
            || step make-venv-without-pip 120 "$AF_OUTER_PY" -m venv --system-site-packages --without-pip "$VENV"
        # the image's python3 is itself a venv: a nested venv sees the *base* site-packages; bridge the outer one
        local site; site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        "$AF_OUTER_PY" -c 'import site, sys
p = site.getsitepackages()
open(sys.argv[1], "w").write("\n".join([f"import site; site.addsitedir({x!r})" for x in p] + p) + "\n")' \
            "$site/zz_attnforge_outer_env.pth"
    fi
    export VIRTUAL_ENV=$VENV PATH=$VENV/bin:$PATH
    step venv-sees-torch 120 python -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())'
    step deps 120 python -m pip install -q --no-index --no-deps --find-links "$WH" platformdirs pyelftools
    if ! have_venv; then
        step attnforge 300 python -m pip install -q --no-index --no-deps --no-build-isolation -e "$AF_ROOT" || {
            step setuptools 120 python -m pip install -q --no-index --find-links "$WH" "setuptools>=77"
            step attnforge-retry 300 python -m pip install -q --no-index --no-deps --no-build-isolation -e "$AF_ROOT"; }
    fi
    ensure_attnforge
    step attnforge-version 30 attnforge --version
    if ls "$WH"/transformers-5.23*.whl >/dev/null 2>&1 && ! python -c 'import transformers, sys; sys.exit(transformers.__version__ < "5.23")' 2>/dev/null; then
        step hf-stack 300 python -m pip install -q --no-index --no-deps "$WH"/huggingface_hub-*.whl "$WH"/tokenizers-*.whl \
            "$WH"/safetensors-*.whl "$WH"/importlib_metadata-*.whl "$WH"/transformers-*.whl
        step hf-import 120 python -c 'import transformers; print(transformers.__version__)'
    fi
    # diffusers may come in a later call's batch (d3): installed whenever it is staged and not yet there
    if ls "$WH"/diffusers-*.whl >/dev/null 2>&1 && ! python -c 'import diffusers' 2>/dev/null; then
        step diffusers 120 python -m pip install -q --no-index --no-deps "$WH"/diffusers-*.whl
        step diffusers-import 120 python -c 'import diffusers; print(diffusers.__version__)'
    fi
    step probe 120 attnforge probe --json
}

# timed STEP LIMIT CMD...: a step whose duration lands in $STEP_DIR/times.tsv (the install figures)
timed() { local t0=$SECONDS; step "$@"; local rc=$?; printf '%s\t%s\t%s\n' "$1" "$rc" $((SECONDS - t0)) >> "$STEP_DIR/times.tsv"; return $rc; }

stage_install() {
    ensure_attnforge || return 1
    # AF_FA3_ABI=torch: FA3 bound to this torch (--abi torch: flash_api.cpp through the catalog's edit), not the
    # stable ABI its setup.py picks for torch >= 2.9 (4-7 us less host time a call, the eighteenth session)
    local fa3=(flash-attn-3 --head-dim 64,128,256 --dtype bf16 --features split ${AF_FA3_ABI:+--abi "$AF_FA3_ABI"})
    # AF_SKIP_FA3=1: not FA3 in this call (SageAttention's source build alone on every core, the thirty-eighth session)
    [[ ${AF_SKIP_FA3:-0} == 1 ]] || python -c 'import flash_attn_interface' 2>/dev/null || {
        timed fa3-wheel 300 attnforge install "${fa3[@]}" --find-links "$WH" --offline -v \
        || timed fa3-source 560 attnforge install "${fa3[@]}" --source "$SRC/flash-attention#subdirectory=hopper" --offline -v; }
    [[ ${AF_SKIP_SAGE:-0} == 1 ]] || python -c 'import sageattention' 2>/dev/null || {
        timed sage-wheel 300 attnforge install sageattention-2 --find-links "$WH" --offline -v \
        || timed sage-source 560 attnforge install sageattention-2 --source "$SRC/SageAttention" --offline -v; }
    if ! python -c 'import flash_attn.cute' 2>/dev/null; then
        if [[ -f $WH/cu13.done ]]; then
            # nvidia-cutlass-dsl names the cu12 libs with no marker; a 13.x driver loads only cu13: --no-deps
            timed fa4-requirements 300 python -m pip install -q --no-index --no-deps "$WH"/quack_kernels-*.whl \
                "$WH"/apache_tvm_ffi-*.whl "$WH"/torch_c_dlpack_ext-*.whl "$WH"/nvidia_cutlass_dsl-4*.whl \
                "$WH"/nvidia_cutlass_dsl_libs_core-*.whl "$WH"/nvidia_cutlass_dsl_libs_base-*.whl \
                "$WH"/nvidia_cutlass_dsl_libs_cu13-*.whl
            timed fa4 420 attnforge install flash-attn-4 --find-links "$WH" --offline -v
        else note "FA4 waits for the cu13 libs (carry c2)"; fi
    fi
    cp "$STEP_DIR/times.tsv" "$STEP_DIR/install-times.tsv" 2>/dev/null
}

stage_verify() {
    ensure_attnforge || return 1
    # shellcheck disable=SC2086  # VERIFY_BACKENDS: a space-separated list (default: every backend)
    json_step verify-all "$(budget 300)" attnforge verify ${VERIFY_BACKENDS:-} --json
}

# budget MAX: MAX seconds, or what the call has left minus a margin for the rest of the call
budget() { local left=$(( $(call_left_s) - ${2:-40} )); (( left < $1 )) && echo $(( left > 10 ? left : 10 )) || echo "$1"; }

stage_check() {
    ensure_attnforge || return 1
    local label=${CHECK_LABEL:-check}
    local home=$RUN/$label-home
    if [[ $label == check ]]; then  # fresh records: only what verify wrote, nothing bench or an earlier check did
        mkdir -p "$home"
        "$AF_OUTER_PY" "$S/fresh_home.py" "$ATTNFORGE_HOME" "$home" > "$STEP_DIR/fresh-home.txt" 2>&1
    else home=$ATTNFORGE_HOME; fi
    need_call_time 60 "$label" || return 0
    local limit; limit=$(budget "${CHECK_S:-420}")
    ATTNFORGE_HOME=$home step "$label" "$limit" python "$S/grid_check.py" --out "$STEP_DIR/$label.json" \
        --budget-s $(( limit - 40 )) ${GRID_ARGS:-}
}

stage_bench() {
    ensure_attnforge || return 1
    need_call_time 90 bench || return 0
    json_step bench-grid "$(budget "${BENCH_S:-240}" 120)" attnforge bench --shapes grid --json
    (( $(call_left_s) > ${BENCH_DIFFUSION_IF_LEFT_S:-400} )) && json_step bench-diffusion "$(budget 150 150)" attnforge bench --shapes diffusion --json
}

stage_features() {
    ensure_attnforge || return 1
    step features "$(budget 180)" python "$S/features_check.py" --out "$STEP_DIR/features.json" ${FEATURES_ARGS:-}
    # the lead's adapter-level check (scripts/flex_features.py, on main since 804af8a), when present and time allows
    [[ -f $AF_ROOT/scripts/flex_features.py ]] && (( $(call_left_s) > 200 )) && \
        json_step flex-adapter "$(budget 120)" env PYTHONPATH="$AF_ROOT/src" python "$AF_ROOT/scripts/flex_features.py" --rounds 3
}
stage_models() { ensure_attnforge && step models "$(budget 240)" python "$S/models_gpu.py" --out "$STEP_DIR/models.json" ${MODELS_ARGS:-}; }
# models_e2e.py: Llama-3-8B-, Qwen2.5-, Gemma-2-9B-shaped decoders (forward, train step, generate) and Flux-dev /
# Wan-2.1 blocks at real layer shapes through the integrations vs each framework's default (issue 30 item 5)
# decode_probe.py: a padded decode step's SDPA calls with and without the adapter's GQA packing, and generate
stage_decode() { ensure_attnforge && step decode "$(budget 300)" python "$S/decode_probe.py" --out "$STEP_DIR/decode.json" ${DECODE_ARGS:-}; }
stage_e2e() { ensure_attnforge && step e2e "$(budget 400)" python "$S/models_e2e.py" --out "$STEP_DIR/models_e2e.json" ${E2E_ARGS:-}; }
# stall_workload.py twice on one fresh home, in two processes: the longest call after warm-up, and the second
# process's compiles (0 expected: the compile caches live under ATTNFORGE_HOME)
stage_stall() {
    ensure_attnforge || return 1
    local home=$RUN/stall-home; mkdir -p "$home"
    "$AF_OUTER_PY" "$S/fresh_home.py" "$ATTNFORGE_HOME" "$home" > "$STEP_DIR/fresh-home.txt" 2>&1
    ATTNFORGE_HOME=$home step stall-1 "$(budget "${STALL1_S:-300}" 60)" python "$S/stall_workload.py" --out "$STEP_DIR/stall-1.json" ${STALL_ARGS:-}
    ATTNFORGE_HOME=$home step stall-2 "$(budget "${STALL2_S:-200}")" python "$S/stall_workload.py" --out "$STEP_DIR/stall-2.json" ${STALL_ARGS:-}
}
stage_overhead() { ensure_attnforge && step overhead "$(budget 200)" python "$S/overhead.py" --out "$STEP_DIR/overhead.json" ${OVERHEAD_ARGS:-}; }
stage_layout() { ensure_attnforge && step layout "$(budget 150)" python "$S/layout_flush.py" --out "$STEP_DIR/layout.json" ${LAYOUT_ARGS:-}; }

# the FA3 request as `install` made it on this machine: from the carried source tree (keyed by its content hash)
# when it was built here, else from the carried wheel
fa3_request() {
    # the request install made (AF_FA3_ABI=torch: the build bound to this torch): another request is another build
    local fa3=(flash-attn-3 --head-dim 64,128,256 --dtype bf16 --features split --offline ${AF_FA3_ABI:+--abi "$AF_FA3_ABI"})
    if [[ -d $SRC/flash-attention/hopper ]]; then fa3+=(--source "$SRC/flash-attention#subdirectory=hopper")
    else fa3+=(--find-links "$WH"); fi
    printf '%s\n' "${fa3[@]}"
}

stage_cachehit() {
    ensure_attnforge || return 1
    local fa3; mapfile -t fa3 < <(fa3_request)
    step uninstall 120 python -m pip uninstall -y flash-attn-3
    timed cache-hit-install "$(budget 120)" attnforge install "${fa3[@]}" --no-verify
    step export 120 attnforge cache export /tmp/afexport
    step uninstall-2 120 python -m pip uninstall -y flash-attn-3
    timed plain-pip "$(budget 120)" python -m pip install --no-deps --index-url file:///tmp/afexport/simple flash-attn-3
    step import-check 120 python -c 'import flash_attn_interface, torch; q = torch.randn(1, 128, 2, 128, device="cuda", dtype=torch.bfloat16); o = flash_attn_interface.flash_attn_func(q, q, q); o = o[0] if isinstance(o, tuple) else o; print(o.shape, torch.isfinite(o).all().item())'
}

# the wheels this machine built (the cache's export), split into <= 15 MB parts under $OUT/wheels (a device call
# returns files of <= 16 MB): the next machine installs them with --find-links instead of building again
stage_pullwheels() {
    ensure_attnforge || return 1
    step export-built 120 attnforge cache export /tmp/afexport-built
    mkdir -p "$OUT/wheels"
    local w
    for w in $(find /tmp/afexport-built -name '*.whl'); do
        local base; base=$(basename "$w"); base=${base//+/__plus__}  # a name with '+' does not come back
        (cd "$OUT/wheels" && split -b 15M -d -a 1 "$w" "$base.part" && echo "$(sha256sum < "$w" | cut -d' ' -f1)  $(basename "$w")" >> SHA256SUMS)
    done
    ls -la "$OUT/wheels" > "$STEP_DIR/pulled.txt"
}
# the fleet verbs on this one GPU through a local Ray (issue 34 item 6): Ray from the carried wheels, then
# `fleet verify` and `fleet bench` (their tasks ask for num_gpus=1) against the single-machine verbs' results
stage_fleet() {
    ensure_attnforge || return 1
    [[ -f $WH/ray-2.60.0.tree.tar.xz && ! -f $WH/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl ]] && step ray-rezip 300 \
        "$AF_OUTER_PY" "$S/rezip.py" "$WH/ray-2.60.0.tree.tar.xz" "$WH/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl"
    python -c 'import ray' 2>/dev/null || step ray-install 200 python -m pip install -q --no-index --no-deps \
        "$WH"/ray-*.whl "$WH"/msgpack-*.whl "$WH"/jsonschema-*.whl "$WH"/jsonschema_specifications-*.whl \
        "$WH"/referencing-*.whl "$WH"/rpds_py-*.whl "$WH"/attrs-*.whl "$WH"/protobuf-*.whl
    step ray-import 60 python -c 'import ray; print(ray.__version__)' || return 1
    json_step fleet-verify "$(budget 300 120)" attnforge fleet verify ${FLEET_VERIFY:-flash-attn-3 sdpa-cudnn} --json
    json_step fleet-bench "$(budget 240 30)" attnforge fleet bench ${FLEET_BENCH:-flash-attn-3} --json
    json_step fleet-report 60 attnforge fleet report --json
    python -c 'import ray; ray.shutdown()' 2>/dev/null; ray stop --force > /dev/null 2>&1 || true
}

# a second interpreter environment (its own venv on the same torch) and the same ATTNFORGE_HOME: `attnforge
# install flash-attn-3` there must be a cache hit of the stable-ABI wheel this machine built (no compile), verified
stage_abi() {
    ensure_attnforge || return 1
    local v2=/tmp/afvenv2
    if [[ ! -x $v2/bin/python ]]; then
        step venv2 120 "$AF_OUTER_PY" -m venv --system-site-packages "$v2"
        local site; site=$("$v2/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        cp "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_attnforge_outer_env.pth" "$site/"
        step venv2-deps 120 "$v2/bin/python" -m pip install -q --no-index --no-deps --find-links "$WH" platformdirs pyelftools
        step venv2-attnforge 300 "$v2/bin/python" -m pip install -q --no-index --no-deps --no-build-isolation -e "$AF_ROOT" || {
            step venv2-setuptools 120 "$v2/bin/python" -m pip install -q --no-index --find-links "$WH" "setuptools>=77"
            step venv2-attnforge-retry 300 "$v2/bin/python" -m pip install -q --no-index --no-deps --no-build-isolation -e "$AF_ROOT"; }
    fi
    step venv2-no-fa3 30 "$v2/bin/python" -c 'import importlib.util as u, sys; print("flash_attn_interface in venv2 before:", u.find_spec("flash_attn_interface")); sys.exit(0)'
    local fa3; mapfile -t fa3 < <(fa3_request)
    timed venv2-install "$(budget 300)" env VIRTUAL_ENV=$v2 PATH=$v2/bin:$PATH "$v2/bin/attnforge" install "${fa3[@]}" -v
    step venv2-import 60 "$v2/bin/python" -c 'import flash_attn_interface, torch; q = torch.randn(1, 128, 2, 128, device="cuda", dtype=torch.bfloat16); o = flash_attn_interface.flash_attn_func(q, q, q); o = o[0] if isinstance(o, tuple) else o; print(flash_attn_interface.__file__, o.shape, torch.isfinite(o).all().item())'
}

stage_route() { ensure_attnforge && step route "$(budget 300)" python "$S/prebuilt_route.py" --out "$STEP_DIR/route.json"; }
# the GPU-marked tests of the suite (they skip on CI's CPU machine): the dispatcher and FlexAttention's features
stage_pytest() {
    ensure_attnforge || return 1
    # PYTEST_ARGS narrows it (a path::test[id], --deselect ...; `-k` cannot hold `<`), PYTEST_TB=long for a traceback;
    # PYTEST_K is one -k expression with spaces ("reduce_overhead or capture": PYTEST_ARGS is split on them)
    # its own ATTNFORGE_HOME: the tests' guard against writing the user's real home reads any change there, and a
    # build running beside the tests (call 1's FA3 source build) writes /tmp/afhome (the 2026-11-29 eighteenth run)
    mkdir -p "$RUN/pytest-home"
    # shellcheck disable=SC2086
    ATTNFORGE_HOME=$RUN/pytest-home step pytest-gpu "$(budget "${PYTEST_S:-150}")" python -m pytest -v --tb="${PYTEST_TB:-short}" -rf -p no:cacheprovider \
        -p no:logging -m gpu -W ignore::DeprecationWarning ${PYTEST_K:+-k "$PYTEST_K"} ${PYTEST_ARGS:-tests/dispatch/test_gpu.py tests/dispatch/test_flex_gpu.py}
}
# mask_reuse.py: four layers sharing one padded mask, SDPA direct vs attention() (kept vs redone mask preparation),
# in a home with no records and first-use measurement off, so the SDPA adapter serves as it does a masked call
stage_maskreuse() {
    ensure_attnforge || return 1
    mkdir -p "$RUN/maskreuse-home"
    ATTNFORGE_HOME=$RUN/maskreuse-home ATTNFORGE_AUTOTUNE=0 step maskreuse "$(budget 120)" \
        python "$S/mask_reuse.py" --out "$STEP_DIR/mask-reuse.json" ${MASKREUSE_ARGS:-}
}

for stage in "$@"; do
    case $stage in
        stage|setup|install|verify|check|check-after|bench|features|models|decode|e2e|stall|overhead|layout|cachehit|route|pytest|maskreuse|pullwheels|fleet|abi) ;;
        *) note "unknown stage $stage (see the header of run.sh)"; continue ;;
    esac
    if (( $(call_left_s) < 20 )); then note "no call time left: skipped $stage and what follows"; break; fi
    STEP_DIR=$RUN/$stage SCRIPT_NAME=$stage; mkdir -p "$STEP_DIR"
    t0=$SECONDS
    if [[ $stage == check-after ]]; then CHECK_LABEL=check-after stage_check; else "stage_$stage"; fi
    printf '%s\t%s\t(stage total)\t-\t%s\n' "$(date -u +%FT%TZ)" "$stage" $((SECONDS - t0)) >> "$RUN/steps.tsv"
done
SCRIPT_NAME=run
finish
