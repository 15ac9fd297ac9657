"""``attnforge doctor``: the main job — what this machine has, where every backend stands, what to do next."""

from __future__ import annotations

from pathlib import Path

import click

from attnforge.cli._output import console, emit_json, json_option, load_or_probe, snapshot_option


@click.command("doctor")
@json_option
@snapshot_option
def command(as_json: bool, snapshot_path: Path | None) -> int:
    """Report this machine, the state of every attention backend and the next step for each.

    Exit 0 when a GPU backend is ready, 1 when only the CPU fallback runs here.
    """
    import os

    from attnforge._system.compile_cache import ensure
    from attnforge.catalog import load_catalog
    from attnforge.records import open_records
    from attnforge.report.doctor import Status, doctor_report
    from attnforge.report.preflight import build_blockers

    snapshot = load_or_probe(snapshot_path)
    catalog = load_catalog()
    key = snapshot.device_key()
    verified, bench, problem = open_records().read_or_empty(key)  # a damaged records.db: report without it
    if problem is not None:
        click.echo(f"warning: {problem.message}; the report goes on without records\ncause: {problem.cause}\n"
                   f"hint: {problem.hint}", err=True)
    report = doctor_report(snapshot, catalog, verified=verified, bench=bench,
                           build_blockers=build_blockers(snapshot, catalog))
    caches = ensure(dict(os.environ))  # what attention() in a process started from here would use
    if as_json:
        # the records' problem in the document too (a JSON reader never sees the stderr warning): null when none
        records_problem = None if problem is None else {
            "message": problem.message, "cause": problem.cause, "hint": problem.hint,
            "path": str(open_records().path)}
        emit_json("doctor", {"device_key": key, "report": report, "snapshot": snapshot, "compile_caches": caches,
                             "records_problem": records_problem})
    else:
        from attnforge.report.render import render_doctor

        out = console()
        render_doctor(out, report, snapshot)
        out.print("JIT compile caches (FA4, FlexAttention): " + "; ".join(caches.lines())
                  + (f" ({caches.note})" if caches.note else ""), highlight=False)
    gpu_ready = any(r.status is Status.READY and r.backend != "sdpa-math" for r in report.rows)
    return 0 if gpu_ready else 1
