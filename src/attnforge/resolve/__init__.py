"""Pure decisions: ``(SystemSnapshot, Catalog, Request) -> Plan``.

``build_spec(snapshot, catalog, request) -> BuildSpec`` is the entry point of ``attnforge build``.
"""

from attnforge.resolve.buildspec import build_spec, plan_build
from attnforge.resolve.resolver import resolve
from attnforge.resolve.types import BuildSpec, Plan, Request

__all__ = ["BuildSpec", "Plan", "Request", "build_spec", "plan_build", "resolve"]
