"""``attnforge bench``: TFLOP/s of every verified backend per shape, as a table, JSON and a plot; stored."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from attnforge.bench.report import SCHEMA_VERSION as REPORT_SCHEMA_VERSION
from attnforge.bench.run import BenchCell, BenchReport, CellStatus
from attnforge.bench.stability import DEFAULT_MAX_NOISE
from attnforge.cli._output import console, emit_json, json_option, require_torch
from attnforge.cli._types import FiniteFloat, timeout_type
from attnforge.ranking import Ranking

if TYPE_CHECKING:
    from attnforge.bench.models import ModelAttention

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@click.command("bench")
@click.argument("backends", nargs=-1)
@click.option("--shapes", "shape_set", type=click.Choice(["default", "paper", "grid", "diffusion", "model"]),
              default="default", show_default=True,
              help="default: the papers' grid on a GPU, a tiny one on a CPU; paper: the papers' grid "
                   "(16k tokens, S 512..16k, D 64/128); grid: GQA, chunked prefill, decode, D 64/128/256; "
                   "diffusion: Flux (S4608) and Wan (S32760) lengths; model: --model config.json, or your "
                   "shape (--batch --heads --head-dim --seqlen). grid/diffusion/model run small on a CPU.")
@click.option("--model", "model_config", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="A Hugging Face config.json (--shapes model): time the model's real shape classes.")
@click.option("--batch", type=int, default=None, help="B (--shapes model).")
@click.option("--heads", "heads_q", type=int, default=None, help="query heads Hq (--shapes model).")
@click.option("--kv-heads", "heads_kv", type=int, default=None, help="K/V heads Hkv, GQA (--shapes model; default Hq).")
@click.option("--head-dim", "head_dims", type=int, multiple=True,
              help="head dim D; repeatable. Restricts the grid, or sets the model shape.")
@click.option("--seqlen", "seqlens", type=int, multiple=True,
              help="query length S; repeatable. Restricts the grid, or sets the model shape.")
@click.option("--seqlen-k", type=int, default=None, help="key length Sk if not S (--shapes model).")
@click.option("--dtype", type=click.Choice(sorted(_DTYPES)), default=None,
              help="bf16 (default on a GPU), fp16, or fp32 (default on a CPU).")
@click.option("--causal", type=click.Choice(["both", "on", "off"]), default="both", show_default=True)
@click.option("--mode", type=click.Choice(["fwd", "fwd+bwd", "both"]), default="both", show_default=True)
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None,
              help="default: the GPU when torch sees one, else the CPU.")
@click.option("--timer", type=click.Choice(["auto", "do_bench", "events"]), default="auto", show_default=True,
              help="GPU timer: triton's do_bench (auto when triton imports) or CUDA events.")
@click.option("--rounds", type=click.IntRange(1, 20), default=3, show_default=True,
              help="Interleaved rounds per cell; their noise decides ties (the repetition budget is shared).")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write TFLOP/s vs sequence length to this PNG.")
@click.option("--timeout", "timeout_s", type=timeout_type(), default=1800, show_default=True,
              help="Seconds each backend may run in its own child process before it counts as hung.")
@click.option("--max-noise", "max_noise", type=FiniteFloat(min_value=0.01, max_value=1e6, unit="fraction"),
              default=DEFAULT_MAX_NOISE, show_default=True,
              help="Cells whose rounds spread more (0.5: ±50 %), or whose baseline moved by more between the "
                   "children (a factor of 1.5), are shown as noisy and not stored; a large value stores everything.")
@json_option(version=REPORT_SCHEMA_VERSION)
def command(*, backends: tuple[str, ...], shape_set: str, model_config: Path | None, batch: int | None,
            heads_q: int | None, heads_kv: int | None, head_dims: tuple[int, ...], seqlens: tuple[int, ...],
            seqlen_k: int | None, dtype: str | None, causal: str, mode: str, device: str | None, timer: str,
            rounds: int, plot_path: Path | None, timeout_s: float, max_noise: float, as_json: bool) -> int:
    """Measure attention backends on this machine: TFLOP/s per shape, best per row, ratio to SDPA's default.

    Without BACKENDS, every backend `attnforge verify` passed on this device is measured; SDPA with no kernel
    forced (`sdpa`) is always measured as the baseline. Results are stored for the dispatcher.
    """
    require_torch("bench")
    from attnforge._system.interrupt import sigterm_interrupts
    from attnforge.bench import ShapeSet, to_records
    from attnforge.bench.isolated import crash_records
    from attnforge.bench.report import backend_versions, report_json
    from attnforge.bench.select import choose_backends, choose_shapes, choose_timing, sizes_beside_model
    from attnforge.catalog import load_catalog
    from attnforge.records import BenchRecord, open_records
    from attnforge.types.device import DeviceType
    from attnforge.verify.device import current_device

    dev = current_device(device)
    catalog = load_catalog()
    store = open_records()
    store.check_writable()  # before the work: the cells are stored there (names the file and the fix)
    if plot_path is not None:  # and the plot's folder, before the work too
        from attnforge.bench.plot import check_plot_path

        check_plot_path(plot_path)
    verified = sorted(n for n, r in store.latest_verify(dev.key).items() if r.ok)
    chosen, baseline = choose_backends(backends, verified)
    dtype_name = _DTYPES[dtype] if dtype else ("bfloat16" if dev.type is DeviceType.CUDA else "float32")
    model = None
    # read once (a pipe reads empty the second time); sizes given beside --model are choose_shapes' usage error first
    if (model_config is not None and ShapeSet(shape_set) is ShapeSet.MODEL
            and not sizes_beside_model(heads_q=heads_q, heads_kv=heads_kv, seqlen_k=seqlen_k, head_dims=head_dims)):
        from attnforge.bench.models import read_model_config

        model = read_model_config(model_config)
    shapes = choose_shapes(ShapeSet(shape_set), device=dev, dtype=dtype_name, causal=causal, mode=mode,
                           batch=batch, heads_q=heads_q, heads_kv=heads_kv, head_dims=head_dims, seqlens=seqlens,
                           seqlen_k=seqlen_k, model_config=model_config, model=model)
    if model is not None and model_config is not None and (note := _unbenched_features(model, model_config)):
        click.echo(note, err=True)
    quantized = [n for n in chosen if (e := catalog.backends.get(n)) is not None and e.quantized]
    versions = backend_versions(list(chosen), catalog)
    out = console(stderr=True)
    lines = as_json or not out.is_terminal  # no live spinner: a line per backend on stderr instead
    records: list[BenchRecord] = []
    kept: list[str] = []

    def keep(name: str, partial: BenchReport) -> None:
        """Store one backend's cells as soon as its child is done: an interrupted bench keeps them."""
        got = to_records(partial)
        store.add_bench(got)
        records.extend(got)
        kept.append(name)
        noisy = sum(c.status is CellStatus.NOISY for row in partial.rows for c in row.cells)
        if lines:
            click.echo(f"bench: {name} done ({len(kept)} of {len(chosen)} backends, {len(got)} cells stored"
                       + (f", {noisy} too noisy to store" if noisy else "") + ")", err=True)

    with out.status("benchmarking", spinner="dots") as status, sigterm_interrupts():
        def progress(shape: Any, name: str) -> None:
            if not as_json:
                status.update(f"{shape.label}: {name}")

        timing = dataclasses.replace(choose_timing(dev, timer), rounds=rounds)
        try:
            isolated = _bench_isolated(shapes, chosen=chosen, baseline=baseline, device=dev, timing=timing,
                                       versions=versions, verified=verified,
                                       quantized=quantized, progress=progress, on_backend=keep,
                                       timeout_s=timeout_s, max_noise=max_noise)
        except KeyboardInterrupt:
            left = [n for n in chosen if n not in kept]
            click.echo(f"bench stopped: {len(records)} measurements of {', '.join(kept) or 'no backend'} are "
                       f"stored in {store.path} (the dispatcher uses them); not measured: {', '.join(left)}",
                       err=True)
            raise
    report = isolated.report
    for crash in crash_records(isolated, dev, versions):
        store.add_verify(crash)
        click.echo(f"error: {crash.backend} {crash.summary}", err=True)
    if plot_path is not None:
        from attnforge.bench.plot import write_plot

        write_plot(report, plot_path)
    if as_json:
        emit_json("bench", report_json(report))
    else:
        render_bench(console(), report, plot_path=plot_path, stored=len(records), store_path=store.path)
    return 0 if records and not isolated.crashes else 1


def _bench_isolated(shapes: Any, *, chosen: Any, timeout_s: float, **kw: Any) -> Any:
    """Each backend in its own child process (attnforge.bench.isolated): a crash or hang is recorded, not fatal."""
    import sys

    from attnforge._system.runner import SubprocessRunner
    from attnforge.bench.isolated import bench_in_children
    from attnforge.provision.install import installed_capabilities
    from attnforge.verify.isolated import Isolation

    return bench_in_children(shapes, adapters=chosen, isolation=Isolation(timeout_s=timeout_s, python=sys.executable),
                             runner=SubprocessRunner(), environ=dict(os.environ), caps=installed_capabilities, **kw)


def render_bench(out: Any, report: BenchReport, *, plot_path: Path | None, stored: int,
                 store_path: Path) -> None:
    """The table (shapes x backends, the winner in bold green, ratio to the baseline and the rounds' noise;
    then the winner, its margin and any tie) and its footnotes."""
    from rich.markup import escape
    from rich.table import Table

    dev = report.device
    dtypes = ", ".join(dict.fromkeys(r.shape.dtype for r in report.rows))
    table = Table(title=f"attention TFLOP/s on {dev.name} (torch {dev.torch_version}), {dtypes}",
                  title_justify="left")
    table.add_column("shape")
    names = [b.name for b in report.backends]
    unverified = {b.name for b in report.backends if not b.verified and b.name != report.baseline}
    for name in names:
        table.add_column(name + ("*" if name in unverified else ""), justify="right")
    table.add_column("best (margin)")
    for row in report.rows:
        ranking = row.ranking
        best = ranking.winner
        cells = [_cell_text(row.cell(n), best=n == best, baseline=n == report.baseline) for n in names]
        table.add_row(row.shape.label, *cells, _best_text(ranking))
    out.print(table)
    out.print(f"TFLOP/s: {report.flops_formula}. In brackets: speed relative to {report.baseline} "
              f"(SDPA, no kernel forced); ±: the noise, the median absolute deviation of {report.timing.rounds} "
              "interleaved rounds relative to their median. "
              f"Timer: {report.timing.method.value}, median of repetitions after {report.timing.warmup_ms:g} ms "
              "warm-up. A backend the top does not beat (by more than max(2 %, 3 x their combined noise), or by more "
              "than 2 % with every round faster than every round of the other) is tied with it; a tie goes to the "
              "lower-overhead path (plain SDPA, then a forced SDPA kernel, then other kernels).")
    if unverified:
        out.print(f"* not verified on this device: run `attnforge verify {' '.join(sorted(unverified))}` "
                  "before the dispatcher will use them.")
    first = _slowest_first_calls(report)
    if first:
        out.print("first call (compile/JIT + one run, not in the median): "
                  + ", ".join(f"{n} {s:.2f} s" for n, s in first.items()))
    errors = sorted({(c.backend, c.detail) for r in report.rows for c in r.cells
                     if c.status is CellStatus.ERROR})
    for name, detail in errors[:5]:
        out.print(f"[red]error[/red] {name}: {detail}")
    noisy = [(r.shape.label, c) for r in report.rows for c in r.cells if c.status is CellStatus.NOISY]
    for label, cell in noisy[:5]:
        out.print(f"[yellow]noisy[/yellow] {cell.backend} {label}: {escape(cell.detail)}", soft_wrap=True)
    if len(noisy) > 5:
        out.print(f"  ... and {len(noisy) - 5} more noisy cell(s), not stored; --json lists them all")
    out.print(f"stored {stored} result(s) for {dev.key} in {store_path}")
    if plot_path is not None:
        out.print(f"plot: {plot_path}")


def _best_text(ranking: Ranking) -> str:
    best = ranking.winner
    if best is None:
        return "[dim]-[/dim]"
    parts = [f"{ranking.margin:+.1%}"] if ranking.margin is not None else []
    if len(ranking.tied) > 1:
        parts.append(f"tie: {', '.join(n for n in ranking.tied if n != best)}")
    return f"[bold green]{best}[/bold green]" + (f" ({'; '.join(parts)})" if parts else "")


def _cell_text(cell: BenchCell | None, *, best: bool, baseline: bool) -> str:
    if cell is None or cell.status is CellStatus.SKIPPED:
        return "[dim]-[/dim]"
    if cell.status is CellStatus.ERROR or cell.tflops is None:
        return "[red]error[/red]"
    if cell.status is CellStatus.NOISY:  # measured, not stored: the footnotes say why
        return f"[yellow]{cell.tflops:.3g} noisy[/yellow]"
    text = f"{cell.tflops:.3g}" if cell.tflops < 100 else f"{cell.tflops:.0f}"
    if not baseline and cell.ratio_to_baseline is not None:
        text += f" ({cell.ratio_to_baseline:.2f}x)"
    t = cell.timing
    if t is not None and t.median_ms > 0 and len(t.rounds_ms) > 1:
        text += f" ±{t.mad_ms / t.median_ms:.1%}"
    if cell.error is not None:
        text += f" [dim]L1 {cell.error.rel_l1:.3f} cos {cell.error.cosine:.4f}[/dim]"
    return f"[bold green]{text}[/bold green]" if best else text


def _slowest_first_calls(report: BenchReport) -> dict[str, float]:
    """backend -> its slowest first call, for backends whose first call took over a second (JIT, compile)."""
    slowest: dict[str, float] = {}
    for row in report.rows:
        for cell in row.cells:
            if cell.timing is not None:
                slowest[cell.backend] = max(slowest.get(cell.backend, 0.0), cell.timing.first_call_s)
    return {n: s for n, s in slowest.items() if s >= 1.0}


def _unbenched_features(model: ModelAttention, model_config: Path) -> str | None:
    """A note for a ``--model`` config whose attention calls carry features bench does not time (bench times the
    plain shape classes): a logit softcap (every call of the model: Gemma-2's ``attn_logit_softcapping``) or a
    sliding window (its prefill calls longer than the window). A feature is part of a call's shape class
    (:class:`attnforge.types.shapes.ShapeClass`), so those calls do not read bench's records; ``attnforge warmup
    --model`` measures the classes with their features (:func:`attnforge.dispatch.warmup.warmup`). None when the
    config has neither."""
    said = []
    if model.softcap:
        said.append(f"a logit softcap of {model.softcap:g} on every call")
    if model.sliding_window:
        said.append(f"a {model.sliding_window}-token sliding window on its calls longer than that")
    if not said:
        return None
    return (f"note: {model.name}'s attention carries {' and '.join(said)}; bench times the shape classes without "
            f"them, and such calls do not read these records (a feature is part of the shape class). "
            f"hint: attnforge warmup --model {model_config} measures the classes the model calls, with their features")
