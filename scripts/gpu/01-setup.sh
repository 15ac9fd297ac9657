#!/usr/bin/env bash
# 01-setup.sh: the environment a user would make: a venv that sees the image's torch, with attnforge installed
# from this checkout (editable) and its one missing dependency (platformdirs) from the wheelhouse.
#
# Why a bridge .pth: the image's python3 is itself a venv (/opt/torch/.venv). `python3 -m venv
# --system-site-packages` from inside a venv links the *base* interpreter's site-packages, not the outer venv's,
# so torch would be invisible. The bridge adds the outer venv's site-packages with site.addsitedir, which also
# processes their .pth files; our venv's own site-packages stays first, so what we install wins. A venv (not
# `pip install --target`) is needed anyway: nvidia-cutlass-dsl puts `cutlass` on sys.path through a .pth file.
source "$(dirname "$0")/_lib.sh"

echo "$AF_OUTER_PY" > "$RUN/outer_python"
step outer-python 60 "$AF_OUTER_PY" -c 'import sys, torch; print(sys.executable, sys.version.split()[0], sys.prefix); print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'

if [[ ! -x "$VENV/bin/python" ]]; then
    # A base interpreter without ensurepip (a uv-made outer venv, Debian without python3-venv) cannot seed pip:
    # then the venv goes without, and `python -m pip` finds the outer venv's pip through the bridge below.
    step make-venv 120 "$AF_OUTER_PY" -m venv --system-site-packages "$VENV" \
        || { rm -rf "$VENV"; step make-venv-without-pip 120 "$AF_OUTER_PY" -m venv --system-site-packages --without-pip "$VENV"; }
fi
site_dir=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$AF_OUTER_PY" - "$site_dir/zz_attnforge_outer_env.pth" <<'EOF'
import site, sys
# plain path lines too: code that reads versions without running .pth imports (attnforge's -S check) sees them
lines = [f"import site; site.addsitedir({p!r})" for p in site.getsitepackages()] + site.getsitepackages()
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
print("bridge:", sys.argv[1]); print("\n".join(lines))
EOF
export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH"
step venv-pip 60 python -m pip --version
step venv-sees-torch 120 python -c 'import sys, torch, numpy, triton; print(sys.prefix, torch.__version__, triton.__version__, torch.cuda.get_device_name())'

# attnforge from this checkout, editable (a later call's re-sent tree is picked up), its dependencies from the
# image plus platformdirs from the wheelhouse. Fallbacks, each recorded: a newer setuptools from the wheelhouse
# (the SPDX `license` string needs setuptools>=77 without build isolation), then a plain .pth onto src/.
if ! step install-attnforge 300 python -m pip install --no-index --find-links "$WH" --no-build-isolation -e "$AF_ROOT"; then
    step upgrade-setuptools 120 python -m pip install --no-index --find-links "$WH" "setuptools>=77"
    if ! step install-attnforge-retry 300 python -m pip install --no-index --find-links "$WH" --no-build-isolation -e "$AF_ROOT"; then
        note "FALLBACK: attnforge put on sys.path by a .pth file and a console-script shim (no pip metadata)"
        step install-platformdirs 120 python -m pip install --no-index --find-links "$WH" platformdirs
        echo "$AF_ROOT/src" > "$site_dir/attnforge_src_fallback.pth"
        printf '#!%s\nimport sys\nfrom attnforge.cli import run\nsys.exit(run())\n' "$VENV/bin/python" > "$VENV/bin/attnforge"
        chmod +x "$VENV/bin/attnforge"
    fi
fi
step attnforge-version 60 attnforge --version
step pip-freeze 60 bash -c 'python -m pip list --format=freeze 2>/dev/null | sort'
cp "$STEP_DIR/pip-freeze.log" "$STEP_DIR/pip-list-before.txt" 2>/dev/null

finish
