"""The one room where a user's request is assembled: command-line words -> :class:`Request`, the machine, the
wheel listings and the cached entries, bound into the resolver exactly as ``install`` calls it.

``attnforge plan``, ``attnforge build`` and ``attnforge install`` all call :func:`assemble`, so they accept the
same names (the catalog ids and their aliases), version specifiers, ``--source`` strings, slim options and
``--snapshot``, and ``plan`` shows the plan ``install`` executes (:meth:`Assembled.plan`). It lives in
``install/`` rather than ``resolve/`` because it reads the cache and the network listings, which sit above the
pure resolver in the layer table (docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnforge import _serde
from attnforge.errors import UsageError
from attnforge.resolve.types import CachedArtifact, Plan, Request, SourceKind, SourceSpec, WheelRef
from attnforge.types.binary import AbiKind
from attnforge.types.cc import ComputeCapability, parse_cc_list

if TYPE_CHECKING:
    from attnforge.catalog import Catalog
    from attnforge.catalog.backends import Backend
    from attnforge.catalog.recipes import Recipe
    from attnforge.catalog.slim import SlimRequest
    from attnforge.install.flow import Planner
    from attnforge.probe.snapshot import SystemSnapshot

_ARCHIVES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip")


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestArgs:
    """The words of a request as the user typed them (every verb's shared options).

    Attributes:
        requirement: ``NAME`` or ``NAME<specifier>`` (``flash_attn``, ``flash-attn>=2.7``); None with ``source``.
        source: ``--source`` text (a directory, an sdist, an sdist URL, ``git+URL[@REF][#subdirectory=DIR]``).
        name: the distribution name of a ``--source`` build (``build --name``); default from the source.
        archs: ``--arch`` texts (``"9.0,12.0"``); none means the detected GPUs'.
        snapshot_path: a saved ``attnforge probe --json`` instead of probing this machine.
        head_dims, dtypes, no_backward, features, model_config: the slim build options.
        abi: ``--abi`` (``torch`` or ``torch-stable``); None takes either.
    """

    requirement: str | None = None
    source: str | None = None
    name: str | None = None
    archs: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    index_urls: tuple[str, ...] = ()
    from_source: bool = False
    offline: bool = False
    allow_unsupported_compiler: bool = False
    head_dims: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    no_backward: bool = False
    features: tuple[str, ...] = ()
    model_config: Path | None = None
    snapshot_path: Path | None = None
    abi: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Assembled:
    """A request with everything the resolver reads, and the planner ``install`` uses.

    Attributes:
        request: the resolver's input.
        catalog: ``load_catalog()``.
        snapshot: the machine (probed for the asked backend only, or loaded from ``--snapshot``).
        home: ``$ATTNFORGE_HOME`` (the store's root, the build logs, the listing cache).
        planner: :func:`attnforge.install.defaults.resolver_planner` bound to the above and the listings.
        projects: the distribution names of the backend (its wheels, its cache entries, its sdist).
        notes: what the user should read (an alias that was taken, a listing that failed, a cached listing's
            age), in the order they arose; a known source's lines appear once the planner listed it.
    """

    request: Request
    catalog: Catalog
    snapshot: SystemSnapshot
    home: Path
    planner: Planner
    projects: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)

    def cached(self) -> list[CachedArtifact]:
        """The store's wheels (none when there is no store yet: a what-if creates none)."""
        from attnforge.cache import Store

        if not (self.home / "cache.db").exists():
            return []
        return Store(self.home).cached_artifacts()

    def plan(self) -> Plan:
        """The plan ``install`` would execute now (the same planner, the same cached entries)."""
        return self.planner(self.request, cached=self.cached())


def assemble(args: RequestArgs, *, build: bool = False, environ: Mapping[str, str] | None = None,
             on_note: Callable[[str], None] | None = None) -> Assembled:
    """Turn ``args`` into the resolver's inputs: the one place every verb does it.

    Args:
        args: the words of the request.
        build: ``attnforge build``: the request is a build (``from_source``), and no listing is read.
        environ: the environment (``$ATTNFORGE_HOME``, the wheel-source switches); ``os.environ`` when None.
        on_note: called with each note as it arises (the CLI prints them to stderr).

    Raises:
        UsageError: an unknown backend (with the known ids), a bad requirement, version, ``--arch``, slim option
            or ``--source``, a missing ``--find-links`` directory or an unreadable ``--snapshot``.
    """
    from attnforge._system.paths import home_dir
    from attnforge.catalog import load_catalog

    env = os.environ if environ is None else environ
    notes: list[str] = []

    def note(line: str) -> None:
        notes.append(line)
        if on_note is not None:
            on_note(line)

    catalog = load_catalog()
    # a local --source must exist when it is read here; a what-if (--snapshot) may name a path of that machine
    source = _source(args.source, must_exist=build or args.snapshot_path is None)
    name, version = _name(args, source, catalog, note)
    request = Request(backend=name, version=version, archs=parse_archs(args.archs), find_links=args.find_links,
                      index_urls=args.index_urls, from_source=args.from_source or build, offline=args.offline,
                      source=source, allow_unsupported_compiler=args.allow_unsupported_compiler,
                      slim=slim_request(args), abi=AbiKind(args.abi) if args.abi else None)
    home = home_dir(env)
    backend = catalog.backends.get(name)
    snapshot = _snapshot(args.snapshot_path, home, backend)
    recipe = catalog.recipe(name)
    projects = (*(backend.distributions if backend else (name,)),
                *((recipe.distribution,) if recipe and recipe.distribution else ()))
    from attnforge.fetch.indexes import list_wheels, with_local_sdist

    request = with_local_sdist(request, projects)  # an sdist in the wheelhouse builds offline
    if not build and args.source and request.source is not None:  # the cache serves a --source only its bytes' build
        request = dataclasses.replace(request, source_sha256=source_sha256(request, recipe))
    if backend is not None and args.snapshot_path is None:  # this interpreter's install: what it can serve
        from attnforge.cache.capabilities import installed_capabilities

        request = dataclasses.replace(request, installed_capabilities=installed_capabilities(backend.distributions),
                                      installed_verify_failure=_verify_failure(snapshot, name, home))
    from attnforge.install.defaults import resolver_planner

    if build:
        planner = resolver_planner(snapshot, catalog, (), home)
        return Assembled(request=request, catalog=catalog, snapshot=snapshot, home=home, planner=planner,
                         projects=projects, notes=notes)
    # the places the user named are listed now (a bad one is bad input); the known release sources only when
    # the plan gets past the installed backend and the cache (they ask servers; a cache hit needs none)
    listing = list_wheels(args.find_links, args.index_urls, projects, offline=args.offline)
    for line in listing.problems:
        note(line)

    def more_wheels() -> tuple[WheelRef, ...]:
        from attnforge.fetch.listings import known_source_wheels

        known = known_source_wheels(name, snapshot, offline=args.offline, environ=env,
                                    from_source=args.from_source or source is not None)
        for line in known.problems:
            note(line)
        return known.wheels

    planner = resolver_planner(snapshot, catalog, listing.wheels,
                               home if args.snapshot_path is None else None, more_wheels=more_wheels)
    return Assembled(request=request, catalog=catalog, snapshot=snapshot, home=home, planner=planner,
                     projects=projects, notes=notes)


def _source(text: str | None, *, must_exist: bool) -> SourceSpec | None:
    if not text:
        return None
    from attnforge.build.source import local_source_problem, parse_source

    source = parse_source(text)
    problem = local_source_problem(source) if must_exist else None
    if problem is not None:
        raise UsageError(f"--source {text}: {problem}",
                         hint="give a project directory (setup.py or pyproject.toml), an sdist, git+URL@REF or an "
                              "sdist URL")
    return source


def _name(args: RequestArgs, source: SourceSpec | None, catalog: Catalog, note: Callable[[str], None],
          ) -> tuple[str, str]:
    """(backend id or free name, version specifier); an alias becomes its id with a note."""
    if args.requirement is None and source is None:
        raise UsageError("name a backend or give --source",
                         hint="e.g. flash-attn, flash-attn==2.8.3, or --source ./causal-conv1d")
    if source is not None:  # any torch extension: a free name, from --name, the requirement or the source
        name, version = parse_requirement(args.requirement) if args.requirement else ("", "")
        return args.name or name or name_from_source(source), version
    return catalog_requirement(args.requirement or "", catalog, note)  # not None: checked above


def catalog_requirement(text: str, catalog: Catalog, note: Callable[[str], None] = lambda _line: None,
                        ) -> tuple[str, str]:
    """``flash_attn==2.8.3`` -> (``flash-attn``, ``==2.8.3``): a requirement on a catalog backend, an alias taken as
    its id with a ``note`` (``sageattention`` -> ``sageattention-2``; :func:`attnforge.resolve.sources.resolve_name`).

    Raises:
        UsageError: not ``NAME`` or ``NAME<specifier>``; a name that is neither an id nor an alias (the hint lists
            the known ids and the closest one).
    """
    from attnforge.resolve.sources import resolve_name

    name, version = parse_requirement(text)
    name, alias = resolve_name(name, catalog)
    if alias:
        note(alias)
    return catalog.backend(name).id, version


def _snapshot(path: Path | None, home: Path, backend: Backend | None) -> SystemSnapshot:
    from attnforge.probe import SystemSnapshot, collect_snapshot
    from attnforge.probe.context import ProbeContext

    if path is not None:
        return SystemSnapshot.load(path)
    # only the backend asked for: its import probe decides "already installed"; each other backend's probe
    # imports torch again (seconds per backend on a GPU machine) and no plan reads it
    return collect_snapshot(ProbeContext(torch_memo=home / "probe"), backends=[backend] if backend else [])


def _verify_failure(snapshot: SystemSnapshot, backend: str, home: Path) -> str | None:
    """The summary of the latest verify of the installed version of ``backend`` on this device, if it failed
    (read from ``home``'s records when there are any; none are created)."""
    if not (home / "records.db").exists():
        return None
    from attnforge.records import RecordStore

    state = snapshot.backend(backend)
    record = RecordStore(home).read_or_empty(snapshot.device_key())[0].get(backend)  # damaged: no record
    if record is None or record.ok or state is None or record.backend_version != state.version:
        return None
    return record.summary


def parse_requirement(text: str) -> tuple[str, str]:
    """``flash-attn==2.8.3`` -> (``flash-attn``, ``==2.8.3``).

    Raises:
        UsageError: not ``NAME`` or ``NAME<specifier>``.
    """
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(text)
    except InvalidRequirement:
        raise UsageError(f"not a backend requirement: {text!r}",
                         hint="write BACKEND or BACKEND==VERSION, e.g. flash-attn==2.8.3") from None
    if req.extras or req.marker or req.url:
        raise UsageError(f"extras, markers and URLs are not supported here: {text!r}",
                         hint="write BACKEND or BACKEND==VERSION; use --find-links/--index-url for wheels")
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


def source_sha256(request: Request, recipe: Recipe | None) -> str | None:
    """The sha256 the build of ``request.source`` will record (the tree the recipe builds: a local ``hopper/`` is
    its repository's tree), computed now; None for a remote source. See :func:`attnforge.build.source.fetch`."""
    from attnforge.build.source import local_sha256
    from attnforge.resolve.buildspec import default_source

    assert request.source is not None  # noqa: S101 - the caller checks
    return local_sha256(default_source(recipe, request) if recipe is not None else request.source)


def name_from_source(source: SourceSpec) -> str:
    """A distribution name for a ``--source`` build: the name a local tree's metadata declares (``pyproject.toml``,
    ``setup.cfg``, ``setup.py``; :func:`attnforge.build.metadata.declared_name`), else the leaf of its location
    (``name-1.0.tar.gz`` -> name)."""
    if source.kind is SourceKind.PATH:
        from attnforge.build.metadata import declared_name

        tree = Path(source.location).expanduser()
        declared = declared_name(tree / source.subdirectory if source.subdirectory else tree)
        if declared:
            return declared
    leaf = source.location.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")
    for suffix in _ARCHIVES:
        if leaf.lower().endswith(suffix):
            leaf = leaf[: -len(suffix)].rsplit("-", 1)[0]
    return (source.subdirectory or leaf).rstrip("/").rsplit("/", 1)[-1] or "source"


def slim_request(args: RequestArgs) -> SlimRequest | None:
    """The slim options as a :class:`~attnforge.catalog.slim.SlimRequest`; None when none was given.

    Raises:
        UsageError: a bad head dim, dtype or config file.
    """
    from attnforge.catalog.slim import SlimRequest, parse_dtypes, parse_head_dims

    from_model = model_head_dims(args.model_config) if args.model_config is not None else ()
    dims, pairs = parse_head_dims((*args.head_dims, *from_model))
    dtypes = parse_dtypes(args.dtypes)
    # an option given with nothing in it (``--dtype ""``): a slim build of every dtype dropped the optional
    # features silently, and ``--head-dim ""`` was ignored (a CLI fuzz, 2026-12-03)
    for option, given, parsed in (("--dtype", args.dtypes, dtypes), ("--head-dim", args.head_dims, dims or pairs)):
        if given and not parsed:
            raise UsageError(f"{option} {' '.join(map(repr, given))} names nothing",
                             hint=f"write e.g. {option} {'bf16' if option == '--dtype' else '64,128'}, or leave it out")
    wanted = [t.strip() for v in args.features for t in v.split(",") if t.strip()]
    if not (dims or pairs or dtypes or args.no_backward or wanted):
        return None
    return SlimRequest(head_dims=dims, head_dim_pairs=pairs, dtypes=dtypes,
                       backward=not args.no_backward, features=tuple(dict.fromkeys(wanted)))


def model_head_dims(path: Path) -> tuple[str, ...]:
    """Head dims of a Hugging Face ``config.json`` as ``--head-dim`` text: ``head_dim``, else
    ``hidden_size / num_attention_heads``; ``"192x128"`` when the model's qk head dim (``qk_head_dim``, or
    ``qk_nope_head_dim + qk_rope_head_dim``) differs from its ``v_head_dim``; a multimodal config's
    ``text_config`` when the top level has none.

    Raises:
        UsageError: unreadable, not JSON, or no head dim in it.
    """

    from attnforge._system.files import read_user_file

    hint = "give the model's config.json (Hugging Face format)"
    text = read_user_file(path, what="the model config", hint=hint)  # missing, unreadable, not UTF-8: one wording
    try:
        doc = _serde.loads(text)
    except ValueError as exc:
        raise UsageError(f"cannot read the model config {path}: {exc}", hint=hint) from None
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
