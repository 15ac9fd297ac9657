"""Pure parsers for what tools print about themselves. Each takes text and returns values or None.

Kept apart from the collectors so tests can feed them real recorded outputs (tests/fixtures/outputs/).
"""

from __future__ import annotations

import json
import re
from typing import Any

from attnforge.probe.snapshot import GpuInfo, VisualStudio

_NVCC_RELEASE = re.compile(r"release (\d+\.\d+), V([\d.]+)")
_NVCC_BUILD = re.compile(r"^(Build cuda_[^\s]+)", re.MULTILINE)
_GNU_VERSION = re.compile(r"^(?:gcc|g\+\+|cc|c\+\+|x86_64-linux-gnu-gcc(?:-\d+)?|x86_64-linux-gnu-g\+\+(?:-\d+)?)"
                          r"[^\n]*?\s(\d+\.\d+(?:\.\d+)?)\s*$", re.MULTILINE)
_CLANG_VERSION = re.compile(r"clang version (\d+\.\d+(?:\.\d+)?)")
_CL_BANNER = re.compile(r"Compiler Version (\d+\.\d+\.\d+(?:\.\d+)?) for (\S+)")
_SMI_CUDA = re.compile(r"CUDA Version:\s*(\d+\.\d+)")
_MIB = 1024 * 1024


def nvcc_release(text: str) -> tuple[str, str | None] | None:
    """``nvcc --version`` -> (``"13.0"``, ``"Build cuda_13.0.r13.0/compiler.36424714_0"``), None if unrecognised."""
    m = _NVCC_RELEASE.search(text)
    if not m:
        return None
    b = _NVCC_BUILD.search(text)
    return m.group(1), (b.group(1) if b else None)


def gnu_version(text: str) -> tuple[str, str] | None:
    """``gcc --version`` -> (``"12.2.0"``, first line)."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    m = _GNU_VERSION.search(first)
    if m:
        return m.group(1), first
    # Distribution banners such as "gcc (Ubuntu 13.3.0-6ubuntu2~24.04.1) 13.3.0" end in the version.
    tail = re.search(r"\)\s+(\d+\.\d+(?:\.\d+)?)\s*$", first)
    if tail:
        return tail.group(1), first
    return None


def clang_version(text: str) -> tuple[str, str] | None:
    """``clang --version`` -> (``"16.0.6"``, first line)."""
    m = _CLANG_VERSION.search(text)
    if not m:
        return None
    return m.group(1), text.strip().splitlines()[0]


def cl_banner(text: str) -> tuple[str, str] | None:
    """The banner ``cl`` prints with no arguments -> (``"19.44.35207"``, banner line); target must be x64."""
    m = _CL_BANNER.search(text)
    if not m:
        return None
    line = next(ln for ln in text.splitlines() if "Compiler Version" in ln).strip()
    return m.group(1), line


def msc_ver(cl_version: str) -> int:
    """``"19.44.35207"`` -> ``_MSC_VER`` 1944 (major*100 + minor)."""
    major, minor, *_ = (int(p) for p in cl_version.split("."))
    return major * 100 + minor


def nvidia_smi_csv(text: str, cuda_driver_version: str | None) -> list[GpuInfo]:
    """Rows of ``nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version
    --format=csv,noheader,nounits`` -> GPUs. Rows that do not parse are skipped."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            continue
        index, name, cap, mem_mib, driver = parts
        try:
            major, minor = (int(x) for x in cap.split("."))
            memory = int(float(mem_mib)) * _MIB
            idx = int(index)
        except ValueError:
            continue
        gpus.append(GpuInfo(index=idx, name=name, compute_capability=(major, minor), memory_bytes=memory,
                            driver_version=driver, cuda_driver_version=cuda_driver_version, source="nvidia-smi"))
    return gpus


def nvidia_smi_cuda_version(text: str) -> str | None:
    """The ``CUDA Version: 13.0`` of plain ``nvidia-smi``: the highest CUDA the driver supports."""
    m = _SMI_CUDA.search(text)
    return m.group(1) if m else None


def cuda_version_from_int(value: int) -> str:
    """NVML / cudaDriverGetVersion integer -> dotted: ``13000`` -> ``"13.0"``, ``12080`` -> ``"12.8"``."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def vswhere_json(text: str) -> list[VisualStudio]:
    """``vswhere -products * -requires Microsoft.VisualStudio.Component.VC.Tools.x86.x64 -format json``.

    Toolsets are filled in by the collector, which lists ``VC\\Tools\\MSVC`` under each installation path.

    Raises:
        ValueError: not vswhere's JSON array.
    """
    data: Any = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("vswhere output is not a JSON array")
    out = []
    for item in data:
        if not isinstance(item, dict):
            continue
        out.append(VisualStudio(
            instance_id=str(item.get("instanceId", "")),
            display_name=str(item.get("displayName", "")),
            version=str(item.get("installationVersion", "")),
            install_path=str(item.get("installationPath", "")),
            msvc_toolsets=(),
        ))
    return out


def first_version(text: str) -> str | None:
    """The first dotted version number in a ``--version`` output (ninja prints ``1.13.2``)."""
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else None
