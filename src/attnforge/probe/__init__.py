"""Reading the machine: collectors that return one frozen :class:`SystemSnapshot`."""

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
    "BUILD_ENV_VARS", "SCHEMA_VERSION", "Compiler", "ComputeCapability", "CudaToolkit", "GpuInfo",
    "InstalledBackend", "NativeModule", "PlatformInfo", "ProbeContext", "ProbeProblem", "SystemSnapshot", "Tool",
    "TorchInfo", "VisualStudio", "collect_snapshot", "format_cc", "parse_cc",
]
