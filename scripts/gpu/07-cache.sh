#!/usr/bin/env bash
# 07-cache.sh: the artifact cache for real. Uninstall flash-attn, install it again (must be a cache hit: seconds,
# not the 12-minute build), export the cache as a PEP 503 index, and install from that index with plain pip
# (the image's own python, no attnforge) into a fresh --target directory, then import and run it from there.
#
# flash-attn and flash-attn-4 both own flash_attn/cute/*: uninstalling and reinstalling flash-attn deletes and then
# overwrites FA4's copies, so when FA4 is installed its wheel is force-reinstalled at the end. Last: verify.
source "$(dirname "$0")/_lib.sh"
ensure_attnforge || { finish; exit 1; }
need_call_time 150 "the cache round trip"

fa4_before=$(python -c 'from importlib import metadata as m
try: print(m.version("flash-attn-4"))
except m.PackageNotFoundError: print("")' 2>/dev/null)
[[ -n $fa4_before ]] && note "flash-attn-4 $fa4_before is installed: it will be reinstalled after the flash-attn round trip"

step pip-uninstall-flash-attn 180 python -m pip uninstall -y flash-attn
if python -c 'import flash_attn_2_cuda' 2>/dev/null; then note "flash_attn_2_cuda still imports after uninstall"; fi

t0=$(date +%s.%N)
step reinstall-flash-attn 600 attnforge install flash-attn --find-links "$WH" --offline
rc=$?
t1=$(date +%s.%N)
dur=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
if [[ $rc -eq 0 ]] && awk -v d="$dur" 'BEGIN { exit !(d < 120) }' && grep -qi 'cache' "$STEP_DIR/reinstall-flash-attn.log"; then
    verdict="cache hit"
else
    verdict="NOT a cache hit (rc=$rc, ${dur}s; see reinstall-flash-attn.log)"
    FAILED_STEPS+=("cache-hit")
fi
note "reinstall of flash-attn: ${dur}s, $verdict"
printf 'reinstall_wall_s\t%s\nverdict\t%s\n' "$dur" "$verdict" > "$STEP_DIR/cache-hit.tsv"
step fa2-import-after-reinstall 180 python -c 'import flash_attn, flash_attn_2_cuda; print(flash_attn.__version__, flash_attn.__file__)'

step cache-list 60 attnforge cache list
json_step cache-list-json 60 attnforge cache list --json
rm -rf /tmp/export /tmp/plain
step cache-export 300 attnforge cache export /tmp/export
step export-tree 60 bash -c 'find /tmp/export -printf "%10s  %p\n" | sort -k2; for f in /tmp/export/simple/index.html /tmp/export/simple/*/index.html; do echo "== $f"; cat "$f"; done'

# Plain pip, the image's python, no attnforge, no config (--isolated), a fresh target directory.
step plain-pip-install 300 "$AF_OUTER_PY" -m pip install --isolated --no-cache-dir --index-url file:///tmp/export/simple \
    --no-deps --target /tmp/plain flash-attn
step plain-import-and-run 300 env PYTHONPATH=/tmp/plain "$AF_OUTER_PY" -c '
import flash_attn, flash_attn_2_cuda, torch
from flash_attn import flash_attn_func
assert flash_attn.__file__.startswith("/tmp/plain"), flash_attn.__file__
q, k, v = (torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
out = flash_attn_func(q, k, v, causal=True)
ref = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2).double() for t in (q, k, v)), is_causal=True).transpose(1, 2)
rel = ((out.double() - ref).norm() / ref.norm()).item()
print("flash_attn", flash_attn.__version__, "from", flash_attn.__file__, "rel_err vs float64", f"{rel:.2e}")
assert rel < 1e-2'

backends=(flash-attn)
if [[ -n $fa4_before ]]; then
    json_step flash-attn-overlap 60 python scripts/gpu/flash_attn_overlap.py
    step reinstall-fa4-files 300 bash -c "python -m pip install --no-index --no-deps --force-reinstall '$WH'/flash_attn_4-*.whl"
    backends+=(flash-attn-4)
fi
json_step verify-flash-attn "$(( $(call_left_s) > 120 ? $(call_left_s) : 120 ))" attnforge verify "${backends[@]}" --json
finish "$STEP_DIR/cache-hit.tsv" "$STEP_DIR/verify-flash-attn.json"
