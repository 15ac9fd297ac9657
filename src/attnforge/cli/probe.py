"""``attnforge probe``: the raw system snapshot."""

from __future__ import annotations

import click

from attnforge.cli._output import console


@click.command("probe")
@click.option("--json", "as_json", is_flag=True, help="Print the snapshot as JSON (feed it to --snapshot later).")
def command(as_json: bool) -> int:
    """Read this machine and print the system snapshot every decision is made from."""
    from attnforge.catalog import load_catalog
    from attnforge.probe import collect_snapshot

    snap = collect_snapshot(backends=load_catalog().backends.values())
    if as_json:
        click.echo(snap.to_json())
        return 0
    from attnforge.report.render import render_system

    out = console()
    render_system(out, snap, verbose=True)
    return 0
