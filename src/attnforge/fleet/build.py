"""The planned builds as Ray tasks: one per artifact key, on any capable node Ray picks, sized like a local build.

Each build runs :func:`attnforge.fleet.builder.node_build` (:func:`attnforge.build.execute` and the labelling) on
one of the plan's ``builder_nodes`` (every node whose platform, Python, torch and toolchain fit; GPU-less ones
too), chosen by Ray's scheduler through a label selector on ``ray.io/node-id``, with ``num_cpus`` = ``MAX_JOBS x
NVCC_THREADS`` and ``memory`` = that x the recipe's GiB per nvcc thread (the local memory-safe jobs rule of
:mod:`attnforge.resolve.jobs`, capped to the smallest candidate). Results are taken as they arrive
(``ray.wait``) and each wheel is published and read back (:mod:`.index`) before it counts.

Faults: ``max_retries=1`` makes Ray run a build again once, on any candidate, when its worker or node dies; a
second death is reported failed with the log and a diagnosis. A build error of the build itself is not retried
(it would fail the same way). A build whose candidates all left is cancelled and reported lost; the other builds
finish. A refused upload fails that build only. Ctrl-C cancels the running tasks and publishes nothing more
(:class:`BuildsInterrupted`). Each key is built under its index lock, and a key already in the index is not
built again.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock

from attnforge._serde import to_jsonable
from attnforge.errors import AttnforgeError
from attnforge.fleet.builder import node_build
from attnforge.fleet.cluster import IDLE_LINE_S, Selection, on_nodes, task_failure, waiting_line
from attnforge.fleet.index import Index, Published, scratch_dir
from attnforge.fleet.kinds import Node
from attnforge.fleet.plan import FleetBuild, artifact_key
from attnforge.resolve.types import BuildSpec, SourceKind

GIB = 1 << 30


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """Why a build published nothing.

    Attributes:
        message: what went wrong, in the build's own words (or Ray's, when the worker died or the node left).
        diagnosis: cause and fix as ``attnforge diagnose --json`` gives them (``known``, ``title``, ``cause``,
            ``fix``, ...); None when there is nothing to diagnose (no node of the kind is alive).
    """

    message: str
    diagnosis: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildOutcome:
    """What became of one planned build.

    Attributes:
        build: the planned build, its key sharpened for a local source directory (:func:`_key_with_source`):
            the key it is locked and published under.
        status: ``built`` (published now and read back), ``present`` (already in the index: not built again),
            ``failed`` (the build failed, its worker died twice, or the index did not take the wheel), ``lost``
            (every node that could build it left, or none is alive), ``cancelled`` (Ctrl-C: nothing published).
        node: the node id it ran on; duration_s: the build's wall time on it, seconds (``built`` only).
        log_path: the build's log (``LOG_DIR/<key>.log``).
        wheel: the wheel in the index (``built``, ``present``); failure: why not (``failed``, ``lost``).
    """

    build: FleetBuild
    status: str
    node: str | None = None
    duration_s: float | None = None
    log_path: str | None = None
    wheel: Published | None = None
    failure: Failure | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Sizing:
    """Ray resources of one build task and the spec it runs with (jobs lowered when the node has fewer CPUs)."""

    num_cpus: int
    memory_bytes: int
    spec: BuildSpec


def size_task(spec: BuildSpec, *, gib_per_thread: int, node_cpus: float, node_memory_bytes: float) -> Sizing:
    """``num_cpus`` = ``MAX_JOBS x NVCC_THREADS`` and ``memory`` = that x ``gib_per_thread`` GiB, both capped to
    the node (a node with fewer CPUs than the spec asks gets ``MAX_JOBS`` = its CPUs and one nvcc thread)."""
    want = max(1, spec.max_jobs * spec.nvcc_threads)
    cpus = max(1, min(want, int(node_cpus))) if node_cpus >= 1 else want
    if cpus < want:
        env = {**spec.env, **spec.job_env(jobs=cpus, threads=1)}
        note = f"fleet: the node has {cpus} CPU(s) for Ray: MAX_JOBS={env['MAX_JOBS']}"
        spec = dataclasses.replace(spec, env=env, max_jobs=cpus, nvcc_threads=1, notes=(*spec.notes, note))
    memory = cpus * gib_per_thread * GIB
    memory = min(memory, int(node_memory_bytes * 0.9)) if node_memory_bytes > 0 else 0  # 0: nothing to reserve
    return Sizing(num_cpus=cpus, memory_bytes=memory, spec=spec)


class BuildsInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during :func:`run_builds`: the running builds were cancelled (``ray.cancel``) and
    nothing more was published. ``outcomes`` has every build: those finished before, the rest ``cancelled``."""

    def __init__(self, outcomes: list[BuildOutcome], signum: int = 2) -> None:
        super().__init__("the builds were cancelled")
        self.outcomes, self.signum = outcomes, signum


@dataclass(slots=True, kw_only=True)
class _Running:
    """A submitted build: its Ray task, the lock it holds, the nodes it may run on."""

    index: int
    build: FleetBuild
    ref: Any
    lock: Any
    candidates: list[str]
    log_path: str
    started: float


def run_builds(ray: Any, builds: Sequence[FleetBuild], nodes: Sequence[Node], index: Index, *, home: Path,
               log_dir: Path, on_event: Callable[[str], None] = lambda _: None, builders: Selection | None = None,
               idle_s: float = IDLE_LINE_S) -> list[BuildOutcome]:
    """Run ``builds`` in parallel as Ray tasks and publish each wheel to ``index`` as it arrives; never raises for
    one build (a failed build, a lost node, a refused upload: that build's outcome, the others go on).

    Each build may run on any alive node of its plan's ``builder_nodes`` (every node that can compile it, GPU or
    not) that ``builders`` admits: Ray's scheduler picks one (a label selector ``ray.io/node-id in (...)``), and a
    retry after a worker or node death goes to any of them again. A build none of whose nodes is alive any more
    is cancelled and reported ``lost``.

    Args:
        ray: the connected ``ray`` module (:func:`attnforge.fleet.cluster.connect`).
        builds: the plan's builds; nodes: the probed alive nodes (their Ray CPU and memory size the tasks).
        index: where wheels go (:func:`attnforge.fleet.index.open_index`).
        home: the head's ``$ATTNFORGE_HOME`` (scratch); log_dir: where builders write logs (shared storage).
        on_event: one line per start / end of a build, and while nothing arrives for ``idle_s``.
        builders: ``--builders LABEL=VALUE``: only nodes with these Ray labels build.

    Raises:
        BuildsInterrupted: Ctrl-C: the running tasks were cancelled (``ray.cancel(force=True)``) and nothing
            more was published; it carries every build's outcome.
    """
    from attnforge.fleet.cluster import alive_nodes

    builders = builders or Selection()
    outcomes: dict[int, BuildOutcome] = {}
    running: list[_Running] = []
    waiting: list[tuple[int, FleetBuild, Any]] = []  # another fleet build holds the key's lock
    by_id = {n.node_id: n for n in nodes}

    def admitted() -> set[str]:
        return {str(r["NodeID"]) for r in alive_nodes(ray) if builders.admits(r)}

    def start(i: int, build: FleetBuild, lock: Any) -> None:
        present = index.published(build.key)
        if present is not None:
            on_event(f"build {build.number}: {present.filename} is already in the index (key {build.key[:19]})")
            outcomes[i] = BuildOutcome(build=build, status="present", wheel=present)
            lock.release()
            return
        alive = admitted()
        candidates = [n for n in build.builder_nodes if n in alive and n in by_id and by_id[n].cpus >= 1]
        if not candidates:
            lock.release()
            outcomes[i] = BuildOutcome(build=build, status="lost", failure=Failure(
                message=f"no alive node can build it (of {len(build.builder_nodes)} capable"
                        + (f", none admitted by --builders {' '.join(f'{k}={v}' for k, v in builders.labels)}"
                           if builders.labels else "") + ")"))
            on_event(f"build {build.number}: lost: {outcomes[i].failure.message}")  # type: ignore[union-attr]
            return
        smallest = min((by_id[n] for n in candidates), key=lambda n: (n.cpus, n.memory_bytes))
        sizing = size_task(build.spec, gib_per_thread=build.gib_per_thread, node_cpus=smallest.cpus,
                           node_memory_bytes=smallest.memory_bytes)
        on_event(f"build {build.number}: {build.backend} for {', '.join(map(str, build.archs))} on any of "
                 f"{len(candidates)} capable node(s), {sizing.num_cpus} CPU(s)")
        task = on_nodes(ray, node_build, candidates, num_cpus=sizing.num_cpus, memory=sizing.memory_bytes,
                        max_retries=1, retry_exceptions=False)
        ref = task.remote(sizing.spec, smallest.snapshot.to_json(indent=None), build.key, str(log_dir))
        running.append(_Running(index=i, build=build, ref=ref, lock=lock, candidates=candidates,
                                log_path=str(log_dir / f"{build.key.removeprefix('sha256:')[:32]}.log"),
                                started=time.monotonic()))

    def take_lock(i: int, build: FleetBuild) -> None:
        lock = index.lock(build.key)
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            on_event(f"build {build.number}: waiting: another fleet build holds the lock of key {build.key[:19]}")
            waiting.append((i, build, lock))
            return
        start(i, build, lock)

    try:
        for i, build in enumerate(builds):
            take_lock(i, dataclasses.replace(build, key=_key_with_source(build)))
        quiet_since = time.monotonic()
        while running or waiting:
            for item in list(waiting):
                try:
                    item[2].acquire(timeout=0)
                except filelock.Timeout:
                    continue
                waiting.remove(item)
                start(*item)
            if not running:
                time.sleep(0.5)
                continue
            ready, _ = ray.wait([r.ref for r in running], num_returns=1, timeout=1.0)
            for done in [r for r in running if r.ref in ready]:
                running.remove(done)
                outcomes[done.index] = _finish(ray, done, index=index, home=home, on_event=on_event)
                done.lock.release()
                quiet_since = time.monotonic()
            if not ready and time.monotonic() - quiet_since >= idle_s:
                quiet_since = time.monotonic()
                _check_alive(ray, running, outcomes, admitted(), on_event)
                if running:
                    on_event(waiting_line(ray, len(outcomes), len(running)))
    except KeyboardInterrupt as exc:
        for r in running:
            ray.cancel(r.ref, force=True)
            r.lock.release()
            outcomes[r.index] = BuildOutcome(build=r.build, status="cancelled", log_path=r.log_path,
                                             failure=Failure(message="cancelled (Ctrl-C): nothing published"))
        for i, build, _lock in waiting:
            outcomes[i] = BuildOutcome(build=build, status="cancelled",
                                       failure=Failure(message="cancelled (Ctrl-C) while waiting for the key's lock"))
        for i, build in enumerate(builds):
            outcomes.setdefault(i, BuildOutcome(build=build, status="cancelled",
                                                failure=Failure(message="cancelled (Ctrl-C) before it started")))
        raise BuildsInterrupted([outcomes[i] for i in range(len(builds))],
                                int(getattr(exc, "signum", 2))) from None
    return [outcomes[i] for i in range(len(builds))]


def _check_alive(ray: Any, running: list[_Running], outcomes: dict[int, BuildOutcome], alive: set[str],
                 on_event: Callable[[str], None]) -> None:
    """Cancel and report ``lost`` each running build none of whose nodes is alive (Ray would keep it queued)."""
    for r in list(running):
        if not set(r.candidates) & alive:
            ray.cancel(r.ref, force=True)
            running.remove(r)
            r.lock.release()
            outcomes[r.index] = BuildOutcome(build=r.build, status="lost", log_path=r.log_path, failure=Failure(
                message="every node that could build it left the cluster"))
            on_event(f"build {r.build.number}: lost: every node that could build it left the cluster")


def _finish(ray: Any, r: _Running, *, index: Index, home: Path, on_event: Callable[[str], None]) -> BuildOutcome:
    """The outcome of a finished task: failed, lost, or published (and read back)."""
    build, log_path = r.build, r.log_path
    try:
        out = ray.get(r.ref)
    except Exception as exc:  # the worker died twice, or the node left: reported, the others go on
        return _died(ray, build, candidates=r.candidates, exc=exc, log_path=log_path, on_event=on_event)
    if not out["ok"]:
        on_event(f"build {build.number}: failed: {out['message']} (log: {log_path})")
        return BuildOutcome(build=build, status="failed", node=out.get("node"), log_path=log_path,
                            failure=Failure(message=out["message"], diagnosis=out["diagnosis"]))
    try:
        published = _publish(index, build.key, out, home, log_path)
    except (AttnforgeError, OSError) as exc:  # this build's upload only: the others are published and reported
        message = exc.message if isinstance(exc, AttnforgeError) else str(exc)
        cause = exc.cause if isinstance(exc, AttnforgeError) else None
        on_event(f"build {build.number}: built, but not published: {message}")
        return BuildOutcome(build=build, status="failed", node=out.get("node"), log_path=log_path,
                            failure=Failure(message=f"built {out['filename']}, but not published: {message}",
                                            diagnosis={"known": True, "title": "the index did not take the wheel",
                                                       "cause": cause or message,
                                                       "fix": [getattr(exc, "hint", None) or "check the index"]}))
    on_event(f"build {build.number}: published {published.filename}")
    return BuildOutcome(build=build, status="built", node=out.get("node"), duration_s=out["duration_s"],
                        log_path=log_path, wheel=published)


def _publish(index: Index, key: str, out: dict[str, Any], home: Path, log_path: str) -> Published:
    from attnforge.cache.key import CacheKeyInputs

    with scratch_dir(home) as tmp:
        wheel = tmp / out["filename"]
        wheel.write_bytes(out["data"])
        log = Path(log_path) if Path(log_path).is_file() else None
        return index.publish(key, wheel, CacheKeyInputs.from_json(out["inputs"]), log)


def _died(ray: Any, build: FleetBuild, *, candidates: Sequence[str], exc: Exception, log_path: str,
          on_event: Callable[[str], None]) -> BuildOutcome:
    from ray import exceptions as rex

    from attnforge.diagnose import diagnose_text
    from attnforge.fleet.cluster import alive_nodes

    gone = not set(candidates) & {str(n["NodeID"]) for n in alive_nodes(ray)}
    lost = gone or isinstance(exc, rex.NodeDiedError)
    what = task_failure(exc)
    if isinstance(exc, rex.RayTaskError):  # the build code raised (not retried: it would raise again)
        on_event(f"build {build.number}: failed: {what} (log: {log_path})")
        return BuildOutcome(build=build, status="failed", log_path=log_path, failure=Failure(
            message=what, diagnosis={"known": False, "title": "the build task raised", "cause": what,
                                     "fix": ["read the log", "report it: this is a bug of attnforge fleet"]}))
    text = Path(log_path).read_text(encoding="utf-8", errors="replace") if Path(log_path).is_file() else ""
    diagnosis: dict[str, Any] | None = to_jsonable(diagnose_text(text, log_path=log_path)) if text else None
    if diagnosis is None or not diagnosis.get("known"):
        diagnosis = {"known": False, "title": "the build's Ray worker died",
                     "cause": f"the worker running the build died on both tries ({what}): killed by a signal, the "
                              "OOM killer, or its node left",
                     "fix": ["read the log", "lower the build's memory use: fewer jobs (MAX_JOBS) or a node with "
                             "more RAM", "run `attnforge fleet build` again: it builds only what is missing"]}
    status = "lost" if lost else "failed"
    on_event(f"build {build.number}: {status}: {what} (log: {log_path})")
    return BuildOutcome(build=build, status=status, log_path=log_path,
                        failure=Failure(message=what, diagnosis=diagnosis))


def _key_with_source(build: FleetBuild) -> str:
    """The plan's key, sharpened with the tree hash of a local source directory (edits make a new key)."""
    source = build.spec.source
    if source.kind is SourceKind.PATH and Path(source.location).is_dir():
        from attnforge.provision.build import source_tree_sha256

        return artifact_key(build.request, build.spec, build.wheel, source_tree_sha256(Path(source.location)))
    return build.key
