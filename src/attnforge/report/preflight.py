"""Why a backend that needs a build cannot be built on this machine: the resolver's preflight, for the doctor."""

from __future__ import annotations

from attnforge.catalog import Catalog
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.buildspec import plan_build
from attnforge.resolve.types import Request


def build_blockers(s: SystemSnapshot, catalog: Catalog) -> dict[str, list[str]]:
    """Per backend that needs a build: the failed preflight checks, each as "reason (fix)" (empty when it can)."""
    out: dict[str, list[str]] = {}
    for b in catalog.backends.values():
        if not b.needs_build or catalog.recipe(b.id) is None:
            continue
        decision = plan_build(s, catalog, Request(backend=b.id))
        out[b.id] = [c.reason for c in decision.preflight.failures]
    return out
