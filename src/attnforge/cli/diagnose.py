"""``attnforge diagnose LOG``: the cause of a failed build or import, the lines that show it, and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from attnforge.cli._output import console, emit_json, json_option, snapshot_option


@click.command("diagnose")
@click.argument("log", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@snapshot_option
@click.option("--this-machine", is_flag=True,
              help="Probe this machine and use what it finds (e.g. a CPU-only torch) to sharpen the answer.")
@click.option("--name", default=None, help="The package the log builds, used in the fix commands.")
@json_option
def command(
    *, log: Path, snapshot_path: Path | None, this_machine: bool, name: str | None, as_json: bool
) -> int:
    """Explain a failed build or import log: cause, evidence (log lines), and the fix as commands.

    Without --snapshot, values the log does not state (nvcc and torch versions) come from this machine's
    probe, and the answer says so.

    Exit status 0 when the failure is recognised (or the log shows none), 1 when it is not recognised (the
    likeliest lines are shown).
    """
    from attnforge.cli._output import load_or_probe
    from attnforge.diagnose import diagnose_file

    snapshot = machine = None
    if snapshot_path is not None or this_machine:
        snapshot = load_or_probe(snapshot_path)
    else:  # no machine named: this one's probe fills the placeholders the log leaves open (the notes say so)
        machine = load_or_probe(None)
    diagnosis = diagnose_file(log, snapshot=snapshot, name=name, machine=machine)
    if as_json:
        emit_json("diagnosis", diagnosis)
    else:
        render_diagnosis(console(), diagnosis)
    return 0 if diagnosis.known or diagnosis.title == "no failure" else 1


def render_diagnosis(out: Any, diagnosis: Any) -> None:
    """Print a :class:`~attnforge.diagnose.Diagnosis` for people: cause, evidence with line numbers, fix."""
    from rich.markup import escape

    if diagnosis.known:
        label = "[bold red]cause[/]"
    elif diagnosis.title == "no failure":
        label = "[bold green]no failure[/]"
    else:
        label = "[bold yellow]unrecognised[/]"
    out.print(f"{label}: {escape(diagnosis.cause)}", soft_wrap=True)
    if diagnosis.signature:
        out.print(f"[dim]signature: {diagnosis.signature} ({escape(diagnosis.title)}, {diagnosis.stage})[/]")
    if diagnosis.failed_target:
        out.print(f"[dim]ninja could not build: {escape(diagnosis.failed_target)}[/]", soft_wrap=True)
    if diagnosis.location:
        out.print(f"source: {escape(diagnosis.location)}")
    if diagnosis.evidence:
        where = diagnosis.log_path or "log"
        out.print("evidence:")
        for ev in diagnosis.evidence:
            out.print(f"  [dim]{escape(where)}:{ev.line}[/]  {escape(ev.text)}", soft_wrap=True)
    if diagnosis.fix:
        out.print("fix:")
        for step in diagnosis.fix:
            out.print(f"  [bold]{escape(step)}[/]", soft_wrap=True)
    for note in diagnosis.notes:
        out.print(f"[dim]note: {escape(note)}[/]", soft_wrap=True)
    if diagnosis.sources:
        out.print(f"[dim]known from: {escape(', '.join(diagnosis.sources))}[/]", soft_wrap=True)
