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
    expected_s: dict[str, float | None]  # expected seconds of each route kind (wheel_sources.toml)


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
    from attnforge.fetch.listings import known_source_wheels, merged
    from attnforge.resolve.listing import Listing, list_wheels, with_local_sdist
    from attnforge.resolve.resolver import resolve
    from attnforge.resolve.sources import resolve_name
    from attnforge.resolve.types import Request

    name, spec = parse_requirement(requirement)
    catalog = load_catalog()
    name, name_note = resolve_name(name, catalog)
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
    listing = merged(
        list_wheels(find_links, index_urls, projects, offline=offline),
        known_source_wheels(backend.id, snapshot, offline=offline, from_source=from_source),
    )
    if name_note:
        listing = merged(Listing(wheels=(), problems=(name_note,)), listing)
    plan = resolve(snapshot, catalog, request, wheels=listing.wheels)
    expected = {k: _route_s(k, backend.id) for k in dict.fromkeys(c.kind.value for c in plan.candidates)}
    measured = _measured_build_s(projects) if "source" in expected else None
    if measured is not None:
        expected["source"] = measured
    result = PlanResult(
        backend=backend.id,
        viable=plan.viable,
        chosen=plan.chosen,
        candidates=plan.candidates,
        request=request,
        listing_problems=listing.problems,
        expected_s=expected,
    )
    if as_json:
        emit_json("plan", result)
    else:
        _render(plan, listing.problems, result.expected_s, measured is not None)
    return 0 if plan.viable else 1


def _render(plan: Plan, problems: tuple[str, ...], expected: dict[str, float | None], measured: bool) -> None:
    from rich.markup import escape

    out = console()
    out.print(f"[bold]plan for {escape(plan.request.backend + plan.request.version)}[/bold]")
    for i, c in enumerate(plan.candidates, 1):
        mark = "[green]accepted[/green]" if c.accepted else "[red]rejected[/red]"
        when = _expected(c, expected, measured)
        out.print(f"{i}. {escape(f'[{c.kind.value}] {c.description}')}: {mark}{when}", soft_wrap=True)
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


def _expected(c: Candidate, expected: dict[str, float | None], measured: bool) -> str:
    """`` (expected ~15 s)``: the route's time, measured here or from wheel_sources.toml [route_times]."""
    secs = expected.get(c.kind.value)
    if secs is None or not c.accepted:
        return ""
    how = ", measured by an earlier build here" if measured and c.kind.value == "source" else ""
    return f" (expected ~{secs / 60:.0f} min{how})" if secs >= 120 else f" (expected ~{secs:.0f} s{how})"


def _measured_build_s(projects: list[str]) -> float | None:
    """The duration of the newest build of one of ``projects`` in the local cache (its build log), if any."""
    import os

    from packaging.utils import canonicalize_name

    from attnforge._system.paths import home_dir
    from attnforge.cache import Store
    from attnforge.resolve.sources import build_seconds

    home = home_dir(os.environ)
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


def _route_s(kind: str, backend: str) -> float | None:
    from attnforge.resolve.sources import load_wheel_sources

    return load_wheel_sources().route_times.expected_s(kind, backend)
