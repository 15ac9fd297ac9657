"""Pure parsers for what tools print about themselves. Each takes text and returns values or None.

Kept apart from the collectors so tests can feed them real recorded outputs (tests/fixtures/outputs/).
"""

from __future__ import annotations

import re
from typing import Any

from attnforge import _serde
from attnforge.probe.snapshot import GpuInfo, VisualStudio
from attnforge.types.cc import ComputeCapability

_NVCC_RELEASE = re.compile(r"release (\d+\.\d+), V([\d.]+)")
_NVCC_BUILD = re.compile(r"^(Build cuda_[^\s]+)", re.MULTILINE)
_GNU_VERSION = re.compile(r"^(?:gcc|g\+\+|cc|c\+\+|x86_64-linux-gnu-gcc(?:-\d+)?|x86_64-linux-gnu-g\+\+(?:-\d+)?)"
                          r"[^\n]*?\s(\d+\.\d+(?:\.\d+)?)\s*$", re.MULTILINE)
_CLANG_VERSION = re.compile(r"clang version (\d+\.\d+(?:\.\d+)?)")
_CL_BANNER = re.compile(r"Compiler Version (\d+\.\d+\.\d+(?:\.\d+)?) for (\S+)")
# Localised banners keep the number but not the words
# ("用于 x64 的 Microsoft (R) C/C++ 优化编译器 19.51.36248 版").
_CL_BANNER_ANY = re.compile(r"Microsoft[^\n]*?\b(19\.\d{2}\.\d{5}(?:\.\d+)?)\b")
_REG_DWORD = re.compile(r"^\s*(\S+)\s+REG_DWORD\s+0x([0-9a-fA-F]+)\s*$", re.MULTILINE)
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
    """The banner ``cl`` prints with no arguments -> (``"19.44.35207"``, banner line).

    English banners read ``Microsoft (R) C/C++ Optimizing Compiler Version 19.44.35207 for x64``; localised
    ones keep only the number, which is matched as a fallback (a ``19.xx.yyyyy`` on a line naming Microsoft).
    """
    m = _CL_BANNER.search(text)
    if m:
        line = next(ln for ln in text.splitlines() if "Compiler Version" in ln).strip()
        return m.group(1), line
    m = _CL_BANNER_ANY.search(text)
    if m:
        line = next(ln for ln in text.splitlines() if m.group(1) in ln).strip()
        return m.group(1), line
    return None


def msc_ver(cl_version: str) -> int:
    """``"19.44.35207"`` -> ``_MSC_VER`` 1944 (major*100 + minor)."""
    major, minor, *_ = (int(p) for p in cl_version.split("."))
    return major * 100 + minor


def toolset_msc_ver(toolset: str) -> int:
    """MSVC toolset directory name -> ``_MSC_VER``: ``"14.44.35207"`` -> 1944, ``"14.29.30133"`` -> 1929.

    The toolset minor and the ``cl`` minor move together from VS 2017 on (14.1x/19.1x ... 14.50/19.50);
    source: docs/research/toolchain-facts.md §3.2.

    Raises:
        ValueError: not a ``14.xx[.yyyyy]`` toolset version.
    """
    parts = toolset.strip().split(".")
    if len(parts) < 2 or parts[0] != "14" or not parts[1].isdigit():
        raise ValueError(f"not an MSVC toolset version: {toolset!r} (expected e.g. 14.44.35207)")
    return 1900 + int(parts[1])


def reg_query_dword(text: str, name: str) -> int | None:
    """The value of ``name`` in ``reg query <key> /v <name>`` output, None when reg reports it absent.

    ``    LongPathsEnabled    REG_DWORD    0x1`` -> 1. An absent value makes reg print ``ERROR: The system was
    unable to find the specified registry key or value.`` (and exit 1), which has no REG_DWORD line.
    """
    for m in _REG_DWORD.finditer(text):
        if m.group(1).lower() == name.lower():
            return int(m.group(2), 16)
    return None


def python_dev_json(text: str) -> dict[str, Any] | None:
    """The JSON line printed by :data:`attnforge.probe.windows.PYTHON_DEV_SCRIPT`; None if it is not there."""
    for line in reversed(text.strip().splitlines()):
        try:
            data = _serde.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and "include_dir" in data:
            return data
    return None


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
        gpus.append(GpuInfo(index=idx, name=name, compute_capability=ComputeCapability(major, minor),
                            memory_bytes=memory, driver_version=driver, cuda_driver_version=cuda_driver_version,
                            source="nvidia-smi"))
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
    data: Any = _serde.loads(text)
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
