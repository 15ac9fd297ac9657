"""Rich rendering of the system summary and the doctor table (for people; ``--json`` is for programs)."""

from __future__ import annotations

from typing import Any

from attnforge.probe.snapshot import SystemSnapshot
from attnforge.report.doctor import DoctorReport, Status, system_summary
from attnforge.types.cc import format_cc

_STYLE = {Status.READY: "green", Status.BROKEN: "red", Status.MISSING: "yellow", Status.UNSUPPORTED: "dim"}


def _mark(value: bool | None) -> str:
    return {True: "yes", False: "NO", None: "-"}[value]


def render_system(out: Any, s: SystemSnapshot, *, verbose: bool = False) -> None:
    """Print the system summary; ``verbose`` adds every toolkit, the build environment and probe problems."""
    from rich.panel import Panel

    lines = system_summary(s)
    if verbose:
        for tk in s.cuda_toolkits:
            lines.append(f"  toolkit {tk.version} at {tk.path} (found via {tk.found_via}"
                         f"{'' if tk.has_headers else ', no headers: a wrapper'})")
        if s.torch and s.torch.arch_list:
            lines.append(f"  torch arch list: {' '.join(s.torch.arch_list)}")
        for g in s.gpus:
            lines.append(f"  GPU {g.index}: sm_{g.compute_capability[0]}{g.compute_capability[1]} "
                         f"(compute capability {format_cc(g.compute_capability)})")
        if s.platform.os == "windows":
            lines.append(f"  LongPathsEnabled: {s.long_paths_enabled}")
        for k, v in s.env.items():
            lines.append(f"  env {k}={v}")
        for p in s.problems:
            lines.append(f"  not read: {p.section}: {p.reason}")
    out.print(Panel("\n".join(lines), title="this machine", expand=False))


def render_doctor(out: Any, report: DoctorReport, snapshot: SystemSnapshot) -> None:
    """Print the doctor report: system panel, one row per backend, verdict (three wrapping columns when the
    console is narrower than the seven-column table)."""
    render_system(out, snapshot)
    if report.blocker:
        out.print(f"[bold red]blocked:[/bold red] {report.blocker}")
    if getattr(out, "width", 200) < _WIDE:
        out.print(_narrow_table(report))
    else:
        out.print(_wide_table(report))
    v = report.verdict
    out.print(f"[bold]fastest now:[/bold] {v.fastest_now} ({v.evidence})")
    out.print(f"[bold]to go faster:[/bold] {v.to_go_faster}")


#: Below this many columns the seven-column table would cut the next step; three columns wrap instead.
_WIDE = 130


def _narrow_table(report: DoctorReport) -> Any:
    """backend | status | facts (version, loads, GPU, verified) over the problem / next step, wrapped by words."""
    from rich.table import Table

    table = Table(title="attention backends", show_lines=True, expand=True)
    table.add_column("backend", overflow="fold", max_width=24)
    table.add_column("status", no_wrap=True)
    table.add_column("installed, loads, verified / problem -> next step", overflow="fold", ratio=1)
    for r in report.rows:
        style = _STYLE[r.status]
        loads = _mark(r.imports) if r.native_ok is None else _mark(bool(r.imports) and r.native_ok)
        gpu = f", this GPU {r.gpu_support}" if r.gpu_support and r.gpu_support != "-" else ""
        facts = f"[dim]{r.version or '-'}, loads {loads}{gpu}, verified {_mark(r.verified)}[/dim]"
        text = r.next_step if r.problem is None else f"{r.problem} [dim]->[/dim] {r.next_step}"
        table.add_row(r.name, f"[{style}]{r.status.value}[/{style}]", f"{facts}\n{text}")
    return table


def _wide_table(report: DoctorReport) -> Any:
    from rich.table import Table

    table = Table(title="attention backends", show_lines=False, expand=False)
    table.add_column("backend", no_wrap=True)
    table.add_column("installed", no_wrap=True)
    table.add_column("loads", no_wrap=True)
    table.add_column("this GPU", max_width=26)
    table.add_column("verified", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("problem / next step", overflow="fold", min_width=44)
    for r in report.rows:
        style = _STYLE[r.status]
        loads = _mark(r.imports) if r.native_ok is None else _mark(bool(r.imports) and r.native_ok)
        text = r.next_step if r.problem is None else f"{r.problem} [dim]->[/dim] {r.next_step}"
        table.add_row(r.name, r.version or "-", loads, r.gpu_support, _mark(r.verified),
                      f"[{style}]{r.status.value}[/{style}]", text)
    return table
