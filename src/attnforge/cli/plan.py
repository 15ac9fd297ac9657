"""``attnforge plan BACKEND[==VERSION]``: what attnforge would do here, and why every other way is ruled out.

Exit codes: 0 something is viable, 1 nothing is (every reason shown), 2 bad input (unknown
backend, unreadable snapshot, bad --arch) with a hint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from attnforge.cli._output import console, emit_json, json_option, load_or_probe, snapshot_option
from attnforge.errors import UsageError
from attnforge.resolve.types import Candidate, Plan
from attnforge.types.cc import ComputeCapability, parse_cc_list

if TYPE_CHECKING:
    from attnforge.catalog.slim import SlimRequest

F = TypeVar("F", bound=Callable[..., Any])


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
    slim: Any = None  # the chosen build's SlimPlan: switches, what it leaves out, both time estimates


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


def slim_options(func: F) -> F:
    """``--head-dim``, ``--dtype``, ``--no-backward``, ``--features``, ``--model`` (plan, build, install)."""
    options = [
        click.option("--head-dim", "head_dims", multiple=True, metavar="D[,D]",
                     help="Slim build: only these head dims (e.g. 64,128); a kernel serves every D up to its own."),
        click.option("--dtype", "dtypes", multiple=True, metavar="T[,T]",
                     help="Slim build: only these dtypes (bf16, fp16, fp8)."),
        click.option("--no-backward", is_flag=True, help="Slim build: forward only (inference)."),
        click.option("--features", "features", multiple=True, metavar="F[,F]",
                     help="Slim build: optional features to keep (paged-kv, varlen, softcap, local, split, ...); "
                          "the others are left out."),
        click.option("--model", "model_config", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Slim build: take the head dims from a Hugging Face config.json."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def slim_request(*, head_dims: tuple[str, ...], dtypes: tuple[str, ...], no_backward: bool,
                 features: tuple[str, ...], model_config: Path | None) -> SlimRequest | None:
    """The slim options as a :class:`SlimRequest`; None when none was given (a full build).

    Raises:
        UsageError: a bad head dim, dtype or config file.
    """
    from attnforge.catalog.slim import SlimRequest, parse_dtypes, parse_head_dims

    from_model = model_head_dims(model_config) if model_config is not None else ()
    dims, pairs = parse_head_dims((*head_dims, *from_model))
    wanted = [t.strip() for v in features for t in v.split(",") if t.strip()]
    if not (dims or pairs or dtypes or no_backward or wanted):
        return None
    return SlimRequest(head_dims=dims, head_dim_pairs=pairs, dtypes=parse_dtypes(dtypes), backward=not no_backward,
                       features=tuple(dict.fromkeys(wanted)))


def model_head_dims(path: Path) -> tuple[str, ...]:
    """Head dims of a Hugging Face ``config.json`` as ``--head-dim`` text: ``head_dim``, else
    ``hidden_size / num_attention_heads``; ``"192x128"`` when the model's qk head dim (``qk_head_dim``, or
    ``qk_nope_head_dim + qk_rope_head_dim``) differs from its ``v_head_dim``; a multimodal config's
    ``text_config`` when the top level has none.

    Raises:
        UsageError: unreadable, not JSON, or no head dim in it.
    """
    import json

    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the model config {path}: {exc}",
                         hint="give the model's config.json (Hugging Face format)") from None
    for cfg in (doc, doc.get("text_config") if isinstance(doc, dict) else None):
        dims = _config_dims(cfg) if isinstance(cfg, dict) else None
        if dims:
            return (dims,)
    raise UsageError(f"{path} names no head dim (head_dim, hidden_size/num_attention_heads, qk_head_dim)",
                     hint="give --head-dim D instead")


def _config_dims(cfg: dict[str, Any]) -> str | None:
    def num(key: str) -> int | None:
        value = cfg.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    qk = num("qk_head_dim") or ((num("qk_nope_head_dim") or 0) + (num("qk_rope_head_dim") or 0)) or None
    v = num("v_head_dim")
    if qk or v:
        return f"{qk}x{v}" if qk and v and qk != v else str(qk or v)
    if num("head_dim"):
        return str(num("head_dim"))
    hidden, heads = num("hidden_size"), num("num_attention_heads")
    return str(hidden // heads) if hidden and heads and hidden % heads == 0 else None


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
@click.option("--source", "source_text", default=None, metavar="PATH_OR_URL",
              help="Plan the build of this source (as build/install --source: a directory, an sdist, an sdist URL, "
                   "or git+URL[@REF], each with an optional #subdirectory=DIR).")
@click.option(
    "--offline", is_flag=True, help="Never touch the network (find-links and file:// indexes only)."
)
@slim_options
@json_option
def command(
    *,
    head_dims: tuple[str, ...],
    dtypes: tuple[str, ...],
    no_backward: bool,
    features: tuple[str, ...],
    model_config: Path | None,
    source_text: str | None,
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
    from attnforge.build.source import parse_source
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
        from_source=from_source or source_text is not None,
        offline=offline,
        source=parse_source(source_text) if source_text else None,
        slim=slim_request(head_dims=head_dims, dtypes=dtypes, no_backward=no_backward, features=features,
                          model_config=model_config),
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
        slim=plan.chosen.build.slim if plan.chosen and plan.chosen.build else None,
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
        _render_slim(out, b)


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


def _render_slim(out: Any, build: Any) -> None:
    from attnforge.resolve.buildspec import minutes

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
