"""Execute a :class:`~attnforge.resolve.types.BuildSpec`: source -> build tree -> wheel, watched and logged.

Guarantees:
- Nothing half-written is left behind: the wheel is built into a private scratch directory and only a complete
  wheel is moved (copy to ``.part``, then one rename) into a fresh staging directory the caller owns.
- Ctrl-C or SIGTERM stops the whole build process group, removes the scratch directory and (unless
  ``keep_build_dir``) the build tree, writes a last line to the log and re-raises.
- With ``keep_build_dir`` the build tree stays at a name derived from the source hash, so the next build of
  the same source finds ninja's objects and ``.ninja_log`` and only compiles what is missing.
- Every output line is in ``<home>/logs/`` as soon as it is printed; a failed build raises
:class:`BuildFailure`
  with the log path and a diagnosis of the real error.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import filelock
import psutil

from attnforge._system.runner import Runner, SubprocessRunner, which
from attnforge.build import sccache as sccache_mod
from attnforge.build.frontend import installer_for
from attnforge.build.ninja_order import install_shim
from attnforge.build.progress import NullReporter, Phase, PhaseEvent, Reporter
from attnforge.build.sccache import SccacheStats
from attnforge.build.source import FetchedSource, fetch, lay_out
from attnforge.build.stream import Launcher, launch, run_streamed
from attnforge.build.windows_layer import WindowsBuild, builds_on_windows, prepare_windows_build
from attnforge.catalog.recipes import SourceEdit
from attnforge.errors import BuildError, InstallError
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.types import BuildSpec

#: Written into a laid-out build tree; its content is the source sha256 the tree came from.
MARKER = ".attnforge-source"
_SCRATCH_PREFIX = ".scratch-"


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildResult:
    """A finished build.

    Attributes:
        name / version: what was built (version from the wheel's filename).
        wheel: the wheel, alone in a staging directory the caller now owns (move it, then remove the dir).
        log_path: the full build log.
        duration_s: wall time of the whole build, source fetch included.
        source_sha256: sha256 of the sdist archive, or the tree hash of a directory / git checkout.
        source: what the source was, in words.
        steps_done / steps_total: the last ninja ``[n/N]`` seen (0/0 when nothing needed compiling).
        build_dir: the kept build tree (``keep_build_dir``), else None.
        resumed: the build reused a kept tree from an earlier run.
        sccache: hits and misses during this build when sccache was used.
    """

    name: str
    version: str
    wheel: Path
    log_path: Path
    duration_s: float
    source_sha256: str
    source: str
    steps_done: int
    steps_total: int
    build_dir: Path | None
    resumed: bool
    sccache: SccacheStats | None


class BuildFailure(BuildError):  # noqa: N818 - a BuildError; the name says what the caller gets
    """A build that ran and failed; ``diagnosis`` says why (see :mod:`attnforge.diagnose`)."""

    def __init__(self, message: str, *, log_path: str, diagnosis: object, cause: str | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, log_path=log_path, cause=cause, hint=hint)
        self.diagnosis = diagnosis


def execute(
    spec: BuildSpec,
    *,
    home: Path,
    reporter: Reporter | None = None,
    keep_build_dir: bool = False,
    runner: Runner | None = None,
    launcher: Launcher = launch,
    environ: Mapping[str, str] | None = None,
    snapshot: object | None = None,
    heartbeat_s: float = 30.0,
) -> BuildResult:
    """Build ``spec`` into a wheel.

    Args:
        spec: the build, as the resolver decided it.
        home: attnforge's state directory; logs go to ``home/logs``, the wheel to ``home/staging/<id>/``.
        reporter: receives progress events (:mod:`attnforge.build.progress`); ignored when None.
        keep_build_dir: keep the build tree after the build (success or failure) so a rerun resumes.
        runner: runs the short commands (pip download, git, sccache stats, vcvars64 on Windows).
        launcher: starts the long build command (seam for tests: wrap argv, limit memory, ...).
        environ: the base environment (``os.environ`` when None); ``spec.env`` goes on top.
        snapshot: a :class:`~attnforge.probe.snapshot.SystemSnapshot` that sharpens the diagnosis on failure.
            A Windows snapshot (or none, on Windows) makes this a Windows build: ``vcvars64.bat`` is captured
            through ``runner`` and the environment is layered as :mod:`attnforge.build.windows_layer` says
            (``DISTUTILS_USE_SDK=1``, short TMP/TEMP, conformance flags in ``NVCC_APPEND_FLAGS``, the chosen
            toolkit as ``CUDA_HOME``/``CUDA_PATH``).
        heartbeat_s: seconds of silence before a heartbeat event.

    Returns:
        The result; the caller takes ownership of ``result.wheel`` and its directory.

    Raises:
        BuildFailure: pip wheel failed; ``log_path`` and ``diagnosis`` say where and why.
        BuildError: the build interpreter is missing, the source could not be fetched, another build holds
            the same tree, sccache is missing (or asked for on Windows), or the Windows environment could not
            be set up (no Visual Studio toolset nvcc accepts, vcvars64 failed).
        UsageError: a local source path that is not a source.
        KeyboardInterrupt: Ctrl-C, after cleaning up (SIGTERM arrives as
        :class:`~attnforge._system.interrupt.Interrupted`).
    """
    started = time.monotonic()
    reporter = reporter or NullReporter()
    runner = runner or SubprocessRunner()
    base = os.environ if environ is None else environ
    on_windows = builds_on_windows(snapshot)
    env = build_environment(spec, base)  # on Windows replaced below, once vcvars64 has run
    python = spec.python or sys.executable
    if not (Path(python).is_file() or shutil.which(python)):
        raise BuildError(f"the build interpreter {python} does not exist on this machine",
                         hint="build on the machine the snapshot describes, or plan without --snapshot")
    # absolute: pip runs in the project dir, so a relative --wheel-dir would land elsewhere
    build_root = (Path(spec.build_root).expanduser() if spec.build_root else home / "build").absolute()
    build_root.mkdir(parents=True, exist_ok=True)
    # before the compile: a home that cannot take the wheel fails now (an OSError the CLI names), not after hours
    (home / "staging").mkdir(parents=True, exist_ok=True)
    _remove_abandoned_scratch(build_root)
    log_path = _new_log_path(home, spec)
    scratch = Path(tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{os.getpid()}-", dir=build_root))
    work: Path | None = None
    keep_scratch = False
    with log_path.open("w", encoding="utf-8", errors="replace") as log:
        try:
            if on_windows:
                windows = _prepare_windows(spec, snapshot, base=base, build_root=build_root, runner=runner,
                                           scratch=scratch)
                env = windows.env
                log.writelines(f"attnforge: {line}\n" for line in windows.log_lines())
            shim_path = None if on_windows else install_shim(scratch / "shims", env)
            if shim_path is not None:  # longest compile units first (see ninja_order.py)
                env["PATH"] = shim_path
            _log_header(log, spec, env)
            reporter.report(PhaseEvent(phase=Phase.FETCH, detail=_describe_source(spec)))
            fetched = fetch(spec.source, scratch=scratch, python=python, env=env, runner=runner)
            log.write(f"attnforge: source {fetched.description}\nattnforge: source sha256 {fetched.sha256}\n")

            edited = "".join(f"-{e.digest()[:6]}" for e in spec.edits)  # an edited tree is another tree
            tree = build_root / f"{_slug(spec.name)}-{fetched.sha256[:10]}{edited}"
            with filelock.FileLock(str(tree) + ".lock", timeout=0):
                work = tree  # ours to clean up only once the lock is held
                project = work / spec.source.subdirectory if spec.source.subdirectory else work
                resumed = _prepare_tree(fetched, work, scratch, reporter, log, edits=spec.edits, project=project)
                sccache_path, before = _sccache_setup(spec, env, work, runner, windows=on_windows)
                out = scratch / "wheel"
                argv = installer_for(python, runner=runner).wheel_argv(project, out)  # pip, or uv in a uv venv
                log.write(f"attnforge: running {shlex.join(argv)}\n")
                log.flush()
                reporter.report(PhaseEvent(phase=Phase.BUILD, detail=shlex.join(argv)))
                outcome = run_streamed(argv, cwd=project, env=env, log=log, reporter=reporter,
                                       launcher=launcher, heartbeat_s=heartbeat_s)
                stats = (sccache_mod.difference(before, sccache_mod.read_counts(runner, sccache_path, env))
                         if sccache_path else None)
                wheels = sorted(out.glob("*.whl")) if out.is_dir() else []
                if outcome.returncode != 0 or len(wheels) != 1:
                    log.write(f"attnforge: build failed (exit status {outcome.returncode}) after "
                              f"{outcome.duration_s:.1f} s\n")
                    log.flush()
                    raise _failure(spec, log_path, outcome.returncode, snapshot)
                reporter.report(PhaseEvent(phase=Phase.STAGE, detail=wheels[0].name))
                try:
                    staged = _stage(wheels[0], home)
                except OSError as exc:  # a full disk, a staging folder gone: the built wheel is kept, and named
                    kept = _keep_wheel(wheels[0], build_root)
                    keep_scratch = kept == wheels[0]  # it could not be moved out: the scratch folder stays
                    log.write(f"attnforge: built {wheels[0].name} but could not stage it ({exc}); kept at {kept}\n")
                    raise BuildError(
                        f"built {wheels[0].name} but could not stage it under {home / 'staging'}: "
                        f"{exc.strerror or exc}", cause=f"{type(exc).__name__} (errno {exc.errno})",
                        hint=f"the wheel is kept at {kept}: free space or fix {home / 'staging'} and run the command "
                             f"again, or `pip install {kept}` now") from exc
            duration = time.monotonic() - started
            log.write(f"attnforge: built {staged.name} in {duration:.1f} s\n")
            reporter.report(PhaseEvent(phase=Phase.DONE, detail=str(staged)))
            return BuildResult(
                name=spec.name, version=_wheel_version(staged.name) or (spec.version or ""), wheel=staged,
                log_path=log_path, duration_s=duration, source_sha256=fetched.sha256,
                source=fetched.description, steps_done=outcome.steps_done, steps_total=outcome.steps_total,
                build_dir=work if keep_build_dir else None, resumed=resumed, sccache=stats,
            )
        except filelock.Timeout:
            raise BuildError(f"another attnforge build is using {tree}",
                             hint="wait for it to finish, or remove the .lock file if no build is running",
                             ) from None
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):  # Ctrl-C, or SIGTERM (Interrupted)
                log.write(f"attnforge: interrupted ({type(exc).__name__}); cleaning up\n")
            raise
        finally:
            if not keep_scratch:
                shutil.rmtree(scratch, ignore_errors=True)
            if work is not None and not keep_build_dir:
                shutil.rmtree(work, ignore_errors=True)


def build_environment(spec: BuildSpec, base: Mapping[str, str]) -> dict[str, str]:
    """The build's complete environment: ``base``, then ``spec.env``, then what the spec's fields imply.

    ``MAX_JOBS`` and ``NVCC_THREADS`` (and the recipe's ``parallel_env``) come from :meth:`BuildSpec.job_env` and
    ``CUDA_HOME`` from ``spec.toolkit`` unless ``spec.env`` already sets them (its word is final).
    """
    env = dict(base)
    env.update(spec.env)
    implied = spec.job_env()
    if spec.toolkit is not None:
        implied["CUDA_HOME"] = spec.toolkit.path
    for key, value in implied.items():
        if key not in spec.env:
            env[key] = value
    env.setdefault("PYTHONUNBUFFERED", "1")  # setup.py prints reach the log as they happen
    env.setdefault("LC_MESSAGES", "C")  # compiler messages in English: the failure signatures are English
    return env


def _prepare_tree(
    fetched: FetchedSource, work: Path, scratch: Path, reporter: Reporter, log: IO[str], *,
    edits: tuple[SourceEdit, ...], project: Path,
) -> bool:
    """Lay ``fetched`` out at ``work`` and make ``edits`` in ``project`` (``work`` or its subdirectory), unless a kept
    tree of the same source and edits is there (True: resumed)."""
    marker = work / MARKER
    stamp = " ".join([fetched.sha256, *(e.digest() for e in edits)])
    if marker.is_file() and marker.read_text(encoding="utf-8").strip() == stamp:
        reporter.report(PhaseEvent(phase=Phase.UNPACK, detail=f"resuming the kept build tree {work}"))
        log.write(f"attnforge: resuming the kept build tree {work}\n")
        return True
    if work.exists():  # a tree from an interrupted layout: not trustworthy
        shutil.rmtree(work)
    reporter.report(PhaseEvent(phase=Phase.UNPACK, detail=str(work)))
    lay_out(fetched, work, scratch)
    for edit in edits:
        apply_edit(project, edit)
        log.write(f"attnforge: edited {edit.file} in the build tree: {edit.find!r} -> {edit.replace!r}\n")
    marker.write_text(stamp + "\n", encoding="utf-8")
    log.write(f"attnforge: build tree {work}\n")
    return False


def apply_edit(project: Path, edit: SourceEdit) -> None:
    """Make ``edit`` in the laid-out tree ``project`` (a copy: the user's source is never written).

    Raises:
        BuildError: the file is missing or ``edit.find`` does not occur in it exactly once (the source is not the
            one the catalog's edit was written for).
    """
    path = project / edit.file
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BuildError(f"cannot edit {edit.file} in the build tree", cause=str(exc),
                         hint="this source is not the one the edit was written for; drop --abi torch") from None
    count = text.count(edit.find)
    if count != 1:
        raise BuildError(f"cannot bind this build to one torch: {edit.file} holds {edit.find!r} {count} times, "
                         "not once", cause="the source differs from the one the catalog's edit was written for",
                         hint="drop --abi torch (the project's own ABI), or build the source the catalog names")
    path.write_text(text.replace(edit.find, edit.replace, 1), encoding="utf-8")


def _prepare_windows(spec: BuildSpec, snapshot: object | None, *, base: Mapping[str, str], build_root: Path,
                     runner: Runner, scratch: Path) -> WindowsBuild:
    """The Windows environment (vcvars64 captured through ``runner``); probes the machine when the caller
    gave no snapshot (``attnforge install`` on Windows)."""
    if isinstance(snapshot, SystemSnapshot):
        machine = snapshot
    else:
        from attnforge.probe import collect_snapshot

        machine = collect_snapshot(backends=())  # the Windows environment needs no backend states
    prepared = prepare_windows_build(spec, machine, base=base, build_root=spec.build_root or str(build_root),
                                     runner=runner,
                                     scratch_dir=scratch / "vcvars")
    # TMP/TEMP must exist, or Python's tempfile (pip, setuptools) falls back to the long user temp dir
    Path(prepared.plan.temp_dir).mkdir(parents=True, exist_ok=True)
    return prepared


def _sccache_setup(
    spec: BuildSpec, env: dict[str, str], work: Path, runner: Runner, *, windows: bool
) -> tuple[Path | None, SccacheStats | None]:
    if not spec.use_sccache:
        return None, None
    if windows:
        raise BuildError("--sccache is supported on Linux only for now",
                         hint="build without --sccache on Windows")
    found = which("sccache", env)
    if found is None:
        try:
            how = " ".join(installer_for(spec.python or sys.executable, runner=runner).argv("install", "sccache"))
        except InstallError:
            how = "install sccache (https://github.com/mozilla/sccache)"
        raise BuildError("sccache was asked for but is not on PATH", hint=how)
    nvcc = spec.toolkit.nvcc if spec.toolkit else None
    if nvcc is None and env.get("CUDA_HOME"):
        candidate = Path(env["CUDA_HOME"], "bin", "nvcc")
        nvcc = str(candidate) if candidate.exists() else None
    nvcc = nvcc or (str(p) if (p := which("nvcc", env)) else None)
    env.update(sccache_mod.routing_env(sccache=found, cxx=env.get("CXX", "c++"), nvcc=nvcc,
                                       wrapper_dir=work / ".attnforge" / "bin"))
    return found, sccache_mod.read_counts(runner, found, env)


def _failure(spec: BuildSpec, log_path: Path, returncode: int, snapshot: object | None) -> BuildFailure:
    from attnforge.diagnose import diagnose_file

    diagnosis = diagnose_file(log_path, snapshot=snapshot, name=spec.name)
    return BuildFailure(
        f"building {spec.name} failed (pip exit status {returncode})",
        log_path=str(log_path), diagnosis=diagnosis, cause=diagnosis.cause,
        hint="; ".join(diagnosis.fix) if diagnosis.fix else f"attnforge diagnose {log_path}",
    )


def _stage(wheel: Path, home: Path) -> Path:
    """Copy the wheel into a fresh ``home/staging/<id>/`` with a rename at the end: complete or absent."""
    target_dir = home / "staging" / uuid.uuid4().hex[:16]
    target_dir.mkdir(parents=True)
    partial = target_dir / (wheel.name + ".part")
    shutil.copyfile(wheel, partial)
    final = target_dir / wheel.name
    os.replace(partial, final)
    return final


def _keep_wheel(wheel: Path, build_root: Path) -> Path:
    """Move a built wheel that could not be staged out of the scratch folder (removed when the build ends) to
    ``build_root``; where even that fails, the wheel stays where it is (the caller then keeps the scratch)."""
    kept = build_root / wheel.name
    try:
        os.replace(wheel, kept)
    except OSError:
        return wheel
    return kept


def _remove_abandoned_scratch(build_root: Path) -> None:
    """Scratch dirs of builds that were SIGKILLed: their pid (in the name) no longer runs."""
    for path in build_root.glob(f"{_SCRATCH_PREFIX}*"):
        pid_text = path.name.removeprefix(_SCRATCH_PREFIX).split("-", 1)[0]
        if pid_text.isdigit() and not psutil.pid_exists(int(pid_text)):
            shutil.rmtree(path, ignore_errors=True)


def _new_log_path(home: Path, spec: BuildSpec) -> Path:
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return logs / f"{_slug(spec.name)}-{spec.version or 'src'}-{stamp}-{os.getpid()}.log"


def _log_header(log: IO[str], spec: BuildSpec, env: Mapping[str, str]) -> None:
    log.write(f"attnforge: build {spec.name} {spec.version or ''}\n")
    log.write(f"attnforge: archs {' '.join(f'{a}.{b}' for a, b in spec.archs) or '(none)'}; "
              f"MAX_JOBS={env.get('MAX_JOBS')} NVCC_THREADS={env.get('NVCC_THREADS')}\n")
    for key in sorted(spec.env):
        log.write(f"attnforge: env {key}={spec.env[key]}\n")
    for note in spec.notes:
        log.write(f"attnforge: note {note}\n")
    log.flush()


def _describe_source(spec: BuildSpec) -> str:
    src = spec.source
    if src.version or src.specifier:
        return src.requirement()
    return f"{src.location}@{src.ref}" if src.ref else src.location


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").lower()[:24] or "src"


def _wheel_version(filename: str) -> str | None:
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        return str(parse_wheel_filename(filename)[1])
    except InvalidWheelFilename:
        return None
