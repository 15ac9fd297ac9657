"""Reading the machine: collectors that return one frozen :class:`SystemSnapshot`."""

from __future__ import annotations

from attnforge.probe.collect import BUILD_ENV_VARS, collect_snapshot
from attnforge.probe.context import ProbeContext
from attnforge.probe.snapshot import GpuInfo, InstalledBackend, NativeModule, SystemSnapshot

__all__ = ["BUILD_ENV_VARS", "GpuInfo", "InstalledBackend", "NativeModule", "ProbeContext",
           "SystemSnapshot", "collect_snapshot"]
