"""Pure decisions: ``(SystemSnapshot, Catalog, Request) -> Plan``."""

from attnforge.resolve.types import (
    BuildSpec,
    Candidate,
    CandidateKind,
    Plan,
    Request,
    SourceKind,
    SourceSpec,
    WheelRef,
)

__all__ = ["BuildSpec", "Candidate", "CandidateKind", "Plan", "Request", "SourceKind", "SourceSpec", "WheelRef"]
