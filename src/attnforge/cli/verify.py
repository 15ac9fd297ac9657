"""``attnforge verify``: native import in a subprocess, then numerics against a float64 reference."""

from __future__ import annotations

import sys
from typing import Any

import click

from attnforge.bench.report import device_json
from attnforge.cli._output import console, emit_json, json_option, require_torch, verbose
from attnforge.cli._types import timeout_type
from attnforge.verify.check import BackendVerification, CaseStatus, details_json
from attnforge.verify.run import VerifyReport

#: failed cases shown per backend in the table (the JSON has them all)
SHOWN_FAILURES = 3


#: the verify document's own version (overrides the envelope's 1): 2 renamed each case's ``heads``/``kv_heads``
#: to ``heads_q``/``heads_kv`` (readers take both: :func:`attnforge.types.shapes.current_head_keys`)
SCHEMA_VERSION = 2


@click.command("verify")
@click.argument("backends", nargs=-1)
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None,
              help="default: the GPU when torch sees one, else the CPU.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the random shapes and inputs.")
@click.option("--timeout", "timeout_s", type=timeout_type(), default=900, show_default=True,
              help="Seconds each backend may run in its own child process before it counts as hung.")
@json_option(version=SCHEMA_VERSION)
def command(backends: tuple[str, ...], device: str | None, seed: int, timeout_s: float, as_json: bool) -> int:
    """Prove attention backends work here: their native modules import, and their output matches a float64
    reference (TF32 off) over random shapes, dtypes, head dims, causal on/off and GQA.

    Without BACKENDS, every installed backend with a path on this device is verified. Exit 0 when every
    verified backend passed, 1 when one failed. Verdicts are stored for `attnforge doctor` and the dispatcher.
    """
    require_torch("verify")
    from attnforge.backends.registry import adapters
    from attnforge.catalog import load_catalog
    from attnforge.catalog.tolerances import load_tolerances
    from attnforge.records import open_records
    from attnforge.verify.device import current_device
    from attnforge.verify.isolated import Isolation
    from attnforge.verify.run import run_verify

    store = open_records()
    store.check_writable()  # before the work: the verdicts are stored there (names the file and the fix)
    dev = current_device(device)
    out = console(stderr=True)
    with out.status(f"verifying on {dev.name}", spinner="dots"):
        report = run_verify(list(backends), adapters=adapters(), catalog=load_catalog(), device=dev,
                            tolerances=load_tolerances(), store=store, python=sys.executable, seed=seed,
                            isolation=Isolation(timeout_s=timeout_s, python=sys.executable))
    if as_json:
        emit_json("verify", verify_json(report))
    else:
        render_verify(console(), report, store_path=str(store.path))
    return 0 if report.ok else 1



def verify_json(report: VerifyReport) -> dict[str, Any]:
    """The ``--json`` payload: the device, the verdict, per backend its cases, and what was skipped."""
    dev = report.device
    return {
        "schema_version": SCHEMA_VERSION,
        "device": device_json(dev),
        "ok": report.ok,
        "results": [{"backend": r.backend, "version": r.backend_version, "ok": r.ok, "summary": r.summary,
                     **details_json(r)} for r in report.results],
        "skipped": dict(report.skipped),
    }


def render_verify(out: Any, report: VerifyReport, *, store_path: str) -> None:
    """One row per backend, then the worst elements of the failed cases."""
    from rich.table import Table

    dev = report.device
    table = Table(title=f"verify on {dev.name} (torch {dev.torch_version})", title_justify="left")
    for col in ("backend", "version", "result", "summary"):
        table.add_column(col, overflow="fold")
    for r in report.results:
        verdict = "[bold green]verified[/bold green]" if r.ok else "[bold red]FAILED[/bold red]"
        table.add_row(r.backend, r.backend_version or "-", verdict, r.summary)
    out.print(table)
    for r in report.results:
        _render_failures(out, r)
    for name, why in report.skipped.items():
        out.print(f"[dim]skipped {name}: {why}[/dim]")
    if not report.results:
        out.print(f"nothing to verify on {dev.type.value}: no installed backend runs here")
    out.print(f"verdicts stored for {dev.key} in {store_path}")


def _render_failures(out: Any, result: BackendVerification) -> None:
    from rich.markup import escape

    failures = result.failures
    for case in failures[:SHOWN_FAILURES]:
        out.print(f"[red]{result.backend}[/red] {case.case.label}: {escape(case.detail)}", soft_wrap=True)
        if case.cause and verbose():  # -v: the whole exception chain (also in --json and the stored record)
            out.print(escape(case.cause), soft_wrap=True)
    if len(failures) > SHOWN_FAILURES:
        out.print(f"  ... and {len(failures) - SHOWN_FAILURES} more failed case(s); --json lists them all")
    errors = [c for c in failures if c.status is CaseStatus.ERROR]
    if errors and len(errors) == len(failures):
        more = "" if verbose() else "; -v prints each exception's whole chain (--json has it too)"
        out.print(f"  every failure of {result.backend} is an exception: the kernel did not run{more}")
