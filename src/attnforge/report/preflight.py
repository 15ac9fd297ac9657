"""Why a backend that needs a build cannot be built on this machine (the doctor's view of the preflight)."""

from __future__ import annotations

from attnforge.catalog import Catalog
from attnforge.probe.snapshot import SystemSnapshot


def build_blockers(s: SystemSnapshot, catalog: Catalog) -> dict[str, list[str]]:
    """Per backend that needs a build: the reasons a build cannot start here (empty when it can)."""
    reasons: list[str] = []
    if s.torch is None:
        reasons.append("torch is not installed: an extension build compiles against torch")
    elif not s.torch.is_cuda_build:
        reasons.append(f"torch {s.torch.version} is a CPU build (a CUDA extension compiles against a CUDA torch)")
    if not s.cuda_toolkits:
        reasons.append("no nvcc (CUDA toolkit) found")
    if not s.gpus:
        reasons.append("no GPU to target (`--arch` builds for another machine)")
    return {b.id: list(reasons) for b in catalog.backends.values() if b.needs_build}
