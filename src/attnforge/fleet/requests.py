"""Each backend's request for every machine kind, assembled exactly as ``attnforge plan`` assembles it on one machine.

The one request-assembly room is :func:`attnforge.install.inputs.assemble` (reached through
:mod:`attnforge.provision.plan`): names and aliases (``flash_attn``), version specifiers, ``--source``, ``--arch``,
the slim options, ``--find-links`` / ``--index-url`` listings and
the known release sources (prebuilt wheels of the kind's torch/CUDA/Python), and the planner that ranks them
(:func:`attnforge.install.defaults.resolver_planner`). A kind is "another machine" to the head, so each kind's
plan is ``attnforge plan REQUIREMENT --snapshot <that kind's snapshot>``: the snapshot is written once under
``$ATTNFORGE_HOME/fleet/kinds/`` and handed to ``assemble`` as ``--snapshot`` is. The same snapshot therefore
gets the same route from ``fleet plan`` as from ``attnforge plan`` (tests/fleet/test_same_pipeline.py).

One difference, on purpose: the head's own cache entries are not offered to the nodes (``cached=()``): a wheel
in the head's store is not on a node, and ``fleet build`` publishes only what it builds.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from attnforge._system.files import write_atomic
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.provision import RequestArgs
from attnforge.provision.plan import Assembled, assemble
from attnforge.resolve.types import Plan, Request


@dataclass(frozen=True, slots=True, kw_only=True)
class KindRequest:
    """One backend's request, and how to plan it on any kind's snapshot.

    Attributes:
        request: the resolver's request as ``assemble`` made it (alias resolved, slim options, ``--arch``).
        plan_on: the kind's snapshot -> the plan ``attnforge plan --snapshot`` shows for that machine.
    """

    request: Request
    plan_on: Callable[[SystemSnapshot], Plan]


def assemble_for_kinds(requirements: Sequence[str], args: RequestArgs, snapshots: Sequence[SystemSnapshot], *,
                       home: Path, environ: Mapping[str, str] | None = None,
                       on_note: Callable[[str], None] | None = None) -> list[KindRequest]:
    """One :class:`KindRequest` per requirement (or one for ``args.source`` alone), validated on the first
    snapshot (a bad name or option is bad input before any kind is planned).

    Args:
        requirements: ``NAME`` or ``NAME<specifier>`` texts, as ``attnforge plan`` takes them.
        args: the shared options (``--source``, ``--arch``, listings, slim options); ``requirement`` and
            ``snapshot_path`` are set here.
        snapshots: the kinds' snapshots (at least one).
        home: ``$ATTNFORGE_HOME`` of the head (the kinds' snapshot files go under ``fleet/kinds/``).
        on_note: each distinct note once (an alias that was taken, a listing that failed).

    Raises:
        UsageError: a bad requirement, option or source, or no requirement and no ``--source`` (exit 2).
    """
    seen: set[str] = set()

    def note(line: str) -> None:
        if line not in seen and on_note is not None:
            seen.add(line)
            on_note(line)

    texts: Sequence[str | None] = requirements or [None]
    out = []
    for text in texts:
        base = dataclasses.replace(args, requirement=text)
        memo: dict[str, Assembled] = {}

        def assembled(snapshot: SystemSnapshot, base: RequestArgs = base,
                      memo: dict[str, Assembled] = memo) -> Assembled:
            path = snapshot_file(home, snapshot)
            if path.name not in memo:
                memo[path.name] = assemble(dataclasses.replace(base, snapshot_path=path), environ=environ,
                                           on_note=note)
            return memo[path.name]

        first = assembled(snapshots[0])

        def plan_on(snapshot: SystemSnapshot, assembled: Callable[[SystemSnapshot], Assembled] = assembled) -> Plan:
            wanted = assembled(snapshot)
            return wanted.planner(wanted.request, cached=())

        out.append(KindRequest(request=first.request, plan_on=plan_on))
    return out


def snapshot_file(home: Path, snapshot: SystemSnapshot) -> Path:
    """``$ATTNFORGE_HOME/fleet/kinds/<sha256[:16]>.json``: ``snapshot`` as a file ``assemble`` reads (written once)."""
    text = snapshot.to_json(indent=None)
    path = home / "fleet" / "kinds" / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text.encode())
    return path
