"""The fewest artifacts that serve every machine kind, through the one resolver. Pure.

For each kind and backend, :func:`attnforge.resolve.resolve` decides the route exactly as ``attnforge plan``
does on one machine (installed, cache, a hash-checked prebuilt wheel, a build). The fleet then merges:

- kinds whose route is a build and that share a wheel key (:class:`~attnforge.fleet.kinds.WheelKey`) share one
  build whose ``--arch`` list is the union of their compute capabilities (one fatbin), asked of the resolver
  again on the member with the oldest glibc (then the next, when its toolchain cannot reach every arch);
- a prebuilt wheel counts once however many kinds take it (an abi3 wheel serves several Python versions under
  one file name, a stable-ABI wheel several torch versions).

So the number of builds equals the number of distinct (backend, wheel key) pairs that need a build.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from attnforge._serde import to_jsonable
from attnforge.catalog import Catalog
from attnforge.catalog.recipes import Recipe
from attnforge.fleet.kinds import KindGroup, Node, WheelKey, glibc_key
from attnforge.fleet.requests import KindRequest
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.provision.build import build_flags
from attnforge.resolve.buildspec import build_recipe, plan_build
from attnforge.resolve.cpu_only import cpu_only_source
from attnforge.resolve.resolver import resolve
from attnforge.resolve.sources import load_wheel_sources
from attnforge.resolve.types import BuildSpec, CandidateKind, Plan, Request, WheelRef
from attnforge.types.binary import AbiKind
from attnforge.types.cc import ComputeCapability


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetBuild:
    """One build of the fleet plan.

    Attributes:
        number: k of "build k of K" (1-based).
        key: the artifact key, ``sha256:`` of what changes the binary (:func:`artifact_key`).
        backend: the request's backend id or ``--source`` name.
        request: the request as given to the resolver, ``archs`` set to the union.
        spec: the resolver's :class:`BuildSpec` on the builder kind.
        wheel: the wheel key every kind of the build shares.
        archs: the compute capabilities compiled in (the union of the kinds').
        kinds: ids of the kinds it serves; builder: id of the kind whose nodes build it.
        builder_nodes: the node ids of that kind whose toolchain the resolver accepted for this build.
        gib_per_thread: peak host memory of one nvcc thread (the recipe's, GiB): sizes the Ray task.
        expected_s: the expected build time in seconds (``wheel_sources.toml`` route times), None if unknown.
    """

    number: int
    key: str
    backend: str
    request: Request
    spec: BuildSpec
    wheel: WheelKey
    archs: tuple[ComputeCapability, ...]
    kinds: tuple[str, ...]
    builder: str
    builder_nodes: tuple[str, ...]
    gib_per_thread: int
    expected_s: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """How one kind gets one backend.

    Attributes:
        route: ``installed``, ``cache``, ``wheel``, ``build``, ``none`` (cannot be served) or ``skipped`` (a kind
            without a GPU: nothing to install; not counted as unserved).
        detail: the chosen candidate's description (``build 1 of 2`` for a build).
        build: the number of the build that serves it, None otherwise.
        reasons: for ``none``, every rejected candidate's reasons (as ``attnforge plan`` prints them).
    """

    kind: str
    backend: str
    route: str
    detail: str
    build: int | None = None
    expected_s: float | None = None
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetPlan:
    """The fleet plan: the kinds (as grouped), the route of every (kind, backend), the builds, the artifact count.

    ``artifacts`` counts builds + distinct prebuilt wheels (by file name) + distinct cache entries;
    ``expected_total_s`` is each artifact's expected time once (a build serves all its kinds), one after another.
    """

    kinds: tuple[KindGroup, ...]
    routes: tuple[Route, ...]
    builds: tuple[FleetBuild, ...]
    artifacts: int
    expected_total_s: float
    unserved: int


def plan_fleet(groups: Sequence[KindGroup], catalog: Catalog, requests: Sequence[Request | KindRequest], *,
               wheels: Mapping[str, Sequence[WheelRef]] | None = None, home: str | None = None) -> FleetPlan:
    """Plan ``requests`` (one per backend) for every kind of ``groups``.

    A kind without a GPU is ``skipped`` (it runs no kernel; it may still build for the others); a kind whose own
    nodes cannot build (no nvcc, one too old) is served by the build of another kind of its wheel key whose
    toolchain reaches its compute capability too.

    Args:
        groups: the kinds (:func:`~attnforge.fleet.kinds.group_nodes`).
        catalog: ``load_catalog()``.
        requests: per backend, a :class:`~attnforge.fleet.requests.KindRequest` (what the CLI passes: the
            one-machine pipeline of ``attnforge plan``), or a bare resolver :class:`Request` planned with
            :func:`attnforge.resolve.resolve` over ``wheels`` (library callers, benchmarks).
        wheels: backend id -> wheels listed from ``--find-links`` / ``--index-url`` (bare requests only).
        home: build root base for the build specs (default: each builder snapshot's own cache dir).

    Raises:
        UsageError: a bad version text, or a backend with nothing to build when a build is planned.
    """
    asks = [r if isinstance(r, KindRequest) else _resolver_request(r, catalog, (wheels or {}).get(r.backend, ()),
                                                                   home) for r in requests]
    times = load_wheel_sources().route_times
    routes: dict[tuple[str, int], Route] = {}
    to_build: dict[tuple[int, WheelKey], list[_Member]] = {}
    orphans: dict[tuple[int, WheelKey], list[tuple[KindGroup, Route]]] = {}
    variants = {g.kind.id: _toolchains(g) for g in groups}
    for i, ask in enumerate(asks):
        request = ask.request
        for g in groups:
            if not g.kind.ccs:
                routes[g.kind.id, i] = Route(kind=g.kind.id, backend=request.backend, route="skipped",
                                             detail="no GPU: nothing to install (it may build for others)")
                continue
            plan, planned_on = _first_viable(variants[g.kind.id], ask)
            chosen = plan.chosen
            if chosen is None:
                reasons = tuple(f"{c.kind.value}: {r}" for c in plan.candidates for r in c.reasons)
                routes[g.kind.id, i] = Route(kind=g.kind.id, backend=request.backend, route="none",
                                             detail="nothing is viable", reasons=reasons)
                orphans.setdefault((i, g.kind.wheel), []).append((g, routes[g.kind.id, i]))
            elif chosen.kind is CandidateKind.SOURCE and chosen.build is not None:
                to_build.setdefault((i, build_wheel_key(g.kind.wheel, catalog.recipe(request.backend),
                                                        abi=request.abi)), []).append(
                    _Member(group=planned_on, spec=chosen.build))
            else:
                routes[g.kind.id, i] = Route(kind=g.kind.id, backend=request.backend, route=chosen.kind.value,
                                             detail=chosen.description,
                                             expected_s=times.expected_s(chosen.kind, request.backend))
    builds: list[FleetBuild] = []
    for (i, wheel), members in to_build.items():
        request = asks[i].request
        for kinds, spec, builder, gib in _merge(members, orphans.get((i, wheel), []), catalog, request, home):
            number = len(builds) + 1
            build = FleetBuild(
                number=number, key=artifact_key(request, spec, wheel), backend=request.backend,
                request=dataclasses.replace(request, archs=spec.archs), spec=spec, wheel=wheel, archs=spec.archs,
                kinds=kinds, builder=builder.kind.id, builder_nodes=_capable(builder, groups),
                gib_per_thread=gib,
                expected_s=times.expected_s(CandidateKind.SOURCE, request.backend),
            )
            builds.append(build)
            for kind in kinds:
                routes[kind, i] = Route(kind=kind, backend=request.backend, route="build",
                                        detail=f"build {number}", build=number, expected_s=build.expected_s)
    ordered = tuple(routes[g.kind.id, i] for i in range(len(asks)) for g in groups)
    ordered = tuple(dataclasses.replace(r, detail=f"build {r.build} of {len(builds)}") if r.build else r
                    for r in ordered)
    return FleetPlan(
        kinds=tuple(groups),
        routes=ordered, builds=tuple(builds), artifacts=_artifacts(ordered, builds),
        expected_total_s=_total_s(ordered, builds), unserved=sum(r.route == "none" for r in ordered),
    )


def _resolver_request(request: Request, catalog: Catalog, offered: Sequence[WheelRef],
                      home: str | None) -> KindRequest:
    def plan_on(snapshot: SystemSnapshot) -> Plan:
        return resolve(snapshot, catalog, request, wheels=offered, home=home)

    return KindRequest(request=request, plan_on=plan_on)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Member:
    """A kind whose route is a build: the resolver's spec, and the kind's nodes of the one toolchain it was planned
    on (a :class:`KindGroup` whose ``snapshot`` is that toolchain's)."""

    group: KindGroup
    spec: BuildSpec


def _first_viable(variants: list[KindGroup], ask: KindRequest) -> tuple[Plan, KindGroup]:
    """The plan on the first toolchain variant of a kind that serves the request (else the last one's plan)."""
    plans = ((ask.plan_on(v.snapshot), v) for v in variants)
    last = None
    for last in plans:
        if last[0].viable:
            return last
    if last is None:
        raise ValueError("a kind without nodes")
    return last


def _toolchain(node: Node) -> object:
    """What decides whether a node can run a build planned on another: its toolchains and interpreter."""
    s = node.snapshot
    return (s.cuda_toolkits, s.compilers, s.visual_studio, s.ninja, s.platform.python_executable)


def _toolchains(g: KindGroup) -> list[KindGroup]:
    """The kind's nodes split by toolchain (CUDA toolkits, compilers, Visual Studio, ninja), in node order: nodes
    of one kind may differ in what can build. Each part's ``snapshot`` (its first node's) stands for its toolchain."""
    out: dict[object, list[Node]] = {}
    for node in g.nodes:
        out.setdefault(_toolchain(node), []).append(node)
    return [KindGroup(kind=g.kind, nodes=tuple(nodes)) for nodes in out.values()]


def _capable(builder: KindGroup, groups: Sequence[KindGroup]) -> tuple[str, ...]:
    """Every node that can run the build planned on ``builder``: the same wheel key (platform, Python, torch),
    the same toolchain and interpreter, and a glibc no newer than the builder's (a wheel built on glibc X runs on
    >= X). GPU-less nodes count: nvcc needs no GPU. The builder's own nodes come first."""
    wheel, toolchain, glibc = builder.kind.wheel, _toolchain(builder.nodes[0]), glibc_key(builder.snapshot)
    own = [n.node_id for n in builder.nodes]
    mine = set(own)
    others = [n.node_id for g in groups if g.kind.wheel == wheel for n in g.nodes
              if n.node_id not in mine and _toolchain(n) == toolchain and glibc_key(n.snapshot) <= glibc]
    return (*own, *others)


def _merge(members: list[_Member], orphans: list[tuple[KindGroup, Route]], catalog: Catalog, request: Request,
           home: str | None) -> list[tuple[tuple[str, ...], BuildSpec, KindGroup, int]]:
    """One build for every member when one builder's toolchain reaches the union of their archs, else one each.
    Kinds that cannot build themselves (``orphans``) join the union when a member's toolchain reaches it too.

    Returns: (kind ids, spec, the builder (its kind's nodes of one toolchain), GiB per nvcc thread) per build.
    """
    recipe = build_recipe(catalog, request, cpu_only=cpu_only_source(
        request.source, os=members[0].group.snapshot.platform.os)) if members else None
    gib = recipe.gb_per_nvcc_thread if recipe is not None else 1
    by_glibc = sorted(members, key=lambda m: glibc_key(m.group.snapshot))
    # with --arch every kind gets the list asked for; else each kind's own GPUs join the union
    orphan_ccs = {cc for g, _ in orphans for cc in g.kind.ccs} if request.archs is None else set()
    for extra in ([g for g, _ in orphans], []) if orphans else ([],):
        union = tuple(sorted({cc for m in members for cc in m.spec.archs} | (orphan_ccs if extra else set())))
        kinds = tuple(m.group.kind.id for m in members) + tuple(g.kind.id for g in extra)
        if len(kinds) < 2:
            continue
        for m in by_glibc:
            decision = plan_build(m.group.snapshot, catalog, dataclasses.replace(request, archs=union), home=home)
            if decision.spec is not None:
                return [(kinds, decision.spec, m.group, gib)]
    return [((m.group.kind.id,), m.spec, m.group, gib) for m in members]


def build_wheel_key(wheel: WheelKey, recipe: Recipe | None, *, abi: AbiKind | None = None) -> WheelKey:
    """The wheel key a build of ``recipe`` for a kind of ``wheel`` has: the kind's own, except that a recipe whose
    build uses the libtorch stable ABI from torch X.Y (``stable_abi_from``, e.g. FlashAttention-3 from 2.9) makes
    one binary for every torch >= X.Y (any C++11 ABI), so those kinds share one key: torch ``>=X.Y``, no C++ ABI.
    ``abi`` ``torch`` (``--abi torch``: each build bound to its torch) keeps the kind's own key.
    The built binary's own ABI is read again when it is stored (:mod:`attnforge.install.abi`)."""
    if (recipe is None or recipe.stable_abi_from is None or wheel.torch_version is None
            or abi is AbiKind.TORCH or not recipe.builds_stable_with(wheel.torch_version)):
        return wheel
    floor = recipe.stable_abi_from
    return dataclasses.replace(wheel, torch_version=f">={floor[0]}.{floor[1]}", cxx11_abi=None)


def artifact_key(request: Request, spec: BuildSpec, wheel: WheelKey, source_digest: str | None = None) -> str:
    """``sha256:`` of everything that changes the built binary, known before the build.

    The backend, version, source, the wheel key, the archs, the build variables that change the bytes (every
    variable of ``spec.env`` but the speed-only ones, and the edits of the build tree: :func:`build_flags`)
    and nvcc's version; and
    ``source_digest`` (the tree sha256 of a local source directory) when the caller knows it.
    """
    doc = {
        "backend": request.backend, "version": spec.version or request.version,
        "source": to_jsonable(spec.source), "wheel": to_jsonable(wheel),
        "archs": [str(cc) for cc in spec.archs],
        "flags": sorted(build_flags(spec)),
        "nvcc": spec.toolkit.version if spec.toolkit else None, "source_digest": source_digest,
    }
    return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _artifacts(routes: Sequence[Route], builds: Sequence[FleetBuild]) -> int:
    others = {(r.route, r.backend, r.detail) for r in routes if r.route in ("wheel", "cache")}
    return len(builds) + len(others)


def _total_s(routes: Sequence[Route], builds: Sequence[FleetBuild]) -> float:
    once = {(r.route, r.backend, r.detail): r.expected_s or 0.0 for r in routes if r.route in ("wheel", "cache")}
    return sum(once.values()) + sum(b.expected_s or 0.0 for b in builds)
