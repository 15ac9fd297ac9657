"""Run as ``python _torch_script.py`` in the target interpreter; prints one JSON object about torch.

Kept dependency-free and defensive: every field is read on its own so one broken part does not hide the rest.
"""

import json
import sys
from typing import Any


def main() -> None:
    out: dict[str, Any] = {}
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]
    except BaseException as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(out))
        return
    out["version"] = str(torch.__version__)
    out["cuda_version"] = getattr(torch.version, "cuda", None)
    out["hip_version"] = getattr(torch.version, "hip", None)
    try:
        out["cxx11_abi"] = bool(torch.compiled_with_cxx11_abi())  # type: ignore[no-untyped-call,unused-ignore]
    except Exception:
        out["cxx11_abi"] = None
    try:
        out["arch_list"] = list(torch.cuda.get_arch_list())
    except Exception:
        out["arch_list"] = []
    try:
        cudnn = torch.backends.cudnn
        out["cudnn_version"] = cudnn.version() if cudnn.is_available() else None  # type: ignore[no-untyped-call,unused-ignore]
    except Exception:
        out["cudnn_version"] = None
    try:
        out["sdpa_flash_available"] = bool(torch.backends.cuda.is_flash_attention_available())
    except Exception:
        out["sdpa_flash_available"] = None
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
    except Exception:
        out["cuda_available"] = False
    devices = []
    if out["cuda_available"]:
        try:
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                devices.append({"index": i, "name": p.name, "cc": [p.major, p.minor], "memory": p.total_memory})
        except Exception as exc:
            out["devices_error"] = str(exc)
    out["devices"] = devices
    try:
        from importlib.metadata import PackageNotFoundError, version

        tv = None
        for name in ("triton", "triton-windows", "pytorch-triton"):
            try:
                tv = version(name)
                break
            except PackageNotFoundError:
                continue
        out["triton_version"] = tv
    except Exception:
        out["triton_version"] = None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
    sys.stdout.flush()
