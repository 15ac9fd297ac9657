"""The pure resolver: ``resolve(snapshot, catalog, request) -> Plan``.

Candidates come in a fixed order (installed, local cache, prebuilt wheels, source build) and each is
accepted or rejected with its reasons, so "nothing fits" can print them all. This is the trace
huggingface/kernels gives with ``variants_trace_str``, plus the GPU's compute capability, which kernels does
not check (install-anchors §4.3). The plan's chosen action is the first accepted candidate.
"""

from __future__ import annotations

from collections.abc import Sequence

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag
from packaging.version import InvalidVersion, Version

from attnforge.catalog import Catalog
from attnforge.catalog.backends import Backend
from attnforge.catalog.recipes import RecipeKind, TorchMatch
from attnforge.errors import UsageError
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.buildspec import (
    cached_switch_problem,
    default_source,
    installed_caps_problem,
    offline_problem,
    plan_build,
)
from attnforge.resolve.tags import supported_tags
from attnforge.resolve.types import (
    CachedArtifact,
    Candidate,
    CandidateKind,
    Plan,
    Request,
    SourceKind,
    WheelRef,
)
from attnforge.resolve.wheels import check_binary, read_cached, read_wheel, same_distribution, target_ccs
from attnforge.types.binary import AbiKind
from attnforge.types.cc import format_cc
from attnforge.types.local_label import stable_abi_of_version
from attnforge.types.versions import newest_first

_FROM_SOURCE = "--from-source: prebuilt binaries are skipped"


def resolve(
    snapshot: SystemSnapshot,
    catalog: Catalog,
    request: Request,
    *,
    cached: Sequence[CachedArtifact] = (),
    wheels: Sequence[WheelRef] = (),
    home: str | None = None,
) -> Plan:
    """Every way to satisfy ``request`` on ``snapshot``, in order, each accepted or rejected with reasons.

    Args:
        snapshot: the machine (a fresh probe or a saved ``--snapshot``); its Python, glibc
        and GPUs are used, never
            the running interpreter's.
        catalog: ``load_catalog()``.
        request: backend id, version specifier, archs, sources allowed.
        cached: artifacts in the local cache (the cache owns listing them).
        wheels: wheels found in ``--find-links`` dirs and ``--index-url`` indexes (see :mod:`.listing`).
        home: attnforge home for the build root (default: the snapshot's cache dir).

    Raises:
        UsageError: the version specifier is not PEP 440. (An unknown backend with no ``request.source`` is
            rejected by ``catalog.backend`` in the CLI before this is called; here it
            resolves as a generic torch extension.)
    """
    _check_version_text(request.version)
    backend = catalog.backends.get(request.backend)
    if backend is not None and backend.builtin:
        return Plan(request=request, candidates=(_builtin(snapshot, backend, request.version),))
    candidates: list[Candidate] = [_installed(snapshot, backend, request, catalog)]
    distributions = _distributions(catalog, backend, request)
    tags = supported_tags(snapshot.platform)

    for art in cached:
        if not same_distribution(art.name, distributions):
            continue
        desc = f"cached {art.name} {art.version} ({art.key[:19]})"
        if request.from_source:
            candidates.append(_rejected(CandidateKind.CACHE, desc, [_FROM_SOURCE], cache_key=art.key))
            continue
        other = _other_source(art, request)
        if other is not None:
            candidates.append(_rejected(CandidateKind.CACHE, desc, [other], cache_key=art.key))
            continue
        try:
            facts = read_cached(art)
        except ValueError as exc:
            candidates.append(
                _rejected(CandidateKind.CACHE, desc, [f"unreadable cache record: {exc}"], cache_key=art.key)
            )
            continue
        m = check_binary(facts, snapshot, catalog, backend=backend, request=request, supported=tags)
        slim = cached_switch_problem(catalog.recipe(request.backend), request, art.flags,
                                     archs=request.archs or snapshot.compute_capabilities)
        abi = abi_problem(request, stable=_stable_abi(facts.torch_match, built_abi=art.abi,
                                                      prebuilt="prebuilt" in art.flags))
        candidates.append(
            Candidate(
                kind=CandidateKind.CACHE,
                description=desc,
                accepted=m.ok and slim is None and abi is None,
                reasons=(*m.problems, *([slim] if slim else []), *([abi] if abi else []))
                or (*_same_source(request), *m.notes) or ("matches this machine",),
                cache_key=art.key,
            )
        )

    candidates.extend(
        _wheel_candidates(
            snapshot,
            catalog,
            backend=backend,
            request=request,
            wheels=wheels,
            distributions=distributions,
            tags=tags,
        )
    )
    candidates.extend(_index_candidate(snapshot, catalog, backend, request))
    source = _source(snapshot, catalog, request, home)
    if source is not None:
        candidates.append(source)
    return Plan(request=request, candidates=tuple(candidates))


def _check_version_text(version: str) -> None:
    if version.strip():
        try:
            spec = SpecifierSet(version)
        except InvalidSpecifier:
            raise UsageError(
                f"not a version specifier: {version!r}", hint="write e.g. ==2.8.3 or >=2.8"
            ) from None
        why = _no_version_fits(spec)
        if why:
            raise UsageError(f"no version fits {version!r}: {why}",
                             hint="write e.g. >=2.8,<3 (pip would say: no matching distribution)")


def _no_version_fits(spec: SpecifierSet) -> str | None:
    """Why ``spec`` excludes every version, or None: a pin (``==V`` without a wildcard, ``===V``) that the spec's
    other clauses refuse (``==2.8.3,!=2.8.3``: any version that fits is V, or V with a local label, which the same
    clauses refuse, PEP 440), or its highest lower bound (``>=``, ``>``, ``==``, ``~=``) above its lowest upper bound
    (``<``, ``<=``, ``==``), or equal where either is strict. ``flash-attn>=3,<2`` was planned as a request like any
    other, its candidates then refused one by one (CLI fuzz, 2026-12-03). Only these clauses are read (a ``!=``
    alone or a wildcard never gives a reason), so a spec it calls empty is empty."""
    for s in spec:
        pinned = s.operator == "===" or (s.operator == "==" and not s.version.endswith(".*"))
        if pinned and not spec.contains(s.version, prereleases=True):
            return f"it pins {s.version} and refuses it"
    lower: tuple[Version, bool] | None = None  # (version, strict)
    upper: tuple[Version, bool] | None = None
    for s in spec:
        if s.operator == "===" or s.version.endswith(".*"):
            continue
        try:
            v = Version(s.version)
        except InvalidVersion:
            continue
        if s.operator in (">=", ">", "==", "~="):
            cand = (v, s.operator == ">")
            if lower is None or cand[0] > lower[0] or (cand[0] == lower[0] and cand[1]):
                lower = cand
        if s.operator in ("<", "<=", "=="):
            cand = (v, s.operator == "<")
            if upper is None or cand[0] < upper[0] or (cand[0] == upper[0] and cand[1]):
                upper = cand
    if lower is None or upper is None:
        return None
    if lower[0] > upper[0] or (lower[0] == upper[0] and (lower[1] or upper[1])):
        return "its lower bound is above its upper bound"
    return None


def _stable_abi(match: TorchMatch, *, built_abi: str | None = None, prebuilt: bool = True) -> bool | None:
    """Whether a binary uses the libtorch stable ABI: a build's own ABI (read from its binary when it was cached,
    ``built_abi``), else its label's or its index's torch match (``at-least``: stable; ``major-minor``/``exact``:
    one torch); None where neither says (a prebuilt wheel with no label)."""
    if built_abi == AbiKind.TORCH_STABLE.value or match is TorchMatch.AT_LEAST:
        return True
    if not prebuilt or match in (TorchMatch.MAJOR_MINOR, TorchMatch.EXACT):
        return False
    return None


def abi_problem(request: Request, *, stable: bool | None) -> str | None:
    """Why a binary does not bind to torch as ``--abi`` asks (``stable``: it uses the libtorch stable ABI; None: not
    known before it is installed), or None."""
    if request.abi is None or stable == (request.abi is AbiKind.TORCH_STABLE):
        return None
    if stable is None:
        return (f"its ABI is not known before it is installed (no local version label says it); --abi "
                f"{request.abi.value} asks for one that can be checked")
    if stable:
        return ("built for the libtorch stable ABI (any torch >= its minimum); --abi torch asks for a build bound "
                "to this torch (less host time a call)")
    return "bound to one torch; --abi torch-stable asks for a libtorch stable-ABI build"


def _other_source(art: CachedArtifact, request: Request) -> str | None:
    """Why a cached build is not the build of ``request.source`` (None: it is, or no source was named).

    A ``--source`` asks for a build of those bytes: a cached build of the same name from another tree (an older
    commit of the same version) must not pass for it, so the cache key's source hash must be the source's. A local
    path whose bytes were not read (the wheelhouse's own sdist, a what-if's path of another machine) is not checked.
    """
    if request.source is None:
        return None
    if request.source_sha256 is None and request.source.kind is SourceKind.PATH:
        return None
    if request.source_sha256 is None:
        return (f"built from source sha256 {_short(art.source_sha256)}; the bytes of {request.source.location} "
                "are known only once it is fetched, so a build of it is not taken from the cache")
    if art.source_sha256 != request.source_sha256:
        return (f"built from another source tree (sha256 {_short(art.source_sha256)}, "
                f"{request.source.location} is {_short(request.source_sha256)})")
    return None


def _same_source(request: Request) -> tuple[str, ...]:
    if request.source is None or request.source_sha256 is None:
        return ()
    return (f"built from these bytes of {request.source.location} (source sha256 {_short(request.source_sha256)})",
            "matches this machine")


def _short(sha256: str | None) -> str:
    return f"{sha256[:12]}..." if sha256 else "unknown"


def _distributions(catalog: Catalog, backend: Backend | None, request: Request) -> tuple[str, ...]:
    names = list(backend.distributions) if backend else []
    recipe = catalog.recipe(request.backend)
    if recipe is not None and recipe.distribution:
        names.append(recipe.distribution)
    return tuple(names) or (request.backend,)


def _rejected(
    kind: CandidateKind, desc: str, reasons: Sequence[str], *, cache_key: str | None = None
) -> Candidate:
    return Candidate(kind=kind, description=desc, accepted=False, reasons=tuple(reasons), cache_key=cache_key)


# -- installed -----------------------------------------------------------------------------------------------
def _builtin(snapshot: SystemSnapshot, backend: Backend, version: str = "") -> Candidate:
    """A backend that comes with torch: its version is torch's, so a version specifier is torch's to meet
    (``sdpa-math>=99`` was accepted, and `install` said "nothing to do": CLI fuzz, 2026-12-03)."""
    desc = f"{backend.display_name} ({backend.install})"
    t = snapshot.torch
    if t is None:
        return _rejected(CandidateKind.INSTALLED, desc, ["torch is not installed"])
    if version.strip() and not SpecifierSet(version).contains(t.version, prereleases=True):
        return _rejected(CandidateKind.INSTALLED, desc,
                         [f"comes with torch {t.version}, which is not {version.strip()} (its version is torch's)"])
    if backend.family != "sdpa" or backend.support.min_cc > (0, 0):
        reasons = [] if t.cuda_version else [f"torch {t.version} is a CPU build"]
        reasons += [
            f"needs compute capability {backend.support.cc_range_text()}, the GPU is {format_cc(cc)}"
            for cc in snapshot.compute_capabilities
            if not backend.support.supports_cc(cc)
        ]
        if reasons:
            return _rejected(CandidateKind.INSTALLED, desc, reasons)
    return Candidate(
        kind=CandidateKind.INSTALLED,
        description=desc,
        accepted=True,
        reasons=(f"comes with torch {t.version}",),
    )


def _installed(snapshot: SystemSnapshot, backend: Backend | None, request: Request, catalog: Catalog) -> Candidate:
    state = snapshot.backend(request.backend)
    if state is None or not state.installed:
        desc = f"{request.backend} in {snapshot.platform.python_executable}"
        # the snapshot probes the catalog's backends only; a free name (a --source project) is never taken installed
        why = ("not looked for (a project the catalog does not know: --source builds it)"
               if state is None and backend is None else "not installed")
        return _rejected(CandidateKind.INSTALLED, desc, [why])
    desc = f"{state.distribution} {state.version} installed in {snapshot.platform.python_executable}"
    reasons = []
    if request.from_source:
        reasons.append("--from-source asks for a new build")
    elif request.source is not None:  # a newer commit of the same version must not pass for the installed one
        reasons.append(f"--source {request.source.location} asks for a build of that source (a cache hit if built)")
    slim = installed_caps_problem(catalog.recipe(request.backend), request,
                                  archs=request.archs or snapshot.compute_capabilities)
    reasons += [slim] if slim else []
    if request.version and state.version:
        try:
            if not SpecifierSet(request.version).contains(Version(state.version), prereleases=True):
                reasons.append(f"version {state.version} does not satisfy {request.version}")
        except InvalidVersion:
            reasons.append(f"installed version {state.version!r} is not PEP 440")
    if request.installed_verify_failure:
        reasons.append(f"its latest verify on this device failed: {request.installed_verify_failure}")
    stable = stable_abi_of_version(state.version)
    abi = abi_problem(request, stable=stable) if stable is not None else None
    reasons += [abi] if abi else []
    if state.imports is False:
        reasons.append(f"does not import: {state.import_error or 'unknown error'}")
    broken = [m for m in state.native if not m.ok]
    reasons += [f"native module {m.name} does not import: {m.error or 'unknown error'}" for m in broken]
    if reasons:
        return _rejected(CandidateKind.INSTALLED, desc, reasons)
    ok = "imports and its native modules load" if state.native else "imports"
    if state.imports is None:
        ok = "installed (its import was not tried)"
    return Candidate(kind=CandidateKind.INSTALLED, description=desc, accepted=True, reasons=(ok,))


# -- wheels --------------------------------------------------------------------------------------------------
def _wheel_candidates(
    snapshot: SystemSnapshot,
    catalog: Catalog,
    *,
    backend: Backend | None,
    request: Request,
    wheels: Sequence[WheelRef],
    distributions: Sequence[str],
    tags: Sequence[Tag],
) -> list[Candidate]:
    accepted: list[tuple[tuple[object, ...], Version, Candidate]] = []
    rejected: list[Candidate] = []
    for ref in wheels:
        desc = f"{ref.filename} ({ref.url})" + (f" [source {ref.source}]" if ref.source else "")
        try:
            facts = read_wheel(ref.filename, catalog, ref)
        except ValueError as exc:
            if ref.filename.endswith(".whl"):
                rejected.append(_rejected(CandidateKind.WHEEL, desc, [f"not a valid wheel filename: {exc}"]))
            continue
        if not same_distribution(facts.name, distributions):
            continue
        if request.from_source:
            rejected.append(
                Candidate(
                    kind=CandidateKind.WHEEL,
                    description=desc,
                    accepted=False,
                    reasons=(_FROM_SOURCE,),
                    wheel=ref,
                )
            )
            continue
        m = check_binary(facts, snapshot, catalog, backend=backend, request=request, supported=tags)
        abi = abi_problem(request, stable=_stable_abi(facts.torch_match))
        cand = Candidate(
            kind=CandidateKind.WHEEL,
            description=desc,
            accepted=m.ok and abi is None,
            reasons=(*m.problems, *([abi] if abi else [])) or m.notes or ("matches this machine",),
            wheel=ref,
        )
        if cand.accepted:
            # a wheel whose archs are declared (and cover this GPU) before one whose archs are unknown
            known = 0 if facts.archs else 1
            accepted.append(((known, m.tag_rank or 0), facts.version, cand))
        else:
            rejected.append(cand)
    accepted.sort(key=lambda item: item[2].description)
    accepted.sort(key=lambda item: item[1], reverse=True)  # ties: the newer local label (.post3 > .post2)
    # newest public version first (a final release before its pre-releases), then declared archs, then tag rank
    ordered = newest_first(accepted, lambda item: Version(item[1].public), lambda item: item[0])
    return [c for _, _, c in ordered] + sorted(rejected, key=lambda c: c.description)


def _index_candidate(
    snapshot: SystemSnapshot, catalog: Catalog, backend: Backend | None, request: Request
) -> list[Candidate]:
    """A pure-Python backend (FA4, SageAttention 1) is a plain ``pip install`` from the package index."""
    recipe = catalog.recipe(request.backend)
    if recipe is None or recipe.kind is not RecipeKind.PIP:
        return []
    spec = request.version or (str(backend.version_spec) if backend else "")
    desc = f"pip install {recipe.distribution}{spec} from the package index (pure Python: nothing to compile)"
    reasons = []
    if request.offline:
        reasons.append("--offline: the package index cannot be reached (put the wheel in a --find-links dir)")
    t = snapshot.torch
    if t is None or t.cuda_version is None:
        reasons.append(f"torch {t.version if t else '(none)'} is not a CUDA build; the kernels need one")
    if backend is not None:
        reasons += [
            f"{backend.display_name} supports compute capability {backend.support.cc_range_text()}, the GPU is "
            f"{format_cc(cc)}"
            for cc in target_ccs(snapshot, request)
            if not backend.support.supports_cc(cc)
        ]
    if reasons:
        return [_rejected(CandidateKind.WHEEL, desc, reasons)]
    return [
        Candidate(
            kind=CandidateKind.WHEEL,
            description=desc,
            accepted=True,
            reasons=(f"{recipe.distribution} is pure Python; its kernels compile on first call",),
        )
    ]


# -- source --------------------------------------------------------------------------------------------------
def _source(
    snapshot: SystemSnapshot, catalog: Catalog, request: Request, home: str | None
) -> Candidate | None:
    recipe = catalog.recipe(request.backend)
    if recipe is None or recipe.kind is not RecipeKind.BUILD:
        return None
    source = default_source(recipe, request)
    where = source.requirement()
    if source.subdirectory:
        where += f" (subdirectory {source.subdirectory})"
    desc = f"build {recipe.distribution or request.backend} from {source.kind.value} {where}"
    decision = plan_build(snapshot, catalog, request, home=home)
    reasons = [f.text() for f in decision.preflight.failures]
    offline = offline_problem(request, source)
    reasons += [offline] if offline else []
    if reasons or decision.spec is None:
        return _rejected(CandidateKind.SOURCE, desc, reasons)
    return Candidate(
        kind=CandidateKind.SOURCE,
        description=desc,
        accepted=True,
        reasons=decision.spec.notes,
        build=decision.spec,
    )
