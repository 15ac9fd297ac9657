"""What runs on the builder node: the build (:func:`attnforge.provision.build.build_here`: executed, labelled and
keyed there, as ``install`` keys it), its progress lines (to the worker's stderr, which Ray streams to the head, and
to the fleet log), and the labelled wheel sent back to the head, which publishes it (:mod:`attnforge.fleet.build`)."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path, PurePath
from typing import Any

from attnforge._serde import to_jsonable
from attnforge.build.progress import BuildEvent, HeartbeatEvent, PhaseEvent, StepEvent
from attnforge.errors import AttnforgeError
from attnforge.resolve.types import BuildSpec


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
    from attnforge.probe.snapshot import SystemSnapshot
    from attnforge.provision.build import BuildFailure, build_here

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
            built = build_here(spec, home=home, reporter=reporter, snapshot=snapshot)
        except BuildFailure as failure:
            _append(log, failure.log_path)
            return {"ok": False, "message": failure.message, "diagnosis": to_jsonable(failure.diagnosis),
                    "node": _node_id()}
        except AttnforgeError as error:  # refused before compiling (no interpreter, no source): its own words
            reporter.line(f"error: {error.message}")
            return {"ok": False, "message": error.message, "diagnosis": {
                "known": True, "title": error.message, "cause": error.cause or error.message,
                "fix": [error.hint] if error.hint else []}}
        result, wheel, inputs = built.result, built.wheel, built.inputs
        _append(log, str(result.log_path))
        reporter.line(f"built {wheel.name} in {result.duration_s:.1f} s")
        data = wheel.read_bytes()
        _remove_staged(wheel, result.wheel)  # the head keeps the wheel: no copies left in the node's staging dir
        return {"ok": True, "filename": wheel.name, "data": data, "inputs": inputs.to_json(),
                "duration_s": result.duration_s, "node": _node_id()}


def _node_id() -> str | None:
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id())
    except Exception:
        return None


def _remove_staged(*wheels: Path) -> None:
    """Remove the built and the labelled wheel from the builder's staging directory (0.5-1 GB for flash-attn)."""
    for wheel in {w.resolve() for w in wheels}:
        wheel.unlink(missing_ok=True)


def _append(log: Any, path: str | None) -> None:
    if path and Path(path).is_file():
        log.write(f"--- build log {path} ---\n")
        log.write(Path(path).read_text(encoding="utf-8", errors="replace"))
