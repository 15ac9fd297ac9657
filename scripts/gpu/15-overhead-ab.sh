#!/usr/bin/env bash
# 15-overhead-ab.sh: dispatch overhead, this tree ("new") vs commit fcbca8e ("old", the 2026-11-22 H200 state),
# interleaved twice in one session. Carry: carry/ovh with old_src/ (git archive fcbca8e src), old_script.py
# (scripts/dispatch_overhead.py of that commit) and the platformdirs + pyelftools wheels (the image lacks them).
# Make it: mkdir -p carry/ovh/old_src && git archive fcbca8e src | tar -x -C carry/ovh/old_src &&
#   git show fcbca8e:scripts/dispatch_overhead.py > carry/ovh/old_script.py && cp WHEELHOUSE/{platformdirs,pyelftools}-*.whl carry/ovh/
# Run from the checkout root: OUT=$OUT bash scripts/gpu/15-overhead-ab.sh (SKIP_GPU_SCRIPT=1: only the micro one).
P=${P:-/opt/torch/.venv/bin/python3}; D=carry/ovh; W=$D/platformdirs-4.14.5-py3-none-any.whl:$D/pyelftools-0.33-py3-none-any.whl
DEV=${DEV:-cuda}; OUT=${OUT:-/tmp/ovh}; mkdir -p $OUT
$P -c "import torch; print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')" > $OUT/device.txt
for round in 1 2; do
  for v in new old; do
    src=src; [ $v = old ] && src=$D/old_src/src
    script=scripts/dispatch_overhead.py; [ $v = old ] && script=$D/old_script.py
    PYTHONPATH=$src:$W ATTNFORGE_HOME=$(mktemp -d) ATTNFORGE_WHEEL_SOURCES=off timeout 120 $P $script --device $DEV --iters 2000 --repeats 9 > $OUT/dispatch_overhead_${v}_$round.txt 2>&1
    [ "$DEV" = cuda ] && [ -z "$SKIP_GPU_SCRIPT" ] && PYTHONPATH=$src:$W ATTNFORGE_HOME=$(mktemp -d) ATTNFORGE_WHEEL_SOURCES=off timeout 150 $P scripts/gpu/overhead.py --out $OUT/overhead_sdpa_${v}_$round.json > $OUT/overhead_${v}_$round.txt 2>&1
  done
done
tail -n 20 $OUT/*.txt
