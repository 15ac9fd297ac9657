"""``attnforge install BACKEND[==VER]``: plan, then cache / wheel / build, then pip install, then verify.

Acts on the interpreter attnforge runs in (``--snapshot`` reuses a saved probe of this machine). The request is
assembled and run by :func:`attnforge.provision.install.install`, as ``plan`` and ``build`` assemble theirs.
Exit codes: 0 installed (and verified, unless --no-verify), 1 not possible here or verification failed,
2 bad input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from attnforge.cli._output import console, emit_json, json_option
from attnforge.cli._request import request_args, request_options

if TYPE_CHECKING:
    from attnforge.provision.install import InstallResult


@click.command("install")
@request_options
@click.option("--no-verify", is_flag=True, help="Skip the numerical check after installing.")
@click.option("--allow-overlap", is_flag=True,
              help="Install even if the wheel ships files another installed distribution owns (they are "
              "replaced, and uninstalling either later deletes them for both); refused by default.")
@click.option("--require-hashes", is_flag=True,
              help="Refuse a wheel whose sha256 is not published where it comes from (else its hash is "
              "recorded on first use and shown as such).")
@json_option
def command(*, no_verify: bool, allow_overlap: bool, require_hashes: bool, as_json: bool, **params: Any) -> int:
    """Get REQUIREMENT (a backend, optionally with a version) working in this interpreter: from the cache, a
    hash-checked wheel, or a build (the plan is the one `attnforge plan` shows for the same arguments)."""
    from attnforge.cli.build import build_progress, unsupported_compiler_warning
    from attnforge.provision.install import install

    args = request_args(params)
    # a source build takes minutes to hours: its progress on stderr, as `attnforge build` shows it
    with build_progress(args.requirement or args.name or "build", as_json=as_json) as reporter:
        result = install(args, verify=not no_verify, allow_overlap=allow_overlap, require_hashes=require_hashes,
                         on_note=lambda line: click.echo(f"note: {line}", err=True), reporter=reporter)
    built = result.plan.chosen.build if result.action == "built" and result.plan.chosen else None
    warning = unsupported_compiler_warning(built) if built is not None else None
    if warning:
        click.echo(warning, err=True)
    if as_json:
        emit_json("install", result)
    else:
        _render(result)
    return 0 if result.ok else 1


def _render(result: InstallResult) -> None:
    from rich.text import Text

    out = console()
    what = {
        "cache-hit": "from the cache",
        "wheel": "from a wheel whose published sha256 matched, now cached" if result.hash_source == "published"
        else "from a wheel with no published sha256 (hash recorded on first use, not published), now cached",
        "built": "built from source, now cached", "already-installed": "already installed",
    }[result.action]
    chosen = result.plan.chosen
    out.print(f"[bold]{result.request.backend}[/bold]: {what}", soft_wrap=True)
    if chosen is not None:
        out.print(f"  plan: [{chosen.kind.value}] {chosen.description}", soft_wrap=True, markup=False)
        if chosen.build is not None and chosen.build.capabilities is not None:
            out.print(f"  slim build, can run: {chosen.build.capabilities.describe()}", soft_wrap=True, markup=False)
    if result.cache_key:
        out.print(f"  cache key: {result.cache_key}", soft_wrap=True)
    if result.pip is not None:
        out.print(f"  installed {result.pip.name} {result.pip.version} into {result.pip.python} "
                  f"(torch {result.pip.torch_version or 'absent'}, unchanged)", soft_wrap=True, markup=False)
    if result.verification is not None:
        v = result.verification
        mark = {True: "[green]verified[/green]", False: "[red]verification failed[/red]"}.get(
            v.ok, "not verified"  # type: ignore[arg-type]
        )
        out.print(f"  {mark}: {v.summary}", soft_wrap=True)
    for w in (*result.warnings, *_usage_notes(result)):  # plain text: a path or requirement may hold [brackets]
        out.print(Text.assemble("  ", ("note", "yellow"), ": ", w), soft_wrap=True)
    timings = ", ".join(f"{k} {v:.2f} s" for k, v in result.timings_s.items())
    if timings:
        out.print(f"  time: {timings}", soft_wrap=True)


def _usage_notes(result: InstallResult) -> tuple[str, ...]:
    """What the user must do for attention() to use the backend just installed, beyond verify: a backend whose
    kernels compile on their first call (``jit_per_variant``, FlashAttention-4) is timed by warmup or bench only
    (measure-on-first-use leaves it out: docs/dispatch-policy.md)."""
    from attnforge.backends.capabilities import load_capabilities

    if not result.ok:
        return ()
    caps = load_capabilities().get(result.request.backend)
    if caps is None or not caps.jit_per_variant:
        return ()
    return (f"{result.request.backend} compiles its kernels on their first call (seconds each), so attention() "
            "does not time it on a class's first use: run `attnforge warmup --model config.json` (or `attnforge "
            "bench`) as a deploy step to let it compete",)
