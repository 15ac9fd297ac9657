"""``plan``: what ``install`` would do here for a request, every candidate with its reasons, and how long each route
is expected to take on this machine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from attnforge.install.inputs import Assembled as Assembled  # noqa: PLC0414 - an assembled request, for the fleet
from attnforge.install.inputs import RequestArgs
from attnforge.install.inputs import assemble as assemble  # noqa: PLC0414 - the one request assembly, for the fleet
from attnforge.resolve.buildspec import minutes as minutes  # noqa: PLC0414 - the estimates' wording, for renderers
from attnforge.resolve.types import CandidateKind, Plan


@dataclass(frozen=True, slots=True, kw_only=True)
class Planned:
    """A plan and what a person reads beside it.

    Attributes:
        plan: the resolver's plan, as ``install`` executes it (the same planner and cached entries).
        notes: listing problems, aliases taken, a cached listing's age.
        expected_s: expected seconds per route kind present in the plan (``source``: this machine's newest recorded
            build of the project, else a slim build's estimate, else ``wheel_sources.toml`` ``[route_times]`` for a
            catalog backend; None for a source the catalog does not know, until this machine has built it).
        measured: the ``source`` figure is this machine's recorded build.
        projects: the distribution names the request covers.
        home: ``$ATTNFORGE_HOME``.
    """

    plan: Plan
    notes: tuple[str, ...] = ()
    expected_s: dict[str, float | None] = field(default_factory=dict)
    measured: bool = False
    projects: tuple[str, ...] = ()
    home: Path | None = None


def plan(args: RequestArgs, *, on_note: Callable[[str], None] | None = None) -> Planned:
    """The plan for ``args`` and each route's expected time.

    Raises:
        UsageError: bad input (see :func:`attnforge.install.inputs.assemble`).
    """
    from attnforge.install.inputs import assemble

    wanted = assemble(args, on_note=on_note)
    planned = wanted.plan()
    backend = wanted.request.backend
    expected = {k: route_s(k, backend) for k in dict.fromkeys(c.kind.value for c in planned.candidates)}
    if "source" in expected and backend not in wanted.catalog.backends:
        expected["source"] = None  # [route_times]' source figures are FlashAttention's and Sage's: none for this one
    measured = measured_build_s(wanted.projects, wanted.home) if "source" in expected else None
    slim_s = next((c.build.slim.estimate_s for c in planned.candidates if c.build is not None
                   and c.build.slim is not None and c.build.slim.estimate_s is not None), None)
    if measured is not None or slim_s is not None:  # this machine's last build, else the slim build's estimate
        expected["source"] = measured if measured is not None else slim_s
    return Planned(plan=planned, notes=tuple(wanted.notes), expected_s=expected, measured=measured is not None,
                   projects=wanted.projects, home=wanted.home)


def measured_build_s(projects: tuple[str, ...], home: Path) -> float | None:
    """The duration of the newest build of one of ``projects`` in the local cache (its build log's last line,
    :func:`attnforge.resolve.sources.build_seconds`), if any; a home without a cache is not created."""
    from packaging.utils import canonicalize_name

    from attnforge.cache import Store
    from attnforge.resolve.sources import build_seconds

    if not (home / "cache.db").exists() and not (home / "artifacts").is_dir():
        return None  # no cache here: do not create one for a what-if
    wanted = {canonicalize_name(p) for p in projects}
    entries = sorted(
        (e for e in Store(home).list() if canonicalize_name(e.name) in wanted and e.log_path),
        key=lambda e: e.created_at_s,
        reverse=True,
    )
    for e in entries:
        try:
            secs = build_seconds(Path(str(e.log_path)).read_text(encoding="utf-8", errors="replace")[-4096:])
        except OSError:
            continue
        if secs is not None:
            return secs
    return None


def route_s(kind: CandidateKind | str, backend: str) -> float | None:
    """The catalog's expected seconds of one route kind (``wheel_sources.toml`` ``[route_times]``)."""
    from attnforge.resolve.sources import load_wheel_sources

    return load_wheel_sources().route_times.expected_s(kind, backend)

