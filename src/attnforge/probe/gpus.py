"""GPUs: NVML first, then ``nvidia-smi``, then torch (from the torch subprocess)."""

from __future__ import annotations

from typing import Any

from attnforge.probe import parsers
from attnforge.probe.context import ProbeContext
from attnforge.probe.snapshot import GpuInfo
from attnforge.types.cc import ComputeCapability

SMI_QUERY = ("nvidia-smi", "--query-gpu=index,name,compute_cap,memory.total,driver_version",
             "--format=csv,noheader,nounits")


def collect_gpus(ctx: ProbeContext, torch_raw: dict[str, Any] | None) -> tuple[list[GpuInfo], list[str]]:
    """Return the GPUs and the reasons each source that was tried failed (empty when the first worked)."""
    reasons: list[str] = []
    try:
        gpus = ctx.nvml()
        if gpus:
            return gpus, []
        reasons.append("nvml: no GPU reported")
    except Exception as exc:  # NVML raises its own error types, or ImportError/OSError without a driver
        reasons.append(f"nvml: {type(exc).__name__}: {exc}".strip())
    res = ctx.runner.run(SMI_QUERY, env=ctx.environ, timeout_s=ctx.timeout_s)
    if res.ok:
        header = ctx.runner.run(("nvidia-smi",), env=ctx.environ, timeout_s=ctx.timeout_s)
        gpus = parsers.nvidia_smi_csv(res.stdout, parsers.nvidia_smi_cuda_version(header.stdout))
        if gpus:
            return gpus, []
        reasons.append("nvidia-smi: no GPU rows")
    else:
        reasons.append(f"nvidia-smi: {_why(res.returncode, res.stderr)}")
    devices = (torch_raw or {}).get("devices") or []
    if devices:
        return [GpuInfo(index=d["index"], name=d["name"], compute_capability=ComputeCapability(d["cc"][0], d["cc"][1]),
                        memory_bytes=d.get("memory"), driver_version=None, cuda_driver_version=None, source="torch")
                for d in devices], []
    reasons.append("torch: " + ("no CUDA device visible" if torch_raw and "version" in torch_raw else "not available"))
    return [], reasons


def _why(code: int, stderr: str) -> str:
    if code == 127:
        return "not found on PATH"
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    return f"exit {code}" + (f": {last}" if last else "")
