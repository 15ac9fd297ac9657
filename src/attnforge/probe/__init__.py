"""Reading the machine: collectors that return one frozen :class:`SystemSnapshot`."""

from __future__ import annotations

from attnforge.probe.backends import BackendQuery
from attnforge.probe.collect import BUILD_ENV_VARS, collect_snapshot
from attnforge.probe.context import ProbeContext
from attnforge.probe.snapshot import (
    SCHEMA_VERSION,
    Compiler,
    ComputeCapability,
    CudaToolkit,
    GpuInfo,
    InstalledBackend,
    NativeModule,
    PlatformInfo,
    ProbeProblem,
    SystemSnapshot,
    Tool,
    TorchInfo,
    VisualStudio,
    format_cc,
    parse_cc,
)

__all__ = [
    "BUILD_ENV_VARS", "SCHEMA_VERSION", "BackendQuery", "Compiler", "ComputeCapability", "CudaToolkit", "GpuInfo",
    "InstalledBackend", "NativeModule", "PlatformInfo", "ProbeContext", "ProbeProblem", "SystemSnapshot", "Tool",
    "TorchInfo", "VisualStudio", "collect_snapshot", "format_cc", "parse_cc",
]
