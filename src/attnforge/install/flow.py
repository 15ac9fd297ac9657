"""``attnforge install``: plan -> cache hit, hash-checked wheel, or build, into the cache -> pip -> verify.

Every artifact goes through the store before pip sees it, so what is installed is always a file whose sha256
was checked on the way in and again on the way out, and a second install of the same thing is a cache hit.
Concurrent installs of one thing serialise on a per-job lock: the first builds, the others find its entry.

The resolver, the builder and the verifier are injected (:class:`Planner`, :class:`Builder`,
:class:`Verifier`); :mod:`attnforge.install.defaults` wires the real ones.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from attnforge._system.runner import Runner
from attnforge.cache import CacheKey, Store
from attnforge.cache._files import sha256_file
from attnforge.errors import CacheError, InstallError, ResolveError
from attnforge.fetch.download import check_digest, stream
from attnforge.install.guards import interpreter_lock, scratch_dir
from attnforge.install.keys import prebuilt_wheel_inputs, store_built
from attnforge.install.overlap import warning as overlap_warning
from attnforge.install.pip import PipInstallResult, install_requirements, pip_install, uninstall
from attnforge.install.wheelfile import UNREADABLE, read_wheel_metadata, unreadable
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.types import (
    BuildSpec,
    CachedArtifact,
    Candidate,
    CandidateKind,
    Plan,
    Request,
    WheelRef,
)
from attnforge.types.cc import ComputeCapability


class Planner(Protocol):
    """``resolve(snapshot, catalog, request, cached=..., wheels=...)`` with the machine already bound."""

    def __call__(self, request: Request, *, cached: Sequence[CachedArtifact]) -> Plan: ...


class BuiltWheel(Protocol):
    """What a source build hands back (``attnforge.build.BuildResult``)."""

    @property
    def wheel_path(self) -> Path: ...
    @property
    def log_path(self) -> Path | None: ...
    @property
    def source_sha256(self) -> str: ...
    @property
    def owned_dir(self) -> Path | None:
        """A directory the installer removes once the wheel is in the cache (the builder's staging dir)."""


class Builder(Protocol):
    def __call__(self, spec: BuildSpec, *, home: Path) -> BuiltWheel: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyOutcome:
    """What the verify step said: ``ok`` is None when it was skipped (``summary`` says why)."""

    ok: bool | None
    summary: str


class Verifier(Protocol):
    def __call__(self, backend: str) -> VerifyOutcome: ...


class IndexFetcher(Protocol):
    """Downloads the wheel a request names from the package index into a directory (``pip download``)."""

    def __call__(self, request: Request, into: Path) -> Path: ...


class Action:
    """How the artifact was obtained (plain strings so JSON stays readable)."""

    CACHE_HIT = "cache-hit"
    WHEEL = "wheel"
    BUILT = "built"
    ALREADY_INSTALLED = "already-installed"


@dataclass(frozen=True, slots=True, kw_only=True)
class InstallResult:
    """The outcome of one install.

    Attributes:
        action: ``cache-hit``, ``wheel`` (fetched, hash-checked, stored), ``built`` or ``already-installed``.
        cache_key: the store entry that was installed.
        artifact: the verified file pip installed.
        pip: pip's part (None when nothing was installed).
        verification: the verify step's outcome (None with ``--no-verify``).
        warnings: things the user should know (requirements left to them, a quarantined entry).
        timings_s: seconds per step: ``plan``, ``obtain``, ``pip``, ``verify``.
        hash_source: for a fetched wheel, whether its sha256 was published or only recorded on first use.
    """

    request: Request
    plan: Plan
    action: str
    cache_key: str | None = None
    artifact: str | None = None
    pip: PipInstallResult | None = None
    verification: VerifyOutcome | None = None
    warnings: tuple[str, ...] = ()
    timings_s: dict[str, float] = field(default_factory=dict)
    hash_source: str | None = None  # for ``wheel``: a :class:`~attnforge.install.download.HashSource` value

    @property
    def ok(self) -> bool:
        return self.verification is None or self.verification.ok is not False


@dataclass(slots=True, kw_only=True)
class _Run:
    """The collaborators of one install, and what it has noted so far."""

    store: Store
    planner: Planner
    builder: Builder
    snapshot: SystemSnapshot
    fetch_index: IndexFetcher | None
    require_hashes: bool = False
    hash_source: str | None = None
    warnings: list[str] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)


def install(
    request: Request,
    *,
    snapshot: SystemSnapshot,
    store: Store,
    planner: Planner,
    builder: Builder,
    verifier: Verifier | None,
    runner: Runner,
    python: str = sys.executable,
    fetch_index: IndexFetcher | None = None,
    allow_overlap: bool = False,
    require_hashes: bool = False,
) -> InstallResult:
    """Install what ``request`` asks for into ``python``.

    Args:
        request: backend, version, sources allowed.
        snapshot: this machine (its torch decides the cache key of what gets built or fetched).
        store: the artifact cache.
        planner: the resolver bound to this machine and catalog.
        builder: runs a :class:`BuildSpec` and returns the wheel, its log and the source hash.
        verifier: checks the installed backend; None skips verification (``--no-verify``).
        runner: the subprocess seam (pip).
        python: the interpreter to install into.
        fetch_index: downloads a wheel from the package index (for the resolver's pure-Python candidate).
        allow_overlap: install even if the artifact ships files another installed distribution owns; the
            result then carries a warning naming them and the command that restores them.
        require_hashes: refuse a wheel whose sha256 was not published by where it came from (instead of
            recording its hash on first use).

    Raises:
        ResolveError: nothing viable; the message lists every candidate and why it was rejected.
        CacheError: a fetched wheel fails its hash check, or the disk is full.
        BuildError: the source build failed (with its log path).
        InstallError: pip failed, the artifact would change torch, or it would overwrite another
            distribution's files (without ``allow_overlap``; the artifact stays cached for the next try);
            or its requirements could not be installed: the artifact is removed again when this run added it
            (else the message says it is installed without them). A wheel that can no longer be fetched
            (gone from its find-links folder or index) is not an error while the plan has another candidate:
            the next one is used, and a warning says so.
    """
    run = _Run(store=store, planner=planner, builder=builder, snapshot=snapshot, fetch_index=fetch_index,
               require_hashes=require_hashes)
    start = time.perf_counter()
    plan = planner(request, cached=store.cached_artifacts())
    run.timings_s["plan"] = time.perf_counter() - start
    chosen = _chosen(plan)
    if chosen.kind is CandidateKind.INSTALLED:
        return InstallResult(request=request, plan=plan, action=Action.ALREADY_INSTALLED, warnings=(
            f"{chosen.description}: already installed and working; nothing to do",
        ))

    start = time.perf_counter()
    plan, action, path, key = _obtain(run, request, plan, chosen)
    run.timings_s["obtain"] = time.perf_counter() - start

    start = time.perf_counter()
    with interpreter_lock(store, python):  # pip itself does not serialise installs into one environment
        run.timings_s["wait"] = time.perf_counter() - start
        start = time.perf_counter()
        pip = pip_install(path, runner=runner, python=python, allow_overlap=allow_overlap)
        run.timings_s["pip"] = time.perf_counter() - start
        if pip.overlaps and pip.installer is not None:
            run.warnings.append(overlap_warning(pip.overlaps, name=pip.name, version=pip.version,
                                                installer=pip.installer))
        if pip.missing_requirements:
            start = time.perf_counter()
            try:
                done = install_requirements(
                    pip.missing_requirements, runner=runner, python=python, find_links=request.find_links,
                    index_urls=request.index_urls, offline=request.offline, scratch=scratch_dir(store),
                )
            except InstallError as exc:
                raise _requirements_failed(exc, pip, runner=runner, python=python) from None
            run.timings_s["requirements"] = time.perf_counter() - start
            if done:
                run.warnings.append("also installed its requirements (torch pinned): " + ", ".join(done))

    verification = None
    if verifier is not None:
        start = time.perf_counter()
        verification = verifier(request.backend)
        run.timings_s["verify"] = time.perf_counter() - start
    return InstallResult(
        request=request, plan=plan, action=action, cache_key=key, artifact=str(path), pip=pip,
        verification=verification, warnings=tuple(run.warnings), timings_s=run.timings_s,
        hash_source=run.hash_source if action == Action.WHEEL else None,
    )


def _requirements_failed(exc: InstallError, pip: PipInstallResult, *, runner: Runner, python: str) -> InstallError:
    """The error for requirements that could not be installed after the artifact was: the artifact is removed
    again when this run added it (nothing else was there, and it replaced no other distribution's files), so the
    environment is as it was; otherwise the message says it is installed without its requirements."""
    what = f"{pip.name} {pip.version}"
    cause = f"{exc.message}: {exc.cause}" if exc.cause else exc.message
    fix = f"{exc.hint}; then run the install again" if exc.hint else "run the install again"
    if pip.previous_version is None and not pip.overlaps:
        left = uninstall(pip.name, runner=runner, python=python)
        if left is None:
            return InstallError(f"{what} was not installed: its requirements could not be installed "
                                f"(it was removed again from {python})", cause=cause, hint=fix)
        cause = f"{cause}; removing it again failed: {left}"
    elif pip.previous_version is not None:
        cause = f"{cause}; it replaced {pip.name} {pip.previous_version}, which attnforge cannot put back"
    else:
        cause = f"{cause}; it was left in place: it replaced files of another distribution (--allow-overlap)"
    return InstallError(f"{what} is installed in {python}, but its requirements are not: it will not import "
                        "until they are", cause=cause, hint=fix)


def _chosen(plan: Plan) -> Candidate:
    chosen = plan.chosen
    if chosen is None:
        lines = [
            f"{c.kind.value}: {c.description}: {'; '.join(c.reasons) or 'rejected'}" for c in plan.candidates
        ]
        raise ResolveError(
            f"nothing can install {plan.request.backend}{plan.request.version} on this machine",
            cause="\n".join(lines) or "no candidates",
            hint=f"see `attnforge plan {plan.request.backend}` for the full explanation",
        )
    return chosen


def _obtain(run: _Run, request: Request, plan: Plan, chosen: Candidate) -> tuple[Plan, str, Path, str]:
    """(plan, action, verified artifact path, cache key) for the chosen candidate."""
    store = run.store
    if chosen.kind is CandidateKind.CACHE:
        key = str(chosen.cache_key)
        try:
            return plan, Action.CACHE_HIT, store.get(CacheKey.parse(key)), key
        except CacheError as exc:
            corrupt = exc
        run.warnings.append(f"{corrupt.message}; {corrupt.cause}")
        plan = run.planner(request, cached=store.cached_artifacts())  # the corrupt entry is gone now
        if not plan.viable:
            raise CacheError(
                corrupt.message, cause=f"{corrupt.cause}; and nothing else can install it here",
                hint="rebuild it where it was built and `attnforge cache import` it again, or "
                "`attnforge plan` to see why nothing else fits",
            )
        return _obtain(run, request, plan, _chosen(plan))
    if chosen.kind is CandidateKind.WHEEL and (chosen.wheel is not None or run.fetch_index is not None):
        try:
            path, key = _from_wheel(run, chosen.wheel, request)
        except _UnfetchableError as gone:
            return _next_candidate(run, request, plan, chosen, gone)
        return plan, Action.WHEEL, path, key
    if chosen.kind is CandidateKind.SOURCE and chosen.build is not None:
        spec = chosen.build
        with store.job_lock(_job_name(spec, run.snapshot)):
            # Another process may have built it while this one waited for the lock: plan again.
            again = run.planner(request, cached=store.cached_artifacts())
            if again.chosen is not None and again.chosen.kind is CandidateKind.CACHE:
                hit = _from_cache(again.chosen, run)
                if hit is not None:
                    return again, Action.CACHE_HIT, hit, str(again.chosen.cache_key)
                plan = again
            built = run.builder(spec, home=store.root)
            entry = store_built(store, spec, wheel=Path(built.wheel_path), log_path=built.log_path,
                                source_sha256=built.source_sha256, snapshot=run.snapshot, owned_dir=built.owned_dir,
                                wanted_version=request.version)
        return plan, Action.BUILT, store.get(entry.key), entry.key
    raise InstallError(f"the plan chose {chosen.kind.value} without the details to act on it: {chosen}")


class _UnfetchableError(InstallError):
    """The planned wheel could not be fetched: gone from its folder or index since it was listed, or unreachable."""


def _next_candidate(run: _Run, request: Request, plan: Plan, chosen: Candidate,
                    gone: _UnfetchableError) -> tuple[Plan, str, Path, str]:
    """Obtain the plan's next accepted candidate after ``chosen``, which could not be fetched (kept in the plan as
    rejected, with why); an :class:`InstallError` naming both when there is none."""
    why = f"could not be fetched: {gone.message}" + (f" ({gone.cause})" if gone.cause else "")
    rest = Plan(request=plan.request, candidates=tuple(
        dataclasses.replace(c, accepted=False, reasons=(*c.reasons, why)) if c is chosen else c
        for c in plan.candidates))
    following = rest.chosen
    if following is None:
        raise InstallError(
            f"{chosen.description} {why}, and the plan has nothing else to install {request.backend} with",
            cause=gone.cause,
            hint=gone.hint or "run the command again (the listing is read afresh), or `attnforge plan "
                 f"{request.backend}` to see every candidate",
        )
    run.warnings.append(f"{chosen.description} {why}; used the plan's next candidate instead: "
                        f"{following.description}")
    return _obtain(run, request, rest, following)


def _from_cache(chosen: Candidate, run: _Run) -> Path | None:
    try:
        return run.store.get(CacheKey.parse(str(chosen.cache_key)))
    except CacheError as exc:
        run.warnings.append(f"{exc.message}; {exc.cause}")
        return None


def _job_name(spec: BuildSpec, snapshot: SystemSnapshot) -> str:
    torch = snapshot.torch.version if snapshot.torch else "no-torch"
    env = ",".join(f"{k}={v}" for k, v in sorted(spec.env.items()))
    return f"build|{spec.name}|{spec.version}|{spec.source}|{spec.archs}|{env}|{torch}|{spec.python}"


def _from_wheel(run: _Run, ref: WheelRef | None, request: Request) -> tuple[Path, str]:
    """A prebuilt wheel from find-links, an index page (``ref``), or the package index (``ref`` None)."""
    store, snapshot = run.store, run.snapshot
    archs = request.archs if request.archs is not None else snapshot.compute_capabilities
    job = f"wheel|{ref.url}|{ref.sha256}" if ref is not None else f"index|{request.backend}{request.version}"
    with store.job_lock(job), tempfile.TemporaryDirectory(dir=_downloads(store), prefix="fetch-") as tmp:
        if ref is None:
            assert run.fetch_index is not None  # checked by the caller  # noqa: S101
            _refuse_unhashed(run, f"package index: {request.backend}{request.version}")
            try:
                local = run.fetch_index(request, Path(tmp))
            except InstallError as exc:
                raise _UnfetchableError(exc.message, cause=exc.cause, hint=exc.hint) from None
            # pip download checks no hash unless given one: the hash below is only what arrived
            ref = WheelRef(filename=local.name, url=f"package index: {local.name}", sha256=None)
        else:
            if ref.sha256 is None:
                _refuse_unhashed(run, ref.url)
            local = _fetch(ref, request, Path(tmp))
        sha = sha256_file(local)
        run.hash_source = check_digest(ref.filename, ref.url, sha, ref.sha256)  # CacheError on a mismatch
        if ref.sha256 is None:
            run.warnings.append(f"{ref.filename} has no published sha256; its hash {sha} was recorded on first "
                                "use (later installs are checked against it; this one could not be)")
        read_wheel_metadata(local)  # a damaged or mislabelled file is refused before anything opens its binaries
        _refuse_missing_archs(local, tuple(archs))
        inputs = prebuilt_wheel_inputs(wheel=local, sha256=sha, archs=tuple(archs), snapshot=snapshot)
        provenance = {"origin": ref.url, "source": ref.source or "find-links/index", "url": ref.url,
                      "sha256": sha, "sha256_source": run.hash_source, "listed_at": ref.listed_at}
        entry = store.put(local, inputs, provenance=provenance, expected_sha256=sha).entry
    return store.get(entry.key), entry.key


def _refuse_unhashed(run: _Run, where: str) -> None:
    if run.require_hashes:
        raise InstallError(
            f"--require-hashes: the wheel from {where} has no published sha256",
            cause="its source publishes no `#sha256=` (or pip's download checks none), so nothing vouches "
            "for its bytes",
            hint="use an index or find-links page that publishes hashes (`attnforge cache export` writes "
            "them), or drop --require-hashes to record its hash on first use",
        )


def _downloads(store: Store) -> Path:
    path = store.root / "downloads"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fetch(ref: WheelRef, request: Request, into: Path) -> Path:
    """The wheel as a local file named ``ref.filename`` (always a copy; the original is never moved)."""
    target = into / ref.filename
    parsed = urllib.parse.urlparse(ref.url)
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and ref.url[1:3] in (":\\", ":/")):
        source = Path(urllib.request.url2pathname(parsed.path)) if parsed.scheme == "file" else Path(ref.url)
        if not source.is_file():
            raise _UnfetchableError(f"wheel {ref.filename} is no longer at {source}",
                                    hint=f"`attnforge plan {request.backend}` lists its folder afresh")
        shutil.copyfile(source, target)
        return target
    if request.offline:
        raise InstallError(
            f"{ref.filename} is at {ref.url}, but --offline forbids the network",
            hint="drop --offline, or download it into a --find-links directory first",
        )
    if parsed.scheme not in ("http", "https"):
        raise InstallError(f"cannot fetch {ref.url}: unsupported URL scheme {parsed.scheme!r}")
    try:
        stream(ref.url, target)  # a progress bar on a terminal
    except InstallError as exc:
        raise _UnfetchableError(exc.message, cause=exc.cause, hint=exc.hint) from None
    return target


def _refuse_missing_archs(wheel: Path, archs: tuple[ComputeCapability, ...]) -> None:
    """Refuse a wheel whose fatbins hold no SASS or compatible PTX for a target GPU, listing what they hold.

    ``wheel`` was read by :func:`read_wheel_metadata` first: a file that is no zip never gets here.
    """
    if not archs:
        return
    from attnforge.catalog import load_catalog
    from attnforge.install.fatbin import arch_problems, wheel_targets

    try:
        modules = wheel_targets(wheel)
    except UNREADABLE as exc:  # a member damaged past its METADATA
        raise unreadable(wheel, exc) from None
    problems = arch_problems(modules, archs, load_catalog().tools.runs_on)
    if problems:
        raise InstallError(
            f"{wheel.name} has no GPU code for this machine; it was not installed",
            cause="; ".join(problems),
            hint="take a wheel built for this GPU (`attnforge plan` lists them) or build it: --from-source",
        )
