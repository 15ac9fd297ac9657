"""``attnforge plan BACKEND[==VERSION]``: what attnforge would do here, and why every other way is ruled out.

Exit codes: 0 something is viable, 1 nothing is (every reason shown), 2 bad input (unknown
backend, unreadable snapshot, bad --arch) with a hint.
"""

from __future__ import annotations

from typing import Any

import click

from attnforge.cli._output import console, emit_json, json_option
from attnforge.cli._request import request_args, request_options
from attnforge.resolve.types import Candidate, Plan


@click.command("plan")
@request_options
@json_option
def command(*, as_json: bool, **params: Any) -> int:
    """Explain what `attnforge install` would do here for the same arguments: every candidate, accepted or
    rejected, in the order install tries them."""
    from attnforge.provision.plan import plan

    planned = plan(request_args(params))
    if as_json:
        emit_json("plan", _plan_doc(planned.plan, planned.notes, planned.expected_s))
    else:
        _render(planned.plan, planned.notes, planned.expected_s, planned.measured)
    return 0 if planned.plan.viable else 1


def _plan_doc(plan: Plan, problems: tuple[str, ...], expected: dict[str, float | None]) -> dict[str, Any]:
    """What ``plan --json`` prints: the plan (its backend, verdict, chosen candidate, every candidate, request),
    the listing problems, the expected seconds of each route kind (wheel_sources.toml or this machine's builds)
    and the chosen build's SlimPlan (switches, what it leaves out, both time estimates)."""
    chosen = plan.chosen
    return {"backend": plan.request.backend, "viable": plan.viable, "chosen": chosen, "candidates": plan.candidates,
            "request": plan.request, "listing_problems": problems, "expected_s": expected,
            "slim": chosen.build.slim if chosen and chosen.build else None}


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
        _render_slim(out, b)


def _expected(c: Candidate, expected: dict[str, float | None], measured: bool) -> str:
    """`` (expected ~15 s)``: the route's time: an earlier build here, a slim build's estimate (its translation
    units), or wheel_sources.toml [route_times]."""
    secs = expected.get(c.kind.value)
    if secs is None or not c.accepted:
        return ""
    how = ", measured by an earlier build here" if measured and c.kind.value == "source" else ""
    return f" (expected ~{secs / 60:.0f} min{how})" if secs >= 120 else f" (expected ~{secs:.0f} s{how})"


def _render_slim(out: Any, build: Any) -> None:
    from attnforge.provision.plan import minutes

    slim = build.slim
    if slim is None:
        offer = next((n for n in build.notes if n.startswith("a slim build is much cheaper")), None)
        if offer:
            out.print(f"note: {offer}", soft_wrap=True, markup=False)
        return
    out.print("[bold]slim build[/bold] (only what was asked for):")
    for line in slim.left_out:
        out.print(f"  leaves out {line}", soft_wrap=True, markup=False)
    out.print(f"  can run: {slim.capabilities.describe()}", soft_wrap=True, markup=False)
    if slim.units is not None:
        out.print(f"  time: slim {slim.units} translation units, ~{minutes(slim.estimate_s)}; full "
                  f"{slim.full_units} translation units, ~{minutes(slim.full_estimate_s)} (estimated from one "
                  "recorded build)", soft_wrap=True, markup=False)
