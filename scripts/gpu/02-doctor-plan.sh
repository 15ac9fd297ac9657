#!/usr/bin/env bash
# 02-doctor-plan.sh: the machine facts for docs/benchmarks.md, then what a user runs first: doctor, probe, plan.
source "$(dirname "$0")/_lib.sh"
ensure_attnforge || { finish; exit 1; }

step env-facts 120 bash -c '
    echo "date_utc: $(date -u +%FT%TZ)"; echo "kernel: $(uname -r)"; echo "cores: $(nproc)"
    free -g | head -2; df -h /tmp | tail -1
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
    nvidia-smi | head -15
    nvcc --version | tail -2; gcc --version | head -1; g++ --version | head -1; ninja --version
    python - <<EOF
import torch, triton
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
print("triton", triton.__version__, "device", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
p = torch.cuda.get_device_properties(0)
print("sms", p.multi_processor_count, "mem_gib", round(p.total_memory / 2**30, 1))
print("arch_list", torch.cuda.get_arch_list())
EOF'
cp "$STEP_DIR/env-facts.log" "$STEP_DIR/env.txt"

step doctor-text 180 attnforge doctor
json_step doctor 180 attnforge doctor --json
json_step probe 180 attnforge probe --json
step plan-flash-attn-text 180 attnforge plan flash-attn --find-links "$WH"
json_step plan-flash-attn 180 attnforge plan flash-attn --find-links "$WH" --json
for b in flash-attn-4 sageattention-1 xformers; do
    json_step "plan-$b" 120 attnforge plan "$b" --find-links "$WH" --json
done

# The plan's build environment in one line, for the build that 03 starts.
python - "$STEP_DIR/plan-flash-attn.json" <<'EOF' || true
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except Exception as exc:
    sys.exit(f"plan JSON unreadable: {exc}")
def find(o, key):
    if isinstance(o, dict):
        for k, v in o.items():
            if k == key:
                return v
            r = find(v, key)
            if r is not None:
                return r
    elif isinstance(o, list):
        for v in o:
            r = find(v, key)
            if r is not None:
                return r
    return None
for key in ("action", "chosen", "FLASH_ATTN_CUDA_ARCHS", "MAX_JOBS", "NVCC_THREADS", "FLASH_ATTENTION_FORCE_BUILD"):
    print(f"  plan {key}: {find(doc, key)}")
EOF

finish "$STEP_DIR/doctor-text.log"
