"""Why does xFormers 0.0.35 from PyPI not load its extension with torch 2.11.0+cu130, and does it compute
right?

Run with ``XFORMERS_MORE_DETAILS=1`` and ``PYTHONPATH`` pointing at an xformers install
(05-fa4-sage-xformers.sh
does both, once plain and once with ``LD_LIBRARY_PATH`` holding the CUDA 12 runtime). Prints one JSON
document:
the build metadata xformers records (``cpp_lib.json``), the error from loading ``_C.so`` directly with ctypes
(xformers itself swallows it into a warning), the shared libraries ``_C.so`` needs that the loader cannot
find,
and, when the extension loads, ``memory_efficient_attention`` on random bf16 inputs against the float64
reference.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import subprocess
import sys


def probe(report: dict[str, object]) -> None:
    spec = importlib.util.find_spec("xformers")
    if spec is None or spec.origin is None:
        report["error"] = "xformers is not importable"
        return
    pkg = os.path.dirname(spec.origin)
    so = os.path.join(pkg, "_C.so")
    report["package_dir"] = pkg
    try:
        with open(os.path.join(pkg, "cpp_lib.json")) as f:
            report["built_for"] = json.load(f)
    except OSError as exc:
        report["built_for"] = f"cpp_lib.json unreadable: {exc}"

    import torch

    report["torch"] = torch.__version__
    report["torch_cuda"] = torch.version.cuda
    report["ld_library_path"] = os.environ.get("LD_LIBRARY_PATH", "")
    try:
        ctypes.CDLL(so)
        report["dlopen_C_so"] = "ok"
    except OSError as exc:
        report["dlopen_C_so"] = str(exc)
    ldd = subprocess.run(["ldd", so], capture_output=True, text=True, check=False)
    missing = [ln.strip() for ln in ldd.stdout.splitlines() if "not found" in ln]
    # torch's own libraries are always "not found" to ldd (no RUNPATH); in-process they are already loaded
    report["ldd_not_found"] = [ln for ln in missing if not ln.startswith(("libc10", "libtorch"))]
    report["ldd_not_found_torch_libs"] = [ln for ln in missing if ln.startswith(("libc10", "libtorch"))]
    report["ldd_cuda"] = [ln.strip() for ln in ldd.stdout.splitlines() if "cuda" in ln or "cudart" in ln]

    import xformers
    import xformers.ops as xops

    report["xformers"] = xformers.__version__
    from xformers import _cpp_lib

    exc = getattr(_cpp_lib, "_cpp_library_load_exception", None)
    report["xformers_load_exception"] = None if exc is None else repr(exc)

    from attnforge.backends.adapter import reference_attention

    torch.manual_seed(0)
    b, s, h, d = 2, 1024, 8, 128
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ref = reference_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=False, scale=None
    )
    ops: dict[str, object] = {"default": None}
    try:
        from xformers.ops.fmha import cutlass

        ops["cutlass.FwOp (needs _C)"] = (cutlass.FwOp, cutlass.BwOp)
    except Exception as e:
        report["cutlass_import"] = repr(e)
    results = {}
    for label, op in ops.items():
        try:
            out = xops.memory_efficient_attention(q, k, v, op=op)
            torch.cuda.synchronize()
            o = out.transpose(1, 2).double()
            rel = (torch.linalg.vector_norm(o - ref) / torch.linalg.vector_norm(ref)).item()
            results[label] = {"ok": bool(torch.isfinite(out).all().item()) and rel < 2e-2, "rel_err": rel}
        except Exception as e:
            results[label] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:600]}"}
    report["memory_efficient_attention"] = results


def main() -> int:
    report: dict[str, object] = {"python": sys.version.split()[0]}
    try:
        probe(report)
    except Exception as exc:
        report["probe_error"] = f"{type(exc).__name__}: {str(exc)[:600]}"
    print(json.dumps(report, indent=2, default=str))
    return 0 if "probe_error" not in report and "error" not in report else 1


if __name__ == "__main__":
    raise SystemExit(main())
