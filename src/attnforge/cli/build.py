"""``attnforge build``: a source build with a progress bar, a log, and a diagnosis when it fails.

:func:`attnforge.provision.build.prepare` assembles the request as ``plan`` and ``install`` assemble theirs and sizes
the build; :func:`attnforge.provision.build.build` runs it and stores the wheel keyed as ``install`` keys it. This
module renders progress events and the result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from attnforge.build.progress import BuildEvent, HeartbeatEvent, PhaseEvent, StepEvent
from attnforge.cli._output import console, emit_json, json_option
from attnforge.cli._request import request_args, request_options
from attnforge.resolve.types import BuildSpec


@click.command("build")
@request_options
@click.option("--name", default=None,
              help="Distribution name for a --source build (default: the requirement's name, else from the source).")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="At most N compiler processes (MAX_JOBS=N, NVCC_THREADS=1); lower it when memory runs "
                   "out.")
@click.option("--keep-build-dir", is_flag=True,
              help="Keep the build tree so a rerun resumes instead of starting over.")
@click.option("--sccache", "use_sccache", is_flag=True,
              help="Route nvcc and the C++ compiler through sccache.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output; only the result.")
@json_option
def command(*, name: str | None, jobs: int | None, keep_build_dir: bool, use_sccache: bool, quiet: bool,
            as_json: bool, **params: Any) -> int:
    """Build REQUIREMENT (a backend or its alias, optionally with a version) or any torch-extension --source
    into attnforge's cache, keyed as `attnforge install` keys it: the next install of it is a cache hit.

    The full log goes under attnforge's logs directory; a failed build prints the cause, the log lines that show
    it, and the fix.
    """
    from attnforge.provision.build import prepare

    job = prepare(request_args(params, name=name), jobs=jobs, use_sccache=use_sccache, name=name)
    warning = unsupported_compiler_warning(job.spec)
    if warning:
        click.echo(warning, err=True)
    return run_build(job.spec, home=job.home, snapshot=job.snapshot, keep_build_dir=keep_build_dir, quiet=quiet,
                     as_json=as_json, cache=True, wanted_version=job.wanted_version)


def run_build(
    spec: BuildSpec, *, home: Path, snapshot: Any, keep_build_dir: bool, quiet: bool, as_json: bool,
    launcher: Any = None, cache: bool = False, wanted_version: str = "",
) -> int:
    """Execute ``spec`` (:func:`attnforge.provision.build.build`) with progress on stderr and the result (or the
    diagnosis) for people or as JSON.

    With ``cache`` (the command line's), the wheel goes into the cache as ``install`` stores a build (only a version
    inside ``wanted_version``) and the staging copy is removed; without it the wheel stays in the staging directory.

    Returns:
        The exit code: 0 built, 1 the build failed (diagnosis printed).
    """
    from attnforge.provision.build import BuildFailure, BuildJob, NullReporter, build

    progress = contextlib.nullcontext(NullReporter()) if quiet else build_progress(spec.name, as_json=as_json)
    try:
        with progress as reporter:
            built = build(BuildJob(spec=spec, home=home, snapshot=snapshot, wanted_version=wanted_version),
                          reporter=reporter, keep_build_dir=keep_build_dir, launcher=launcher, cache=cache)
    except BuildFailure as failure:
        if as_json:
            emit_json("build", {"ok": False, "log_path": failure.log_path, "diagnosis": failure.diagnosis})
            return 1
        from attnforge.cli.diagnose import render_diagnosis

        render_diagnosis(console(stderr=True), failure.diagnosis)
        click.echo(f"error: {failure.message}", err=True)
        click.echo(f"log: {failure.log_path}", err=True)
        return 1
    # the executor's wheel is the staging copy, removed once stored: the result names the wheel that exists
    result, wheel, key = dataclasses.replace(built.result, wheel=built.wheel), built.wheel, built.cache_key
    if as_json:
        emit_json("build", {"ok": True, "result": result, "spec": spec, "cache_key": key, "wheel": wheel})
        return 0
    out = console()
    out.print(f"[bold green]built[/] {result.wheel.name} in {_clock(result.duration_s)}"
              + (f" ({result.steps_total} compile steps)" if result.steps_total else "")
              + (" [dim](resumed a kept build tree)[/]" if result.resumed else ""), soft_wrap=True)
    out.print(f"wheel: {wheel}", soft_wrap=True)
    if key is not None:
        out.print(f"cache key: {key} (`attnforge install` of the same request is a cache hit)", soft_wrap=True)
    out.print(f"log:   {result.log_path}", soft_wrap=True)
    out.print(f"source sha256: {result.source_sha256}")
    if spec.capabilities is not None:
        out.print(f"slim build, can run: {spec.capabilities.describe()}", soft_wrap=True, markup=False)
    if result.sccache is not None:
        out.print(f"sccache: {result.sccache.hits} hits, {result.sccache.misses} misses")
    if result.build_dir is not None:
        out.print(f"build tree kept at {result.build_dir}", soft_wrap=True)
    out.print(f"install it with: {shlex.join(built.install_argv())}", soft_wrap=True, markup=False)
    return 0


@contextlib.contextmanager
def build_progress(name: str, *, as_json: bool) -> Iterator[RichReporter | PlainReporter]:
    """How a source build shows its progress on stderr (``build``, and ``install`` when its plan builds), for the
    ``with`` block that builds: a live bar on a terminal (it appears at the build's first event and goes at the
    block's end), one line per event in logs, pipes and under ``--json`` (stdout keeps the JSON alone)."""
    err = console(stderr=True)
    if err.is_terminal and not as_json:
        with RichReporter(err, name) as bar:
            yield bar
    else:
        yield PlainReporter(lambda line: click.echo(line, err=True))


def unsupported_compiler_warning(spec: BuildSpec) -> str | None:
    """The at-your-own-risk line for ``--allow-unsupported-compiler``, or None when it was not given."""
    if not spec.allow_unsupported_compiler:
        return None
    if "-allow-unsupported-compiler" in spec.env.get("NVCC_APPEND_FLAGS", "").split():
        why = next((n for n in spec.notes if "--allow-unsupported-compiler" in n), "")
        return (f"warning: building with nvcc -allow-unsupported-compiler, at your own risk: {why}"
                if why else "warning: building with nvcc -allow-unsupported-compiler, at your own risk")
    return ("warning: --allow-unsupported-compiler: nvcc gets -allow-unsupported-compiler only if it would "
            "refuse the host compiler (on Windows: when no installed MSVC toolset fits), at your own risk")


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "--"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class PlainReporter:
    """One line per event for logs and pipes (CI): phases, ``[n/N]`` with elapsed/ETA/file, heartbeats."""

    def __init__(self, emit: Any) -> None:
        self._emit = emit

    def report(self, event: BuildEvent) -> None:
        if isinstance(event, PhaseEvent):
            self._emit(f"attnforge: {event.phase.value}: {event.detail}")
        elif isinstance(event, StepEvent):
            step = event.step
            self._emit(f"[{step.done}/{step.total}] {step.fraction:4.0%} elapsed {_clock(event.elapsed_s)} "
                       f"eta {_clock(event.eta_s)}  {step.file or ''}")
        elif isinstance(event, HeartbeatEvent):
            file = event.last_step.file if event.last_step else None
            last = f" (last finished: {file})" if file else ""
            self._emit(f"attnforge: still building, {_clock(event.idle_s)} without output, "
                       f"{_clock(event.elapsed_s)} elapsed{last}")


class RichReporter:
    """A live progress bar on a terminal: steps, elapsed, ETA, current file, and a heartbeat when silent."""

    def __init__(self, out: Any, name: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

        self._out = out
        self._progress = Progress(
            SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[clock]}"), TextColumn("[dim]{task.fields[file]}"),
            console=out, transient=False,
        )
        self._task = self._progress.add_task(f"{name}: starting", total=None, clock="", file="")
        self._started = time.monotonic()
        self._name = name
        self._live = False

    def __enter__(self) -> RichReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live:
            self._progress.stop()

    def report(self, event: BuildEvent) -> None:
        if not self._live:  # at the build's first event: an install served from the cache shows no bar
            self._progress.start()
            self._live = True
        if isinstance(event, PhaseEvent):
            self._progress.update(self._task, description=f"{self._name}: {event.phase.value}")
            if event.detail:
                self._progress.console.print(f"[dim]{event.phase.value}: {event.detail}[/]", soft_wrap=True)
        elif isinstance(event, StepEvent):
            step = event.step
            file = (step.file or "").rsplit("/", 1)[-1]
            self._progress.update(self._task, description=f"{self._name}: compiling", completed=step.done,
                                  total=step.total, file=file,
                                  clock=f"{_clock(event.elapsed_s)} eta {_clock(event.eta_s)}")
        elif isinstance(event, HeartbeatEvent):
            self._progress.update(self._task, description=f"{self._name}: still compiling "
                                  f"({_clock(event.idle_s)} without output)")
