"""``attnforge warmup``: compile and measure a model's attention shape classes ahead of time (a deploy step)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from attnforge.cli._output import console, emit_json, json_option, require_torch
from attnforge.cli._types import timeout_type

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@click.command("warmup")
@click.option("--model", "model_config", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="A model's config.json (transformers, or a diffusers transformer's): warm its shape classes.")
@click.option("--shapes", "shape_set", type=click.Choice(["default", "grid", "diffusion", "model"]), default=None,
              help="A shape set of `attnforge bench` instead of --model (model: --batch --heads --head-dim "
                   "--seqlen).")
@click.option("--batch", type=int, default=None, help="B (default 1 with --model).")
@click.option("--heads", "heads_q", type=int, default=None, help="query heads Hq (--shapes model).")
@click.option("--kv-heads", "heads_kv", type=int, default=None, help="K/V heads Hkv (--shapes model).")
@click.option("--head-dim", "head_dims", type=int, multiple=True, help="head dim D; repeatable.")
@click.option("--seqlen", "seqlens", type=int, multiple=True, help="query length S; repeatable.")
@click.option("--seqlen-k", type=int, default=None, help="key length Sk if not S (--shapes model).")
@click.option("--dtype", type=click.Choice(sorted(_DTYPES)), default=None,
              help="bf16 (default on a GPU), fp16, or fp32 (default on a CPU).")
@click.option("--mode", type=click.Choice(["fwd", "fwd+bwd", "both"]), default="both", show_default=True)
@click.option("--layout", type=click.Choice(["bhsd", "bshd", "both"]), default="bhsd", show_default=True,
              help="How the model passes q/k/v: [B, H, S, D] (transformers) or [B, S, H, D] (diffusers, "
                   "flash-attn-style callers); a kernel's first call in another layout may build again.")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None,
              help="default: the GPU when torch sees one, else the CPU.")
@click.option("--budget", "budget_s", type=timeout_type(min_s=0.01), default=1.0, show_default=True,
              help="Seconds of timed repetitions per shape class, all candidates together.")
@click.option("--rounds", type=click.IntRange(1, 20), default=5, show_default=True)
@click.option("--precision", type=click.Choice(["exact", "allow_quantized"]), default="exact", show_default=True,
              help="The precision the model's attention() calls pass: allow_quantized also compiles and times "
                   "SageAttention's quantized kernels for them.")
@json_option
def command(*, model_config: Path | None, shape_set: str | None, batch: int | None, heads_q: int | None,
            heads_kv: int | None, head_dims: tuple[int, ...], seqlens: tuple[int, ...], seqlen_k: int | None,
            dtype: str | None, mode: str, layout: str, device: str | None, budget_s: float, rounds: int,
            precision: str, as_json: bool) -> int:
    """Compile and measure, now, the shape classes a model will call attention with, so that serving never
    waits for a first use: every verified candidate is compiled into the compile caches under ATTNFORGE_HOME
    and timed as the model issues it; the results are the records attention() reads.

    Exit 0 when every class was warmed and its records saved, 1 when a call failed, measuring is off
    (ATTNFORGE_AUTOTUNE=0) or the records could not be saved.
    """
    require_torch("warmup")
    from attnforge.bench import ShapeSet
    from attnforge.bench.select import choose_shapes
    from attnforge.dispatch.warmup import warmup
    from attnforge.errors import UsageError
    from attnforge.records import open_records
    from attnforge.types.device import DeviceType
    from attnforge.verify.device import current_device

    if model_config is None and shape_set is None:
        raise UsageError("warmup needs either --model config.json or --shapes",
                         hint="attnforge warmup --model path/to/config.json")
    open_records().check_writable()  # before the work: its measurements are the records (names the file and the fix)
    dev = current_device(device)
    dtype_name = _DTYPES[dtype] if dtype else ("bfloat16" if dev.type is DeviceType.CUDA else "float32")
    window = softcap = padded_prefill_from = model = None
    if model_config is not None:
        from attnforge.bench.models import read_model_config
        from attnforge.integrations.transformers import PREFILL_VARLEN_MIN

        model = read_model_config(model_config)
        window, softcap = model.sliding_window, model.softcap
        padded_prefill_from = PREFILL_VARLEN_MIN  # a decoder's left-padded prompts (its integration's varlen route)
    # a model's config decides each class's mask (causal prefill, full decode; full for a diffusers transformer);
    # sizes given by hand are a decoder's causal prefill
    causal = "both" if model_config is not None else "on"
    shapes = choose_shapes(ShapeSet(shape_set or "model"), device=dev, dtype=dtype_name, causal=causal, mode=mode,
                           batch=batch if batch is not None or model_config is None else 1, heads_q=heads_q,
                           heads_kv=heads_kv, head_dims=head_dims, seqlens=seqlens, seqlen_k=seqlen_k,
                           model_config=model_config, model=model)
    if layout != "bhsd":
        import dataclasses

        from attnforge.types.shapes import Layout

        chosen = [Layout.BHSD, Layout.BSHD] if layout == "both" else [Layout.BSHD]
        shapes = [dataclasses.replace(s, layout=lay) for s in shapes for lay in chosen]
    out = console(stderr=True)
    with out.status("warming up", spinner="dots") as status, _state_problems() as problems:
        report = warmup(shapes, device=dev.torch_device, window=window, softcap=softcap, budget_s=budget_s,
                        rounds=rounds, progress=None if as_json else lambda s: status.update(s.label),
                        padded_prefill_from=padded_prefill_from, precision=precision)
    if as_json:
        emit_json("warmup", {**_json(report), "precision": precision, "records_saved": not problems,
                             "records_problems": problems})
    else:
        _render(console(), report)
    for problem in problems:  # the runtime went on without its records (disk full mid-run): the warm-up is lost
        click.echo(f"error: the measurements of this warm-up were not saved: {problem}", err=True)
    return 0 if report.measuring and all(not c.error for c in report.classes) and not problems else 1


@contextmanager
def _state_problems() -> Iterator[list[str]]:
    """The runtime's :class:`~attnforge.dispatch.state.StateWarning` texts while the body runs (records.db could not
    be read or written: the runtime never raises, it warns once and keeps measurements in the process), recorded
    instead of printed; every other warning is shown as usual."""
    import warnings

    from attnforge.dispatch.state import StateWarning

    problems: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", StateWarning)  # recorded, never raised (an "error" filter included)
        yield problems
    for w in caught:
        if issubclass(w.category, StateWarning):
            problems.append(str(w.message).removeprefix("attnforge: "))
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _json(report: Any) -> dict[str, Any]:
    def shape(s: Any) -> dict[str, Any]:
        return {"label": s.label, "batch": s.batch, "heads_q": s.heads_q, "heads_kv": s.heads_kv,
                "head_dim": s.head_dim, "seqlen_q": s.seqlen_q, "seqlen_k": s.seqlen_k, "causal": s.causal,
                "mode": str(s.mode), "dtype": s.dtype, "layout": s.layout.value}

    return {"measuring": report.measuring, "compiled_files": report.compiled_files, "caches": report.caches,
            "classes": [{"shape": shape(c.shape), "features": list(c.features), "shape_class": c.shape_class,
                         "chosen": c.chosen, "basis": c.basis, "duration_s": c.duration_s, "error": c.error,
                         "timed_again": c.timed_again}
                        for c in report.classes]}


def _render(out: Any, report: Any) -> None:
    from rich.table import Table

    table = Table(title="attnforge warmup", title_justify="left")
    for column in ("shape", "features", "class", "serves", "why", "s"):
        table.add_column(column)
    for c in report.classes:
        layout = "" if c.shape.layout.value == "bhsd" else f" ({c.shape.layout.value})"
        why = c.basis + (" [dim](contested: timed again)[/dim]" if c.timed_again else "")
        table.add_row(c.shape.label + layout, ", ".join(c.features) or "-", c.shape_class,
                      c.chosen or f"[red]{c.error}[/red]", why, f"{c.duration_s:.2f}")
    out.print(table)
    if not report.measuring:
        out.print("[yellow]ATTNFORGE_AUTOTUNE=0: nothing was measured; unset it to warm up[/yellow]")
    out.print(f"compile caches: {'; '.join(report.caches.lines())}" + (f" ({report.caches.note})"
                                                                       if report.caches.note else ""))
    out.print(f"{report.compiled_files} files compiled into them (0: everything came from the cache)")
