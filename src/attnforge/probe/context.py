"""What a probe reads the machine through: the seams, injectable for tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from attnforge._system.runner import Runner, SubprocessRunner
from attnforge.probe.snapshot import GpuInfo

#: Reads GPUs through NVML; raises on any failure (no driver, no library). Injected so tests need no GPU.
NvmlReader = Callable[[], list[GpuInfo]]
#: Reads ``HKLM\SYSTEM\CurrentControlSet\Control\FileSystem\LongPathsEnabled``; None when absent.
RegistryReader = Callable[[], int | None]


def _default_nvml() -> list[GpuInfo]:
    from attnforge.probe.readers import read_nvml

    return read_nvml()


def _default_registry() -> int | None:
    from attnforge.probe.readers import read_long_paths_enabled

    return read_long_paths_enabled()


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeContext:
    """The seams a probe uses.

    Attributes:
        runner: runs tools (nvcc, gcc, nvidia-smi, the torch subprocess).
        environ: the environment to read (PATH, CUDA_HOME, ...), not necessarily this process's.
        python: the interpreter whose torch and backends are probed (and that installs go into).
        os_name: ``linux`` / ``windows`` / ``darwin``; decides which collectors run.
        fs_root: prefix for well-known locations such as ``/usr/local/cuda*`` (a tmp dir in tests).
        cache_dir: where the artifact cache lives (free disk is measured there).
        nvml: the NVML reader.
        registry: the Windows registry reader.
        timeout_s: per-tool timeout; the torch subprocess gets 4x this.
        torch_memo: a directory where the torch section is remembered while torch's files stay as they are
            (:mod:`attnforge.probe.memo`; ``attnforge install`` passes ``<home>/probe``); None probes every time.
    """

    runner: Runner = field(default_factory=SubprocessRunner)
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    python: str = sys.executable
    os_name: str = field(default_factory=lambda: _os_name(sys.platform))
    fs_root: Path = Path("/")
    cache_dir: Path | None = None
    nvml: NvmlReader = _default_nvml
    registry: RegistryReader = _default_registry
    timeout_s: float = 20.0
    torch_memo: Path | None = None


def _os_name(platform: str) -> str:
    if platform.startswith("win"):
        return "windows"
    if platform.startswith("linux"):
        return "linux"
    return platform
