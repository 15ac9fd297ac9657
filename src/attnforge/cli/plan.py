"""``attnforge plan BACKEND[==VERSION]``: what attnforge would do here, and why every other way is ruled out.

Exit codes: 0 something is viable, 1 nothing is (every reason shown), 2 bad input (unknown
backend, unreadable snapshot, bad --arch) with a hint.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from attnforge.cli._output import console, emit_json, json_option, load_or_probe, snapshot_option
from attnforge.errors import UsageError
from attnforge.resolve.types import Candidate, Plan
from attnforge.types.cc import ComputeCapability, parse_cc_list


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanResult:
    """What ``plan --json`` prints: the plan, the verdict, the chosen candidate and listing problems."""

    backend: str
    viable: bool
    chosen: Candidate | None
    candidates: tuple[Candidate, ...]
    request: Any
    listing_problems: tuple[str, ...]


def parse_requirement(text: str) -> tuple[str, str]:
    """``flash-attn==2.8.3`` -> (``flash-attn``, ``==2.8.3``).

    Raises:
        UsageError: not ``NAME`` or ``NAME<specifier>``.
    """
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(text)
    except InvalidRequirement:
        raise UsageError(
            f"not a backend requirement: {text!r}",
            hint="write BACKEND or BACKEND==VERSION, e.g. flash-attn==2.8.3",
        ) from None
    if req.extras or req.marker or req.url:
        raise UsageError(
            f"extras, markers and URLs are not supported here: {text!r}",
            hint="write BACKEND or BACKEND==VERSION; use --find-links/--index-url for wheels",
        )
    return req.name, str(req.specifier)


def parse_archs(values: tuple[str, ...]) -> tuple[ComputeCapability, ...] | None:
    """``("9.0,12.0",)`` or ``("9.0", "12.0")`` -> ``((9, 0), (12, 0))``; nothing -> None.

    Raises:
        UsageError: an entry is not a compute capability.
    """
    try:
        return parse_cc_list(values) or None
    except ValueError as exc:
        raise UsageError(str(exc), hint="write compute capabilities like --arch 9.0,12.0") from None


@click.command("plan")
@click.argument("requirement")
@snapshot_option
@click.option(
    "--arch",
    "archs",
    multiple=True,
    metavar="CC[,CC]",
    help="Target compute capabilities, e.g. 9.0,12.0 (default: the detected GPUs').",
)
@click.option(
    "--find-links", "find_links", multiple=True, metavar="DIR", help="A directory of wheels to consider."
)
@click.option("--index-url", "index_urls", multiple=True, metavar="URL", help="A PEP 503 index to consider.")
@click.option("--from-source", is_flag=True, help="Skip prebuilt binaries and plan a build.")
@click.option(
    "--offline", is_flag=True, help="Never touch the network (find-links and file:// indexes only)."
)
@json_option
def command(
    *,
    requirement: str,
    snapshot_path: Path | None,
    archs: tuple[str, ...],
    find_links: tuple[str, ...],
    index_urls: tuple[str, ...],
    from_source: bool,
    offline: bool,
    as_json: bool,
) -> int:
    """Explain what attnforge would do to get BACKEND working here: every candidate, accepted or rejected."""
    from attnforge.catalog import load_catalog
    from attnforge.resolve.listing import list_wheels, with_local_sdist
    from attnforge.resolve.resolver import resolve
    from attnforge.resolve.types import Request

    name, spec = parse_requirement(requirement)
    catalog = load_catalog()
    backend = catalog.backend(name)  # UsageError (exit 2) with the known ids
    request = Request(
        backend=backend.id,
        version=spec,
        archs=parse_archs(archs),
        find_links=find_links,
        index_urls=index_urls,
        from_source=from_source,
        offline=offline,
    )
    snapshot = load_or_probe(snapshot_path)
    recipe = catalog.recipe(backend.id)
    projects = list(backend.distributions) + ([recipe.distribution] if recipe and recipe.distribution else [])
    request = with_local_sdist(request, projects)
    listing = list_wheels(find_links, index_urls, projects, offline=offline)
    plan = resolve(snapshot, catalog, request, wheels=listing.wheels)
    result = PlanResult(
        backend=backend.id,
        viable=plan.viable,
        chosen=plan.chosen,
        candidates=plan.candidates,
        request=request,
        listing_problems=listing.problems,
    )
    if as_json:
        emit_json("plan", result)
    else:
        _render(plan, listing.problems)
    return 0 if plan.viable else 1


def _render(plan: Plan, problems: tuple[str, ...]) -> None:
    from rich.markup import escape

    out = console()
    out.print(f"[bold]plan for {escape(plan.request.backend + plan.request.version)}[/bold]")
    for i, c in enumerate(plan.candidates, 1):
        mark = "[green]accepted[/green]" if c.accepted else "[red]rejected[/red]"
        out.print(f"{i}. {escape(f'[{c.kind.value}] {c.description}')}: {mark}", soft_wrap=True)
        for r in c.reasons:
            out.print(f"     - {r}", soft_wrap=True, markup=False)
    for p in problems:
        out.print(f"note: {p}", soft_wrap=True, markup=False)
    chosen = plan.chosen
    if chosen is None:
        out.print("[red]nothing is viable here[/red]: every candidate above says why")
        return
    out.print(f"chosen: [{chosen.kind.value}] {chosen.description}", soft_wrap=True, markup=False)
    if chosen.build is not None:
        b = chosen.build
        out.print(f"build root: {b.build_root}", soft_wrap=True, markup=False)
        out.print("build environment:")
        for k, v in b.env.items():
            out.print(f"  {k}={v}", soft_wrap=True, markup=False)
