"""``build``: a source build of a request into the cache, keyed and labelled as ``install`` keys it.

:func:`prepare` assembles the request (as ``plan`` and ``install`` do) and sizes the build (the resolver's
:class:`~attnforge.resolve.types.BuildSpec`, then the command line's ``--jobs``/``--sccache``/``--name``);
:func:`build` executes it, streaming progress events to the caller's reporter, and stores the wheel through
:func:`attnforge.install.keys.store_built` (version checked against the request, ABI read from the binary,
labelled, keyed).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnforge.build import BuildFailure as BuildFailure  # noqa: PLC0414 - what a failed build raises, for verbs
from attnforge.build import BuildResult
from attnforge.build import NullReporter as NullReporter  # noqa: PLC0414 - the silent reporter, for verbs
from attnforge.install.inputs import RequestArgs
from attnforge.install.keys import build_flags as build_flags  # noqa: PLC0414 - what of a spec a key holds
from attnforge.resolve.types import BuildSpec

if TYPE_CHECKING:
    from attnforge.build import Reporter
    from attnforge.build.stream import Launcher
    from attnforge.cache.key import CacheKeyInputs
    from attnforge.probe.snapshot import SystemSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildJob:
    """A build decided before any compiler runs.

    Attributes:
        spec: what is built (archs, jobs, environment, root).
        home: ``$ATTNFORGE_HOME`` (the store, the logs, the staging directory).
        snapshot: the machine that builds (its torch keys the wheel); None only for an uncached build.
        wanted_version: the request's version specifier; a built version outside it is not cached.
    """

    spec: BuildSpec
    home: Path
    snapshot: SystemSnapshot | None
    wanted_version: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Built:
    """A finished build.

    Attributes:
        result: the executor's result (log, duration, compile steps, sccache, kept tree).
        wheel: the stored wheel (the staging copy when nothing was stored).
        cache_key: the store entry (None when nothing was stored).
        python: the interpreter the wheel was built for.
    """

    result: BuildResult
    wheel: Path
    cache_key: str | None
    python: str

    def install_argv(self) -> tuple[str, ...]:
        """The command that installs ``wheel`` into :attr:`python` (uv in a uv venv): asked only when someone
        shows it, since finding the installer runs the interpreter and fails where it has neither pip nor uv.

        Raises:
            InstallError: the interpreter has neither pip nor uv.
        """
        from attnforge._system.runner import SubprocessRunner
        from attnforge.build.frontend import installer_for

        frontend = installer_for(self.python, runner=SubprocessRunner())
        return tuple(frontend.argv("install", "--no-deps", str(self.wheel)))


def prepare(args: RequestArgs, *, jobs: int | None = None, use_sccache: bool = False, name: str | None = None,
            ) -> BuildJob:
    """The build ``attnforge build`` runs for ``args``.

    Raises:
        UsageError: bad input, or a backend with nothing to build.
        ResolveError: the preflight refuses the build here (every failed check in the cause).
    """
    from attnforge.install.inputs import assemble
    from attnforge.resolve import build_spec

    wanted = assemble(args, build=True)
    spec = with_options(build_spec(wanted.snapshot, wanted.catalog, wanted.request, home=str(wanted.home)),
                        jobs=jobs, use_sccache=use_sccache, name=name)
    return BuildJob(spec=spec, home=wanted.home, snapshot=wanted.snapshot, wanted_version=wanted.request.version)


def with_options(spec: BuildSpec, *, jobs: int | None, use_sccache: bool, name: str | None) -> BuildSpec:
    """The command line's last word on a resolver spec: ``--jobs``, ``--sccache``, ``--name``."""
    env = dict(spec.env)
    changes: dict[str, Any] = {}
    if jobs is not None:
        env.update(spec.job_env(jobs=jobs, threads=1))
        changes.update(max_jobs=jobs, nvcc_threads=1,
                       notes=(*spec.notes, f"--jobs {jobs}: MAX_JOBS={env['MAX_JOBS']} NVCC_THREADS=1"
                              + (f" {spec.parallel_env}={env[spec.parallel_env]}" if spec.parallel_env else "")))
    if use_sccache:
        changes["use_sccache"] = True
    if name:
        changes["name"] = name
    return dataclasses.replace(spec, env=env, **changes)


def build(job: BuildJob, *, reporter: Reporter, keep_build_dir: bool = False, launcher: Launcher | None = None,
          cache: bool = True) -> Built:
    """Execute ``job`` and, with ``cache``, put the wheel into the store under ``job.home`` (the staging copy is then
    removed); without it the wheel stays in the staging directory.

    Raises:
        BuildFailure: the build failed (its diagnosis and log path).
        BuildError: the built version is outside ``job.wanted_version`` (nothing stored).
        CacheError: the store cannot be written.
    """
    from attnforge.build import execute
    from attnforge.build.stream import launch

    spec, snapshot = job.spec, job.snapshot
    if cache and snapshot is None:  # refused before an hour of compiling, not after it
        raise ValueError("a build is cached with the snapshot of the machine that built it")
    if cache and (job.home / "cache.db").exists():
        # the store's own problems (a newer attnforge's or a damaged cache.db, a bad lock file), said before an hour
        # of compiling, not after it (review, 2026-12-02); the same check cache import makes. A home this user cannot
        # write is the build's own first error (it stages there), said as the build says it
        from attnforge.cache import Store
        from attnforge.cache._db import writable

        store = Store(job.home)
        if writable(store.root):
            with store.reader("store the built wheel"):  # a reader: no wait on another process's cache.lock
                pass
    result = execute(spec, home=job.home, reporter=reporter, keep_build_dir=keep_build_dir, snapshot=job.snapshot,
                     launcher=launcher or launch)
    wheel, key = result.wheel, None
    if cache and snapshot is not None:
        from attnforge.cache import Store
        from attnforge.install.keys import store_built

        entry = store_built(Store(job.home), spec, wheel=result.wheel, log_path=result.log_path,
                            source_sha256=result.source_sha256, snapshot=snapshot, owned_dir=result.wheel.parent,
                            wanted_version=job.wanted_version)
        wheel, key = Path(entry.path), entry.key
    return Built(result=result, wheel=wheel, cache_key=key, python=spec.python or sys.executable)



@dataclass(frozen=True, slots=True, kw_only=True)
class NodeBuilt:
    """A build made on a fleet node, labelled and keyed there, not stored (the head publishes it).

    Attributes:
        result: the executor's result (log, duration, source hash).
        wheel: the labelled wheel (in the builder's staging directory: the caller removes it).
        inputs: its cache-key inputs, as ``install`` keys a build of the same spec on the same machine.
    """

    result: BuildResult
    wheel: Path
    inputs: CacheKeyInputs


def build_here(spec: BuildSpec, *, home: Path, snapshot: SystemSnapshot, reporter: Reporter) -> NodeBuilt:
    """Execute ``spec`` on this machine (the fleet's build task on its node) and label and key the wheel as
    ``install`` does (:func:`attnforge.install.keys.label_and_key`: by the ABI the binary really has, so a
    stable-ABI build gets the one key the fleet's plan gave it for every torch >= its minimum).

    Raises:
        BuildFailure: the build failed (its diagnosis and log path).
        AttnforgeError: the build was refused before compiling (no interpreter, no source).
    """
    from attnforge.build import execute
    from attnforge.install.keys import label_and_key

    result = execute(spec, home=home, reporter=reporter, snapshot=snapshot)
    wheel, inputs = label_and_key(result.wheel, spec, source_sha256=result.source_sha256, snapshot=snapshot,
                                  log_path=result.log_path)
    return NodeBuilt(result=result, wheel=wheel, inputs=inputs)


def source_tree_sha256(top: Path) -> str:
    """The content hash of a source directory, as a build of it records its source (hex sha256 over every file's
    relative path, executable bit and bytes; VCS folders, caches and build outputs skipped:
    :func:`attnforge.build.source.tree_sha256`). An edit makes a new key."""
    from attnforge.build.source import tree_sha256

    return tree_sha256(top)


def key_torch(snapshot: SystemSnapshot) -> tuple[str | None, str | None, bool | None]:
    """(torch version, torch's CUDA, C++11 ABI) that key a per-torch build for the machine ``snapshot`` describes
    (all None without torch): :func:`attnforge.install.keys.torch_fields`."""
    from attnforge.install.keys import torch_fields

    return torch_fields(snapshot)
