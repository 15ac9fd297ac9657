"""Pure decisions: ``(SystemSnapshot, Catalog, Request) -> Plan``.

``build_spec(snapshot, catalog, request) -> BuildSpec`` is the entry point of ``attnforge build``.
"""

from attnforge.resolve.buildspec import build_spec, plan_build
from attnforge.resolve.types import (
    BuildSpec,
    CachedArtifact,
    Candidate,
    CandidateKind,
    Plan,
    Request,
    SourceKind,
    SourceSpec,
    WheelRef,
)

__all__ = ["BuildSpec", "CachedArtifact", "Candidate", "CandidateKind", "Plan", "Request", "SourceKind", "SourceSpec", "WheelRef", "build_spec", "plan_build"]
