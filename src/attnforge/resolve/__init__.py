"""Pure decisions: ``(SystemSnapshot, Catalog, Request) -> Plan``."""

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

__all__ = [
    "BuildSpec", "CachedArtifact", "Candidate", "CandidateKind", "Plan", "Request", "SourceKind", "SourceSpec",
    "WheelRef",
]
