"""The default readers a :class:`~attnforge.probe.context.ProbeContext` injects for what is read inside this
process rather than through a tool: NVML (``nvidia-ml-py``) and the Windows registry. Tests inject fakes instead, so
no test needs a GPU or Windows.
"""

from __future__ import annotations

from typing import Any

from attnforge.probe import parsers
from attnforge.probe.snapshot import GpuInfo
from attnforge.types.cc import ComputeCapability


def read_nvml() -> list[GpuInfo]:
    """Read every GPU through NVML (``nvidia-ml-py``). Raises on any NVML failure."""
    import pynvml

    pynvml.nvmlInit()
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        try:
            cuda = parsers.cuda_version_from_int(int(pynvml.nvmlSystemGetCudaDriverVersion()))
        except pynvml.NVMLError:
            cuda = None
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total
            gpus.append(GpuInfo(index=i, name=_text(pynvml.nvmlDeviceGetName(h)),
                                compute_capability=ComputeCapability(major, minor),
                                memory_bytes=int(mem), driver_version=driver, cuda_driver_version=cuda, source="nvml"))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_long_paths_enabled() -> int | None:
    """``HKLM\\SYSTEM\\CurrentControlSet\\Control\\FileSystem\\LongPathsEnabled``; None when absent."""
    import winreg  # type: ignore[import-not-found,unused-ignore]

    try:
        with winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE,  # type: ignore[attr-defined,unused-ignore]
                            r"SYSTEM\CurrentControlSet\Control\FileSystem") as key:
            value, _ = winreg.QueryValueEx(key, "LongPathsEnabled")  # type: ignore[attr-defined,unused-ignore]
            return int(value)
    except FileNotFoundError:
        return None
