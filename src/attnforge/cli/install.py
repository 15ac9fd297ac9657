"""``attnforge install BACKEND[==VER]``: plan, then cache / wheel / build, then pip install, then verify.

Acts on this machine and the interpreter attnforge runs in (no ``--snapshot``: installing is not a what-if).
Exit codes: 0 installed (and verified, unless --no-verify), 1 not possible here or verification failed,
2 bad input.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from attnforge.cli._output import console, emit_json, json_option
from attnforge.cli.build import allow_unsupported_option, unsupported_compiler_warning
from attnforge.cli.plan import slim_options, slim_request
from attnforge.errors import ResolveError

if TYPE_CHECKING:
    from attnforge.install.flow import InstallResult
    from attnforge.probe.snapshot import SystemSnapshot


@click.command("install")
@click.argument("requirement")
@click.option("--source", "source", default=None, metavar="PATH_OR_URL",
              help="Build from this source (a directory, an sdist, an sdist URL, or "
              "git+URL[@REF][#subdirectory=DIR]; a directory may end in #subdirectory=DIR too); allows names "
              "outside the catalog.")
@click.option("--from-source", is_flag=True, help="Skip prebuilt wheels and build (the cache is still used).")
@click.option("--find-links", "find_links", multiple=True, metavar="DIR",
              help="A directory of wheels to consider.")
@click.option("--index-url", "index_urls", multiple=True, metavar="URL",
              help="A PEP 503 index to consider (e.g. file:///shared/attnforge/simple from `cache export`).")
@click.option("--offline", is_flag=True, help="Never touch the network (cache, find-links, file:// indexes).")
@click.option("--arch", "archs", multiple=True, metavar="CC[,CC]",
              help="Target compute capabilities, e.g. 9.0,12.0 (default: the detected GPUs').")
@click.option("--no-verify", is_flag=True, help="Skip the numerical check after installing.")
@click.option("--allow-overlap", is_flag=True,
              help="Install even if the wheel ships files another installed distribution owns (they are "
              "replaced, and uninstalling either later deletes them for both); refused by default.")
@click.option("--require-hashes", is_flag=True,
              help="Refuse a wheel whose sha256 is not published where it comes from (else its hash is "
              "recorded on first use and shown as such).")
@allow_unsupported_option
@slim_options
@json_option
def command(requirement: str, *, head_dims: tuple[str, ...], dtypes: tuple[str, ...], no_backward: bool,
            features: tuple[str, ...], model_config: Path | None, source: str | None, from_source: bool,
            find_links: tuple[str, ...],
            index_urls: tuple[str, ...], offline: bool, archs: tuple[str, ...], no_verify: bool,
            allow_overlap: bool, allow_unsupported_compiler: bool, as_json: bool, require_hashes: bool) -> int:
    """Get BACKEND working in this interpreter: from the cache, a hash-checked wheel, or a build."""
    from attnforge._system.runner import SubprocessRunner
    from attnforge.build.source import parse_source
    from attnforge.cache import open_store
    from attnforge.catalog import load_catalog
    from attnforge.cli.plan import parse_archs, parse_requirement
    from attnforge.install import defaults
    from attnforge.install.flow import install
    from attnforge.probe import collect_snapshot
    from attnforge.probe.context import ProbeContext
    from attnforge.report.doctor import install_step
    from attnforge.resolve.listing import Listing, list_wheels, with_local_sdist
    from attnforge.resolve.types import Request

    name, spec = parse_requirement(requirement)
    catalog = load_catalog()
    if source is None:
        from attnforge.resolve.sources import resolve_name

        name, name_note = resolve_name(name, catalog)  # sageattention -> sageattention-2, flash_attn -> flash-attn
        if name_note:
            click.echo(f"note: {name_note}", err=True)
        name = catalog.backend(name).id  # UsageError (exit 2) listing the known ids
    request = Request(backend=name, version=spec, archs=parse_archs(archs), find_links=find_links,
                      index_urls=index_urls, from_source=from_source, offline=offline,
                      source=parse_source(source) if source else None,
                      allow_unsupported_compiler=allow_unsupported_compiler,
                      slim=slim_request(head_dims=head_dims, dtypes=dtypes, no_backward=no_backward,
                                        features=features, model_config=model_config))
    store = open_store()
    backend = catalog.backends.get(name)
    # only the backend asked for: its import probe decides "already installed"; each other backend's probe
    # imports torch again (seconds per backend on a GPU machine) and nothing of an install reads it
    snapshot = collect_snapshot(ProbeContext(torch_memo=store.root / "probe"),
                                backends=[backend] if backend is not None else [])
    recipe = catalog.recipe(name)
    projects = [*(backend.distributions if backend else (name,)),
                *([recipe.distribution] if recipe and recipe.distribution else [])]
    request = with_local_sdist(request, projects)  # an sdist in the wheelhouse builds offline
    if backend is not None:  # a slim build installed here serves only what it was built for
        from attnforge.cache.capabilities import installed_capabilities

        request = dataclasses.replace(request, installed_capabilities=installed_capabilities(backend.distributions),
                                      installed_verify_failure=_verify_failure(snapshot, name, store.root))
    from attnforge.fetch.listings import known_source_wheels

    def notes(listing: Listing) -> Listing:
        for line in listing.problems:
            click.echo(f"note: {line}", err=True)
        return listing

    # the places the user named are listed now (a bad one is bad input); the known release sources only when
    # the plan gets past the installed backend and the cache (they ask servers; a cache hit needs none)
    listing = notes(list_wheels(find_links, index_urls, projects, offline=offline))
    runner = SubprocessRunner()
    try:
        result = install(
            request, snapshot=snapshot, store=store,
            planner=defaults.resolver_planner(
                snapshot, catalog, listing.wheels, store.root,
                more_wheels=lambda: notes(known_source_wheels(
                    name, snapshot, offline=offline, from_source=from_source or bool(source))).wheels),
            builder=defaults.source_builder,
            verifier=None if no_verify else defaults.subprocess_verifier(runner, catalog),
            runner=runner, python=sys.executable, fetch_index=defaults.index_fetcher(catalog, runner),
            allow_overlap=allow_overlap, require_hashes=require_hashes,
        )
    except ResolveError as exc:
        if backend is not None and "{torch_index}" in backend.install and not index_urls:
            # e.g. PyPI's xformers is the CUDA 12.8 build; a cu130 torch needs the PyTorch index's build
            exc.hint = (f"this torch needs the {backend.display_name} build for its CUDA: "
                        f"{install_step(snapshot, backend)}")
        raise
    built = result.plan.chosen.build if result.action == "built" and result.plan.chosen else None
    warning = unsupported_compiler_warning(built) if built is not None else None
    if warning:
        click.echo(warning, err=True)
    if as_json:
        emit_json("install", result)
    else:
        _render(result)
    return 0 if result.ok else 1


def _render(result: InstallResult) -> None:
    from rich.text import Text

    out = console()
    what = {
        "cache-hit": "from the cache",
        "wheel": "from a wheel whose published sha256 matched, now cached" if result.hash_source == "published"
        else "from a wheel with no published sha256 (hash recorded on first use, not published), now cached",
        "built": "built from source, now cached", "already-installed": "already installed",
    }[result.action]
    chosen = result.plan.chosen
    out.print(f"[bold]{result.request.backend}[/bold]: {what}", soft_wrap=True)
    if chosen is not None:
        out.print(f"  plan: [{chosen.kind.value}] {chosen.description}", soft_wrap=True, markup=False)
        if chosen.build is not None and chosen.build.capabilities is not None:
            out.print(f"  slim build, can run: {chosen.build.capabilities.describe()}", soft_wrap=True, markup=False)
    if result.cache_key:
        out.print(f"  cache key: {result.cache_key}", soft_wrap=True)
    if result.pip is not None:
        out.print(f"  installed {result.pip.name} {result.pip.version} into {result.pip.python} "
                  f"(torch {result.pip.torch_version or 'absent'}, unchanged)", soft_wrap=True, markup=False)
    if result.verification is not None:
        v = result.verification
        mark = {True: "[green]verified[/green]", False: "[red]verification failed[/red]"}.get(
            v.ok, "not verified"  # type: ignore[arg-type]
        )
        out.print(f"  {mark}: {v.summary}", soft_wrap=True)
    for w in result.warnings:  # plain text: a path or requirement may hold [brackets]
        out.print(Text.assemble("  ", ("note", "yellow"), ": ", w), soft_wrap=True)
    timings = ", ".join(f"{k} {v:.2f} s" for k, v in result.timings_s.items())
    if timings:
        out.print(f"  time: {timings}", soft_wrap=True)


def _verify_failure(snapshot: SystemSnapshot, backend: str, home: Path) -> str | None:
    """The summary of the latest verify of the installed version of ``backend`` on this device (records under
    ``home``, the store's root), if it failed."""
    from attnforge.records import RecordStore
    from attnforge.report.identity import snapshot_device_key

    state = snapshot.backend(backend)
    record = RecordStore(home).latest_verify(snapshot_device_key(snapshot)).get(backend)
    if record is None or record.ok or state is None or record.backend_version != state.version:
        return None
    return record.summary
