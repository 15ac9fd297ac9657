"""``cargo-env``: candle's flash-attn kernels as a keyed, cached directory, around the user's cargo command.

The kernels candle's ``candle-flash-attn`` crate compiles (15-20 minutes) land in ``CANDLE_FLASH_ATTN_BUILD_DIR``;
:func:`cargo_env` points it at a directory keyed like a wheel (crate version, CUDA, compute capability, host
compiler, OS: :func:`attnforge.cargo.candle.plan_cargo_env`), fills it from the artifact cache when an entry for
the key exists, runs the command, and keeps the built ``libflashattention.a`` in the cache (kind ``static-lib``),
so ``attnforge cache export/import`` carries it to other machines. ``attnforge cargo-env`` is parse -> this -> render.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from attnforge.errors import UsageError
from attnforge.probe import SystemSnapshot
from attnforge.types.cc import ComputeCapability

#: Runs the user's command with the build's environment and returns its exit status (the CLI's: attached to the
#: terminal); raises FileNotFoundError when the program does not exist.
RunCommand = Callable[[tuple[str, ...], Mapping[str, str]], int]


@dataclass(frozen=True, slots=True, kw_only=True)
class CargoEnvResult:
    """What ``cargo-env`` decided and did.

    Attributes:
        crate: ``candle-flash-attn``.
        kernel_key: what the kernels are built for (``candle-flash-attn==0.9.1;cuda=12.8;cc=9.0;...``).
        build_dir: the directory ``CANDLE_FLASH_ATTN_BUILD_DIR`` names.
        env: the variables set for the build.
        library_present_before: the library was there before the command ran (the build skips the compile).
        restored_from_cache: it was copied in from the artifact cache.
        command: the command that ran (empty for --print / --store).
        returncode: its exit status (None when nothing ran).
        archived_with_lib_exe: Windows: the library was made from the object files with lib.exe.
        cache_key: the artifact cache entry that holds the library after this run (None when none).
        stored: this run added the entry (False: it was already there).
        notes: where the values came from.
    """

    crate: str
    kernel_key: str
    build_dir: str
    env: dict[str, str]
    library_present_before: bool
    restored_from_cache: bool
    command: tuple[str, ...]
    returncode: int | None
    archived_with_lib_exe: bool
    cache_key: str | None
    stored: bool | None
    notes: tuple[str, ...]


def locked_version(crate: str, *, crate_version: str | None, cargo_lock: Path | None,
                   cwd: Path) -> tuple[str, str | None]:
    """The crate's version and registry checksum: ``crate_version`` as given (no checksum), else read from
    ``cargo_lock`` or the first ``Cargo.lock`` at or above ``cwd``.

    Raises:
        UsageError: no version given and no ``Cargo.lock`` found, or the lock file does not list ``crate``.
    """
    from attnforge.cargo.candle import find_cargo_lock, read_cargo_lock

    if crate_version is not None:
        return crate_version, None
    lock = cargo_lock or find_cargo_lock(cwd)
    if lock is None:
        raise UsageError("no Cargo.lock here or above to read the crate version from",
                         hint="run it in your cargo workspace, or pass --crate-version")
    locked = read_cargo_lock(lock, crate)
    return locked.version, locked.checksum


def cargo_env(
    crate: str, *, snapshot: SystemSnapshot, version: str, checksum: str | None = None,
    compute_capability: ComputeCapability | None = None, command: tuple[str, ...] = (), store_only: bool = False,
    run: RunCommand | None = None, environ: Mapping[str, str] | None = None,
) -> CargoEnvResult:
    """Plan the keyed build directory, restore the library from the cache, run ``command`` (when given) with the
    build's variables over ``environ``, and store the library after a successful run (or with ``store_only``).

    Args:
        crate: ``candle-flash-attn``.
        snapshot: the machine (CUDA, compute capability of GPU 0, host compiler, OS, CPU architecture).
        version, checksum: the crate's version and registry checksum (:func:`locked_version`).
        compute_capability: the target; None: GPU 0's.
        command: the cargo command to run (empty: run nothing, as ``--print``).
        store_only: store the library of a build that ran outside attnforge.
        run: how ``command`` runs (:data:`RunCommand`; the default attaches it to this terminal).
        environ: the environment (``$ATTNFORGE_HOME``, the compiler variables); this process's when None.

    Raises:
        UsageError: ``command`` with ``store_only``; the program of ``command`` does not exist; no CUDA or GPU
            to key the build for (see :func:`attnforge.cargo.candle.plan_cargo_env`).
        CacheError: the artifact cache cannot be read or written.
    """
    from attnforge._system.paths import home_dir
    from attnforge._system.runner import SubprocessRunner, run_attached
    from attnforge.cache import open_store
    from attnforge.cargo.candle import archive_objects_windows, plan_cargo_env, restore, store_library

    if command and store_only:
        raise UsageError("--store runs no command", hint="drop it, or drop the command after --")
    environ = os.environ if environ is None else environ
    plan = plan_cargo_env(snapshot, home=home_dir(environ), crate_version=version, checksum=checksum,
                          compute_capability=compute_capability, environ=environ)
    store = open_store(environ)
    arch = snapshot.platform.cpu_arch
    restored = restore(plan, store, arch)
    present = plan.library.is_file()
    returncode: int | None = None
    if command:
        env = {**environ, **plan.env}
        try:
            returncode = run(command, env) if run is not None else run_attached(command, env=env)
        except FileNotFoundError:
            raise UsageError(f"cannot run {command[0]!r}: not found", hint="is cargo on PATH?") from None
    archived = False
    cache_key: str | None = None
    stored: bool | None = None
    if returncode == 0 or store_only:
        archived = archive_objects_windows(plan, SubprocessRunner())
        if plan.library.is_file() or store_only:
            put = store_library(plan, store, arch)
            cache_key, stored = put.entry.key, put.stored
    return CargoEnvResult(
        crate=crate, kernel_key=str(plan.key), build_dir=str(plan.build_dir), env=plan.env,
        library_present_before=present, restored_from_cache=restored, command=command, returncode=returncode,
        archived_with_lib_exe=archived, cache_key=cache_key, stored=stored, notes=plan.notes,
    )
