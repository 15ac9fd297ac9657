"""The command line: a thin skin over the library. One module per verb; the only code that prints or exits.

``main(argv) -> int`` is what tests call; ``run()`` is the console-script entry point.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import click

from attnforge import __version__
from attnforge.cli._output import discard_stdout, emit_error, emit_os_error, emit_unexpected, set_output_mode
from attnforge.dispatch.autotune_env import setting as autotune_setting
from attnforge.errors import AttnforgeError, UsageError
from attnforge.fetch.deadline import DEFAULT_BUDGET_S, NetDeadline, budget_from, command_deadline

#: verb -> "module:attribute" of its click command; imported only when the verb runs (fast start-up).
VERBS: dict[str, str] = {
    "doctor": "attnforge.cli.doctor:command",
    "probe": "attnforge.cli.probe:command",
    "plan": "attnforge.cli.plan:command",
    "build": "attnforge.cli.build:command",
    "diagnose": "attnforge.cli.diagnose:command",
    "install": "attnforge.cli.install:command",
    "verify": "attnforge.cli.verify:command",
    "bench": "attnforge.cli.bench:command",
    "warmup": "attnforge.cli.warmup:command",
    "cache": "attnforge.cli.cache:command",
    "cargo-env": "attnforge.cli.cargo_env:command",
    "fleet": "attnforge.cli.fleet:command",
}


#: The exit code of a command whose reader closed the pipe first (``attnforge doctor | head -1``): 128 + SIGPIPE,
#: what a shell reports for any program that SIGPIPE ends (``yes | head``), so a ``set -o pipefail`` script sees a
#: command cut short, not one that did all its work. Help and version output (``attnforge --help | head``) lose
#: nothing that matters and exit 0. Nothing is printed: the reader left on purpose.
PIPE_CLOSED_EXIT = 141


class _PipeClosedError(Exception):
    """stdout's reader went away (``BrokenPipeError``), raised past click: click would turn it into a silent
    ``sys.exit(1)``, which :func:`main` cannot tell from a failure."""


class LazyGroup(click.Group):
    """A group whose sub-commands are imported on first use; a closed pipe leaves it as :class:`_PipeClosedError`."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:  # the top-level --help and --version print here
            return super().make_context(info_name, args, parent, **extra)
        except BrokenPipeError:
            raise _PipeClosedError from None

    def invoke(self, ctx: click.Context) -> Any:
        try:  # every verb (and its --help) runs here
            return super().invoke(ctx)
        except BrokenPipeError:
            raise _PipeClosedError from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [v for v in VERBS if _module_exists(VERBS[v])]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = VERBS.get(cmd_name)
        if target is None or not _module_exists(target):
            return None
        module, _, attr = target.partition(":")
        cmd = getattr(importlib.import_module(module), attr)
        if not isinstance(cmd, click.Command):
            raise TypeError(f"{target} is not a click command")
        return cmd


def _module_exists(target: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(target.partition(":")[0]) is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvVar:
    """One environment variable attnforge reads: its name, what it does, its default."""

    name: str
    meaning: str
    default: str = "unset"


#: Every environment variable attnforge reads, shown at the end of ``attnforge --help``. Every ``ATTNFORGE_*``
#: name in the source must be here (tests/cli/test_environment_table.py greps for them).
ENVIRONMENT: tuple[EnvVar, ...] = (
    EnvVar(name="ATTNFORGE_HOME", meaning="cache and state directory", default="the user cache dir, "
           "~/.cache/attnforge on Linux"),
    EnvVar(name="ATTNFORGE_AUTOTUNE", meaning="attention() measures the verified backends on the first call of "
           "a shape class: 0 never, 1 also on CPU, background: on CUDA off the calling thread (experimental)",
           default="on CUDA only, in the call"),
    EnvVar(name="TORCHINDUCTOR_CACHE_DIR", meaning="Flex's compile cache; yours wins",
           default="$ATTNFORGE_HOME/compile/inductor"),
    EnvVar(name="FLASH_ATTENTION_CUTE_DSL_*", meaning="FA4's compile cache: CACHE_ENABLED (default 1), CACHE_DIR "
           "(default $ATTNFORGE_HOME/compile/flash-attn-cute); yours win"),
    EnvVar(name="ATTNFORGE_NET_BUDGET_S", meaning="seconds one command may wait for the network in all (listings, "
           "index pages, downloads' answers); a host or proxy that timed out is not asked again",
           default=f"{DEFAULT_BUDGET_S:g}"),
    EnvVar(name="ATTNFORGE_WHEEL_SOURCES", meaning="off: do not ask the known prebuilt-wheel sources (GitHub "
           "releases, per-CUDA indexes); plan and install use the cache, --find-links and --index-url only "
           "(off, 0, false, no; on, 1, true, yes; anything else is a usage error)",
           default="on"),
    EnvVar(name="ATTNFORGE_EXTRA_WHEEL_SOURCES", meaning="a wheel_sources.toml of a team's own sources, added to "
           "the shipped ones (an equal id replaces one)"),
    EnvVar(name="ATTNFORGE_NINJA_ORDER", meaning="0: builds run ninja's own order instead of the longest compile "
           "units first", default="1"),
    EnvVar(name="ATTNFORGE_PROBE_SNAPSHOT", meaning="fleet: a node with it set reports this `probe --json` file "
           "instead of probing"),
    EnvVar(name="ATTNFORGE_INDEX_USER", meaning="fleet build: upload user name of an index server (pypiserver, "
           "devpi)", default="TWINE_USERNAME"),
    EnvVar(name="ATTNFORGE_INDEX_PASSWORD", meaning="fleet build: its password; never printed",
           default="TWINE_PASSWORD"),
    EnvVar(name="GITHUB_API_URL", meaning="GitHub API used to find prebuilt release wheels (GitHub Enterprise, "
           "mirrors)", default="https://api.github.com"),
    EnvVar(name="GITHUB_TOKEN", meaning="token for that API (higher rate limits); never printed or stored"),
    EnvVar(name="HTTPS_PROXY, HTTP_PROXY, NO_PROXY", meaning="proxies of every request attnforge makes itself, "
           "read as pip reads them (either case)"),
    EnvVar(name="CUDA_HOME / CUDA_PATH", meaning="the CUDA toolkit builds use", default="nvcc on PATH"),
    EnvVar(name="PIP_INDEX_URL, PIP_*, UV_*", meaning="pip's and uv's own configuration, used for every install "
           "and index query"),
    EnvVar(name="COLUMNS / NO_COLOR", meaning="table width and colour of the human-readable output"),
)


def _environment_help(rows: Sequence[EnvVar], width: int = 108) -> str:
    """The table as lines click keeps as they are (``\\b``): name, then the meaning and default, wrapped."""
    import textwrap

    name_width = max(len(r.name) for r in rows)
    lines = []
    for row in rows:
        default = "" if row.default == "unset" else f" (default: {row.default})"
        text = textwrap.wrap(row.meaning + default, width - name_width - 4, break_on_hyphens=False)
        lines.append(f"  {row.name:<{name_width}}  {text[0]}")
        lines += [f"  {'':<{name_width}}  {more}" for more in text[1:]]
    return "\n".join(lines)


EPILOG = "\b\nEnvironment:\n" + _environment_help(ENVIRONMENT) + (
    "\n\n\b\nExit codes: 0 ok, 1 not possible on this machine (every reason is printed), 2 bad usage or input,"
    f"\n{PIPE_CLOSED_EXIT} stdout's reader went away first (`attnforge doctor | head -1`), as a shell reports SIGPIPE."
)


@click.group(cls=LazyGroup, epilog=EPILOG,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, "-V", "--version", prog_name="attnforge")
@click.option("-v", "--verbose", is_flag=True,
              help="Say more: full tracebacks of internal errors (also accepted after the command name).")
def cli(verbose: bool) -> None:
    """Get the fastest attention kernel working on this NVIDIA machine, prove it works, and keep using it.

    Start with `attnforge doctor`.
    """


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command line and return its exit code: 0 ok, 1 not possible here, 2 bad usage or input
    (:data:`PIPE_CLOSED_EXIT` when stdout's reader went away first)."""
    args, verbose = _split_verbose(list(sys.argv[1:] if argv is None else argv))
    own = args[: args.index("--")] if "--" in args else args
    set_output_mode(as_json="--json" in own, verbose=verbose)
    try:
        return _run_command(args, own)
    except (_PipeClosedError, BrokenPipeError):  # from the verb, or from printing its error or help below
        discard_stdout()
        return 0 if _HELP & set(own) or not own else PIPE_CLOSED_EXIT


#: The options that print help or the version and nothing else.
_HELP = frozenset({"--help", "-h", "--version", "-V"})


def _run_command(args: list[str], own: list[str]) -> int:
    """The command line ``args`` run by click, every error turned into ``error:``/``hint:`` and an exit code.

    Raises:
        _PipeClosedError / BrokenPipeError: stdout's reader went away (:func:`main` ends the command quietly).
    """
    from attnforge._system.paths import leave_deleted_cwd

    moved = leave_deleted_cwd()
    if moved:
        click.echo(f"note: {moved}", err=True)
    try:
        # one network deadline for the whole command; its "waiting for ..." lines go to stderr
        deadline = NetDeadline(budget_s=budget_from(os.environ), on_wait=_say_waiting)
        if own and not {"--help", "-h", "--version"} & set(own):  # help and version work whatever the setting
            autotune_setting(os.environ)  # a typo in ATTNFORGE_AUTOTUNE: a usage error now, not a silent default
        with command_deadline(deadline):
            result: Any = cli.main(args=args, prog_name="attnforge", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except (_PipeClosedError, BrokenPipeError):  # not an OSError of the disk's, nor a bug: main's
        raise
    except click.exceptions.Abort as exc:
        signum = getattr(exc.__cause__, "signum", None)  # SIGTERM during a build: exit 143, no traceback
        click.echo("aborted" if signum is None else f"interrupted: {exc.__cause__}", err=True)
        return 130 if signum is None else 128 + int(signum)
    except click.ClickException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `attnforge` (or `attnforge cache`): the help
            try:
                click.echo(exc.format_message())
            except BrokenPipeError:
                discard_stdout()  # help only: nothing of worth was lost
            return 0
        emit_error(_usage_error(exc, own))
        return 2
    except AttnforgeError as exc:
        emit_error(exc)
        return exc.exit_code
    except OSError as exc:  # a full, read-only or unwritable disk, a file in a folder's place: never a traceback
        return emit_os_error(exc)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM during a build (signum 15: exit 143)
        click.echo(f"interrupted: {exc}" if str(exc) else "interrupted", err=True)
        return 128 + int(getattr(exc, "signum", 2))
    except Exception as exc:  # the last resort: a bug or an unforeseen fault, never a raw traceback
        return emit_unexpected(exc, argv=args)
    return int(result) if isinstance(result, int) else 0


def _say_waiting(line: str) -> None:
    click.echo(f"note: {line}", err=True)


def _split_verbose(args: list[str]) -> tuple[list[str], bool]:
    """Take ``-v``/``--verbose`` from anywhere before a ``--`` (``attnforge doctor -v`` works too)."""
    end = args.index("--") if "--" in args else len(args)
    kept = [a for a in args[:end] if a not in ("-v", "--verbose")]
    return [*kept, *args[end:]], len(kept) < end


def _usage_error(exc: click.ClickException, args: list[str]) -> UsageError:
    """A click usage error as ``error:`` + ``hint:`` (click's own "Usage: ... Error: ..." block has no hint)."""
    ctx = getattr(exc, "ctx", None)
    path = ctx.command_path if ctx is not None else "attnforge"
    verb = next((a for a in args if a in VERBS), None)
    if ctx is None and verb is not None:
        path = f"attnforge {verb}"
    return UsageError(exc.format_message(), hint=f"see `{path} --help`")


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
