"""``attnforge cargo-env``: a keyed, cached kernel directory for candle's flash-attn crate.

    attnforge cargo-env candle-flash-attn --print            # eval "$(...)" in sh; paste into cmd/PowerShell
    attnforge cargo-env candle-flash-attn -- cargo build --release --features flash-attn
    attnforge cargo-env candle-flash-attn --store            # after a build run outside attnforge
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from attnforge.cli._output import console, emit_json, json_option, load_or_probe, snapshot_option
from attnforge.errors import UsageError

SHELLS = ("sh", "cmd", "powershell")


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


def shell_lines(env: dict[str, str], shell: str) -> list[str]:
    """``export K='v'`` (sh), ``set "K=v"`` (cmd) or ``$env:K = 'v'`` (PowerShell) per variable."""
    out = []
    for key, value in env.items():
        if shell == "cmd":
            out.append(f'set "{key}={value}"')
        elif shell == "powershell":
            out.append("$env:{} = '{}'".format(key, value.replace("'", "''")))
        else:
            out.append("export {}='{}'".format(key, value.replace("'", "'\\''")))
    return out


@click.command("cargo-env", context_settings={"ignore_unknown_options": True})
@click.argument("crate", type=click.Choice(["candle-flash-attn"]))
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option("--print", "print_only", is_flag=True, help="Print the variables for a shell and run nothing.")
@click.option("--shell", type=click.Choice(SHELLS), default=None,
              help="Shell syntax for --print (default: cmd on Windows, sh elsewhere).")
@click.option("--store", "store_only", is_flag=True,
              help="Store the library of a build that ran outside attnforge into the artifact cache.")
@click.option("--compute-cap", default=None, help="Target compute capability, e.g. 9.0 (default: GPU 0).")
@click.option("--crate-version", default=None, help="The crate version (default: from Cargo.lock).")
@click.option("--cargo-lock", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="The Cargo.lock to read the crate version from (default: searched upwards from here).")
@snapshot_option
@json_option
def command(  # noqa: PLR0917 - click passes every option as a positional argument
    crate: str, command: tuple[str, ...], print_only: bool, shell: str | None, store_only: bool,
    compute_cap: str | None, crate_version: str | None, cargo_lock: Path | None, snapshot_path: Path | None,
    as_json: bool,
) -> int:
    """Point CANDLE_FLASH_ATTN_BUILD_DIR at a cache directory keyed like a wheel (crate version, CUDA,
    compute capability, host compiler, OS), so the next cargo build reuses the compiled kernels; after a
    build, keep libflashattention.a in the artifact cache (attnforge cache export/import carries it).

    Put the cargo command after `--`.
    """
    from attnforge._system.paths import home_dir
    from attnforge._system.runner import SubprocessRunner, run_attached
    from attnforge.cache import open_store
    from attnforge.cargo.candle import (
        archive_objects_windows,
        find_cargo_lock,
        plan_cargo_env,
        read_cargo_lock,
        restore,
        store_library,
    )
    from attnforge.types.cc import parse_cc

    if command and (print_only or store_only):
        raise UsageError("--print and --store run no command", hint="drop them, or drop the command after --")
    command = command[1:] if command[:1] == ("--",) else command
    version, checksum = crate_version, None
    if version is None:
        lock = cargo_lock or find_cargo_lock(Path.cwd())
        if lock is None:
            raise UsageError("no Cargo.lock here or above to read the crate version from",
                             hint="run it in your cargo workspace, or pass --crate-version")
        locked = read_cargo_lock(lock, crate)
        version, checksum = locked.version, locked.checksum
    cc = None
    if compute_cap is not None:
        try:
            cc = parse_cc(compute_cap)
        except ValueError as exc:
            raise UsageError(str(exc), hint="e.g. --compute-cap 9.0 (H100) or 12.0 (RTX 5090)") from None
    snap = load_or_probe(snapshot_path)
    plan = plan_cargo_env(snap, home=home_dir(os.environ), crate_version=version, checksum=checksum,
                          compute_capability=cc, environ=os.environ)
    store = open_store()
    arch = snap.platform.cpu_arch
    restored = restore(plan, store, arch)
    present = plan.library.is_file()
    returncode: int | None = None
    archived = False
    cache_key: str | None = None
    stored: bool | None = None
    if command:
        try:
            # with --json, stdout carries only the JSON document: the command's output goes to stderr
            out = sys.stderr if as_json else None
            env = {**os.environ, **plan.env}
            returncode = run_attached(command, env=env, stdout=out)
        except FileNotFoundError:
            raise UsageError(f"cannot run {command[0]!r}: not found", hint="is cargo on PATH?") from None
    if returncode == 0 or store_only:
        archived = archive_objects_windows(plan, SubprocessRunner())
        if plan.library.is_file() or store_only:
            put = store_library(plan, store, arch)
            cache_key, stored = put.entry.key, put.stored
    result = CargoEnvResult(
        crate=crate, kernel_key=str(plan.key), build_dir=str(plan.build_dir), env=plan.env,
        library_present_before=present, restored_from_cache=restored, command=command, returncode=returncode,
        archived_with_lib_exe=archived, cache_key=cache_key, stored=stored, notes=plan.notes,
    )
    if as_json:
        emit_json("cargo-env", result)
    elif not command and not store_only:
        for line in shell_lines(plan.env, shell or ("cmd" if snap.platform.os == "windows" else "sh")):
            click.echo(line)
        _summary(result)
    else:
        _summary(result)
    return returncode if returncode is not None else 0


def _summary(result: CargoEnvResult) -> None:
    err = console(stderr=True)
    err.print(f"[bold]{result.crate}[/bold] kernels: {result.kernel_key}")
    err.print(f"  build dir: {result.build_dir}")
    if result.restored_from_cache:
        err.print("  libflashattention.a restored from the artifact cache: the kernel compile is skipped")
    elif result.library_present_before:
        err.print("  libflashattention.a already built for this key: the kernel compile is skipped")
    else:
        err.print("  no library for this key yet: the first build compiles the kernels (15-20 minutes)")
    if result.archived_with_lib_exe:
        err.print("  archived the object files with lib.exe")
    if result.cache_key:
        err.print(f"  cache entry {result.cache_key} ({'stored now' if result.stored else 'already stored'})")
    for note in result.notes:
        err.print(f"  note: {note}")
