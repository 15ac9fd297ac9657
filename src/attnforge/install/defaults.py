"""The real collaborators of :func:`attnforge.install.flow.install`: resolver, builder, verifier, index fetch
(:func:`attnforge.provision.install.install` wires them to the assembled request).

Each is imported when used, so ``attnforge install`` starts fast and this module works in builds of attnforge
where a stage is missing (the error then says which).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from attnforge._system.runner import Runner
from attnforge.build.frontend import installer_for
from attnforge.catalog import Catalog
from attnforge.errors import InstallError
from attnforge.install.flow import BuiltWheel, IndexFetcher, Planner, Verifier, VerifyOutcome
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.types import BuildSpec, CachedArtifact, CandidateKind, Plan, Request, WheelRef

if TYPE_CHECKING:
    from attnforge.build.progress import Reporter

#: The module run in a fresh interpreter to verify a new install (a library entry point, not the CLI).
VERIFY_CHILD = "attnforge.verify.child"


def resolver_planner(
    snapshot: SystemSnapshot, catalog: Catalog, wheels: Sequence[WheelRef], home: Path | None,
    more_wheels: Callable[[], Sequence[WheelRef]] | None = None,
) -> Planner:
    """``attnforge.resolve.resolver.resolve`` bound to this machine, catalog and wheel listing.

    ``more_wheels`` lists further wheels (the known release sources: network) only when the plan needs them:
    the resolver ranks the installed backend and cache entries before any wheel, so when one of those is
    chosen without them it is chosen with them too, and a cache hit asks no server anything.
    """
    from attnforge.resolve.resolver import resolve

    listed: list[Sequence[WheelRef]] = []
    root = str(home) if home is not None else None  # None: the snapshot's own disk (a what-if of another machine)

    def plan(request: Request, *, cached: Sequence[CachedArtifact]) -> Plan:
        if more_wheels is not None and not listed:
            first = resolve(snapshot, catalog, request, cached=cached, wheels=wheels, home=root)
            if first.chosen is not None and first.chosen.kind in (CandidateKind.INSTALLED, CandidateKind.CACHE):
                return first
            listed.append(more_wheels())
        extra = listed[0] if listed else ()
        return resolve(snapshot, catalog, request, cached=cached, wheels=[*wheels, *extra], home=root)

    return plan


def source_builder(spec: BuildSpec, *, home: Path, reporter: Reporter | None = None) -> BuiltWheel:
    """``attnforge.build.execute``: the source build with its log; ``reporter`` takes its progress events (phases,
    ninja's ``[n/N]`` steps, heartbeats: :mod:`attnforge.build.progress`), none reported when None.

    Raises:
        BuildError: the build failed (``BuildFailure`` carries its log path and diagnosis).
    """
    from attnforge.build import execute

    result = execute(spec, home=home, reporter=reporter)
    return BuiltFiles(wheel_path=result.wheel, log_path=result.log_path, source_sha256=result.source_sha256,
                      owned_dir=result.wheel.parent)


@dataclass(frozen=True, slots=True, kw_only=True)
class BuiltFiles:
    """A finished build as the installer needs it; ``owned_dir`` is the builder's staging dir to remove."""

    wheel_path: Path
    log_path: Path | None
    source_sha256: str
    owned_dir: Path | None


def subprocess_verifier(runner: Runner, catalog: Catalog, python: str = sys.executable) -> Verifier:
    """Verify in a fresh interpreter (so the new install is what loads) through the library's child entry
    (``python -m attnforge.verify.child BACKEND``), never through the command line."""

    def verify(backend: str) -> VerifyOutcome:
        if importlib.util.find_spec(VERIFY_CHILD) is None:
            return VerifyOutcome(ok=None, summary="skipped: this attnforge has no verify stage")
        if backend not in catalog.backends:
            why = f"skipped: {backend} is not a catalog backend, so there is no attention kernel to check"
            return VerifyOutcome(ok=None, summary=why)
        done = runner.run([python, "-m", VERIFY_CHILD, backend], timeout_s=1800)
        return VerifyOutcome(ok=done.ok, summary=_summary(done.stdout, done.returncode, done.stderr))

    return verify


def _summary(stdout: str, returncode: int, stderr: str) -> str:
    try:
        doc = json.loads(stdout)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        results = doc.get("results")
        first = results[0] if isinstance(results, list) and results else None
        if isinstance(first, dict) and first.get("summary"):
            return str(first["summary"])
        if doc.get("error"):
            return f"verify failed: {doc['error']}"
    if returncode == 0:
        return "verify passed"
    tail = (stderr.strip().splitlines() or [f"exit status {returncode}"])[-1]
    return f"verify failed: {tail}"


def index_fetcher(catalog: Catalog, runner: Runner, python: str = sys.executable) -> IndexFetcher:
    """Fetch a pure-Python backend (the resolver's "pip install from the package index" candidate)."""

    def fetch(request: Request, into: Path) -> Path:
        recipe = catalog.recipe(request.backend)
        distribution = recipe.distribution if recipe is not None and recipe.distribution else request.backend
        return download_from_index(distribution, request.version, request, into, runner=runner, python=python)

    return fetch


def download_from_index(
    distribution: str, version: str, request: Request, into: Path, *, runner: Runner,
    python: str = sys.executable,
) -> Path:
    """``pip download --no-deps --only-binary=:all:`` of one pure-Python backend from the package index.

    Raises:
        InstallError: pip could not download it (its last lines are the cause).
    """
    indexes = [a for i, url in enumerate(request.index_urls) for a in ("--index-url" if i == 0 else
                                                                       "--extra-index-url", url)]
    argv = installer_for(python, runner=runner).download_argv(
        "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "--no-input", "--quiet", "--dest",
        str(into), *indexes, f"{distribution}{version}")
    done = runner.run(argv, timeout_s=900)
    wheels = sorted(into.glob("*.whl"))
    if not done.ok or not wheels:
        raise InstallError(f"pip could not download {distribution}{version}",
                           cause="\n".join(done.output.strip().splitlines()[-10:]))
    return wheels[0]
