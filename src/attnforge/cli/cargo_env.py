"""``attnforge cargo-env``: a keyed, cached kernel directory for candle's flash-attn crate.

    attnforge cargo-env candle-flash-attn --print            # eval "$(...)" in sh; paste into cmd/PowerShell
    attnforge cargo-env candle-flash-attn -- cargo build --release --features flash-attn
    attnforge cargo-env candle-flash-attn --store            # after a build run outside attnforge
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import click

from attnforge.cli._output import console, emit_json, json_option, load_or_probe, snapshot_option
from attnforge.errors import UsageError

if TYPE_CHECKING:
    from attnforge.provision.cargo import CargoEnvResult

SHELLS = ("sh", "cmd", "powershell")


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
@click.option("--crate-version", default=None,
              help="The crate version, e.g. 0.9.1 or 0.9.1+mytree (default: from Cargo.lock).")
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
    from attnforge._system.runner import run_attached
    from attnforge.provision.cargo import cargo_env, locked_version
    from attnforge.types.cc import parse_cc

    if command and (print_only or store_only):
        raise UsageError("--print and --store run no command", hint="drop them, or drop the command after --")
    if crate_version is not None:
        crate_version = _crate_version(crate_version)
    command = command[1:] if command[:1] == ("--",) else command
    version, checksum = locked_version(crate, crate_version=crate_version, cargo_lock=cargo_lock, cwd=Path.cwd())
    cc = None
    if compute_cap is not None:
        try:
            cc = parse_cc(compute_cap)
        except ValueError as exc:
            raise UsageError(str(exc), hint="e.g. --compute-cap 9.0 (H100) or 12.0 (RTX 5090)") from None
    snap = load_or_probe(snapshot_path)

    def run(argv: tuple[str, ...], env: Mapping[str, str]) -> int:
        # with --json, stdout carries only the JSON document: the command's output goes to stderr
        return run_attached(argv, env=env, stdout=sys.stderr if as_json else None)

    result = cargo_env(crate, snapshot=snap, version=version, checksum=checksum, compute_capability=cc,
                       command=command, store_only=store_only, run=run)
    if as_json:
        emit_json("cargo-env", result)
    elif not command and not store_only:
        for line in shell_lines(result.env, shell or ("cmd" if snap.platform.os == "windows" else "sh")):
            click.echo(line)
        _summary(result)
    else:
        _summary(result)
    return result.returncode if result.returncode is not None else 0


def _crate_version(text: str) -> str:
    """``--crate-version`` as given, when it reads as a version (PEP 440, which takes Cargo's ``0.9.0-alpha.4`` as
    ``0.9.0a4``): it names the kernel directory and the cache entry, so ``latest`` or a path is refused.

    Raises:
        UsageError: it is not a version.
    """
    from attnforge.types.versions import parse_version

    if not text.strip() or parse_version(text) is None:
        raise UsageError(f"not a crate version: {text!r}",
                         hint="give the version Cargo.lock pins, e.g. --crate-version 0.9.1 (a tree of your own: "
                              "0.9.1+mytree), or leave it out to read it from Cargo.lock")
    return text.strip()


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
