"""Reading the machine: collectors that return one frozen :class:`SystemSnapshot`."""

from __future__ import annotations

from typing import Any

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

# The collectors import the catalog, which imports the snapshot types above: load them on first use.
_LAZY = {"collect_snapshot": "attnforge.probe.collect", "BUILD_ENV_VARS": "attnforge.probe.collect",
         "ProbeContext": "attnforge.probe.context"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'attnforge.probe' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = [
    "BUILD_ENV_VARS", "SCHEMA_VERSION", "Compiler", "ComputeCapability", "CudaToolkit", "GpuInfo",
    "InstalledBackend", "NativeModule", "PlatformInfo", "ProbeContext", "ProbeProblem", "SystemSnapshot", "Tool",
    "TorchInfo", "VisualStudio", "collect_snapshot", "format_cc", "parse_cc",
]
