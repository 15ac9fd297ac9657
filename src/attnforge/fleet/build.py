"""The planned builds as Ray tasks: one per artifact key, on a node of its builder kind, sized like a local build.

Each build runs :func:`attnforge.build.execute` on a node whose platform, Python and torch match the artifact
(the plan's builder nodes, pinned with node affinity), with Ray's ``num_cpus`` = ``MAX_JOBS x NVCC_THREADS`` and
``memory`` = that x the recipe's GiB per nvcc thread (the local memory-safe jobs rule of
:mod:`attnforge.resolve.jobs`, capped to the node). Its progress lines go to the worker's stderr, which Ray
streams to the head's stderr, and to ``LOG_DIR/<key>.log``. The wheel comes back labelled with the torch/CUDA/archs it
was built for (:func:`attnforge.install.guards.pinned_to_torch`) and the head publishes it (:mod:`.index`).

Faults: ``max_retries=1`` makes Ray run a build again once when its worker dies (SIGKILL, the OOM killer); a
second death is reported failed with the log and a diagnosis. A build error of the build itself is not retried
(it would fail the same way). A node that leaves is reported lost; the other builds finish. Nothing reaches the
index unless the build returned a whole wheel. Each key is built under its index lock, and a key already in
the index is not built again.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

import filelock

from attnforge._serde import to_jsonable
from attnforge.build.progress import BuildEvent, HeartbeatEvent, PhaseEvent, StepEvent
from attnforge.errors import AttnforgeError
from attnforge.fleet.cluster import on_node, task_failure
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
        status: ``built`` (published now), ``present`` (already in the index: not built again), ``failed``
            (the build failed, or its worker died twice), ``lost`` (its node left, or no node of its kind is alive).
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
        env = {**spec.env, "MAX_JOBS": str(cpus), "NVCC_THREADS": "1"}
        spec = dataclasses.replace(spec, env=env, max_jobs=cpus, nvcc_threads=1,
                                   notes=(*spec.notes, f"fleet: the node has {cpus} CPU(s) for Ray: MAX_JOBS={cpus}"))
    memory = cpus * gib_per_thread * GIB
    memory = min(memory, int(node_memory_bytes * 0.9)) if node_memory_bytes > 0 else 0  # 0: nothing to reserve
    return Sizing(num_cpus=cpus, memory_bytes=memory, spec=spec)


class _LogReporter:
    """Progress lines to stderr (Ray streams a worker's stderr to the head's stderr) and to the fleet log."""

    def __init__(self, prefix: str, log: Any) -> None:
        self.prefix, self.log = prefix, log

    def line(self, text: str) -> None:
        print(f"{self.prefix} {text}", file=sys.stderr, flush=True)  # Ray streams it to the head
        self.log.write(text + "\n")
        self.log.flush()

    def report(self, event: BuildEvent) -> None:
        if isinstance(event, PhaseEvent):
            self.line(f"{event.phase.value}: {event.detail}")
        elif isinstance(event, StepEvent):
            self.line(f"[{event.step.done}/{event.step.total}] {event.step.file or ''}")
        elif isinstance(event, HeartbeatEvent):
            self.line(f"still building, {event.idle_s:.0f} s without output")


def node_build(spec: BuildSpec, snapshot_json: str, key: str, log_dir: str) -> dict[str, Any]:
    """Run on the builder node: build ``spec``, label the wheel, return it with its cache-key inputs.

    Returns a dict: ``ok``; on success ``filename``, ``data`` (the wheel's bytes), ``inputs`` (JSON of its
    :class:`~attnforge.cache.key.CacheKeyInputs`), ``duration_s``; on a build failure ``message`` and
    ``diagnosis``. The node's ``$ATTNFORGE_HOME`` holds the build tree; ``log_dir`` (shared) gets the log.
    """
    from attnforge._system.paths import home_dir
    from attnforge.build import BuildFailure, execute
    from attnforge.install.guards import pinned_to_torch
    from attnforge.install.keys import built_wheel_inputs
    from attnforge.probe.snapshot import SystemSnapshot

    snapshot = SystemSnapshot.from_json(snapshot_json)
    home = home_dir(os.environ)
    if snapshot.platform.os != "windows":  # the build tree under this node's own home
        spec = dataclasses.replace(spec, build_root=str(home / "b" / PurePath(spec.build_root).name))
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    running = home / "fleet" / "running"
    running.mkdir(parents=True, exist_ok=True)
    hexkey = key.removeprefix("sha256:")[:32]
    (running / f"{hexkey}.pid").write_text(str(os.getpid()), encoding="utf-8")  # which worker builds it
    with open(Path(log_dir) / f"{hexkey}.log", "a", encoding="utf-8") as log:
        reporter = _LogReporter(f"[fleet build {hexkey[:12]}]", log)
        reporter.line(f"attempt in worker pid {os.getpid()}: {spec.name} for {', '.join(map(str, spec.archs))}")
        try:
            result = execute(spec, home=home, reporter=reporter, snapshot=snapshot)
        except BuildFailure as failure:
            _append(log, failure.log_path)
            return {"ok": False, "message": failure.message, "diagnosis": to_jsonable(failure.diagnosis)}
        except AttnforgeError as error:  # refused before compiling (no interpreter, no source): its own words
            reporter.line(f"error: {error.message}")
            return {"ok": False, "message": error.message, "diagnosis": {
                "known": True, "title": error.message, "cause": error.cause or error.message,
                "fix": [error.hint] if error.hint else []}}
        _append(log, str(result.log_path))
        wheel = pinned_to_torch(result.wheel, spec, snapshot)
        inputs = built_wheel_inputs(wheel=wheel, spec=spec, source_sha256=result.source_sha256, snapshot=snapshot)
        reporter.line(f"built {wheel.name} in {result.duration_s:.1f} s")
        return {"ok": True, "filename": wheel.name, "data": wheel.read_bytes(), "inputs": inputs.to_json(),
                "duration_s": result.duration_s}


def _append(log: Any, path: str | None) -> None:
    if path and Path(path).is_file():
        log.write(f"--- build log {path} ---\n")
        log.write(Path(path).read_text(encoding="utf-8", errors="replace"))


def run_builds(ray: Any, builds: Sequence[FleetBuild], nodes: Sequence[Node], index: Index, *, home: Path,
               log_dir: Path, on_event: Callable[[str], None] = lambda _: None) -> list[BuildOutcome]:
    """Run ``builds`` in parallel as Ray tasks and publish each wheel to ``index``; never raises for one build.

    Args:
        ray: the connected ``ray`` module (:func:`attnforge.fleet.cluster.connect`).
        builds: the plan's builds; nodes: the probed alive nodes (their Ray CPU and memory size the tasks).
        index: where wheels go (:func:`attnforge.fleet.index.open_index`).
        home: the head's ``$ATTNFORGE_HOME`` (scratch); log_dir: where builders write logs (shared storage).
        on_event: one line per start / end of a build, for the CLI.
    """
    by_id = {n.node_id: n for n in nodes}
    with ThreadPoolExecutor(max_workers=max(1, len(builds))) as pool:
        futures = []
        for i, build in enumerate(builds):
            candidates = [by_id[n] for n in build.builder_nodes if n in by_id and by_id[n].cpus >= 1]
            node = candidates[i % len(candidates)] if candidates else None
            futures.append(pool.submit(_one, ray, build, node=node, index=index, home=home, log_dir=log_dir,
                                       on_event=on_event))
        return [f.result() for f in futures]


def _one(ray: Any, build: FleetBuild, *, node: Node | None, index: Index, home: Path, log_dir: Path,
         on_event: Callable[[str], None]) -> BuildOutcome:
    build = dataclasses.replace(build, key=_key_with_source(build))
    key = build.key
    log_path = str(log_dir / f"{key.removeprefix('sha256:')[:32]}.log")
    with _held(index.lock(key), lambda: on_event(
            f"build {build.number}: waiting: another fleet build holds the lock of key {key[:19]}")):
        present = index.published(key)
        if present is not None:
            on_event(f"build {build.number}: {present.filename} is already in the index (key {key[:19]})")
            return BuildOutcome(build=build, status="present", wheel=present)
        if node is None:
            return BuildOutcome(build=build, status="lost",
                                failure=Failure(message=f"no alive node of kind {build.builder} can build it"))
        sizing = size_task(build.spec, gib_per_thread=build.gib_per_thread, node_cpus=node.cpus,
                           node_memory_bytes=node.memory_bytes)
        on_event(f"build {build.number}: {build.backend} for {', '.join(map(str, build.archs))} on node "
                 f"{node.node_id[:12]} ({node.address}), {sizing.num_cpus} CPU(s)")
        task = on_node(ray, node_build, node.node_id, num_cpus=sizing.num_cpus, memory=sizing.memory_bytes,
                       max_retries=1, retry_exceptions=False)
        start = time.monotonic()
        try:
            out = ray.get(task.remote(sizing.spec, node.snapshot.to_json(indent=None), key, str(log_dir)))
        except Exception as exc:  # the worker died twice, or the node left: reported, the others go on
            return _died(ray, build, node=node, exc=exc, log_path=log_path, on_event=on_event)
        if not out["ok"]:
            on_event(f"build {build.number}: failed: {out['message']} (log: {log_path})")
            return BuildOutcome(build=build, status="failed", node=node.node_id, log_path=log_path,
                                failure=Failure(message=out["message"], diagnosis=out["diagnosis"]))
        published = _publish(index, key, out, home, log_path)
        on_event(f"build {build.number}: published {published.filename}")
        return BuildOutcome(build=build, status="built", node=node.node_id, duration_s=time.monotonic() - start,
                            log_path=log_path, wheel=published)


@contextmanager
def _held(lock: filelock.BaseFileLock, on_wait: Callable[[], None]) -> Iterator[None]:
    """Hold ``lock``; call ``on_wait`` first when another process holds it (then wait as long as it takes)."""
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        on_wait()
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _publish(index: Index, key: str, out: dict[str, Any], home: Path, log_path: str) -> Published:
    from attnforge.cache.key import CacheKeyInputs

    with scratch_dir(home) as tmp:
        wheel = tmp / out["filename"]
        wheel.write_bytes(out["data"])
        log = Path(log_path) if Path(log_path).is_file() else None
        return index.publish(key, wheel, CacheKeyInputs.from_json(out["inputs"]), log)


def _died(ray: Any, build: FleetBuild, *, node: Node, exc: Exception, log_path: str,
          on_event: Callable[[str], None]) -> BuildOutcome:
    from ray import exceptions as rex

    from attnforge.diagnose import diagnose_text
    from attnforge.fleet.cluster import alive_nodes

    gone = node.node_id not in {str(n["NodeID"]) for n in alive_nodes(ray)}
    lost = gone or isinstance(exc, rex.NodeDiedError)
    what = task_failure(exc)
    if isinstance(exc, rex.RayTaskError):  # the build code raised (not retried: it would raise again)
        on_event(f"build {build.number}: failed: {what} (log: {log_path})")
        return BuildOutcome(build=build, status="failed", node=node.node_id, log_path=log_path, failure=Failure(
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
    return BuildOutcome(build=build, status=status, node=node.node_id, log_path=log_path,
                        failure=Failure(message=what, diagnosis=diagnosis))


def _key_with_source(build: FleetBuild) -> str:
    """The plan's key, sharpened with the tree hash of a local source directory (edits make a new key)."""
    source = build.spec.source
    if source.kind is SourceKind.PATH and Path(source.location).is_dir():
        from attnforge.build.source import tree_sha256

        return artifact_key(build.request, build.spec, build.wheel, tree_sha256(Path(source.location)))
    return build.key
