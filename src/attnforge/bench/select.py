"""From ``attnforge bench`` options to the backends, shapes and timing configuration of a run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from attnforge.backends.adapter import BackendAdapter
from attnforge.bench.grid import ShapeSet, cpu_grid, diffusion_grid, model_shapes, paper_grid, real_grid
from attnforge.bench.timing import CPU_PERF_COUNTER, GPU_DO_BENCH, GPU_EVENTS, TimingConfig
from attnforge.errors import UsageError
from attnforge.types.device import DeviceType
from attnforge.types.shapes import AttentionShape, Mode
from attnforge.verify.device import DeviceInfo

if TYPE_CHECKING:
    from attnforge.bench.models import ModelAttention

_CAUSAL = {"both": (False, True), "on": (True,), "off": (False,)}
_MODES = {"both": (Mode.FWD, Mode.FWD_BWD), "fwd": (Mode.FWD,), "fwd+bwd": (Mode.FWD_BWD,)}


def choose_backends(names: Sequence[str], verified: Sequence[str]) -> tuple[dict[str, BackendAdapter], str]:
    """The adapters to time (the SDPA fallback first, as the baseline) and the baseline's name.

    Without names: every verified backend. Named backends are timed even if unverified (the report says so).

    Raises:
        UsageError: a name has no adapter.
    """
    from attnforge.backends.registry import FALLBACK, adapters, fallback

    registry = adapters()
    unknown = [n for n in names if n not in registry and n != FALLBACK]
    if unknown:
        raise UsageError(f"unknown backend(s): {', '.join(unknown)}",
                         hint=f"known: {', '.join([FALLBACK, *sorted(registry)])}")
    wanted = list(dict.fromkeys(names)) if names else [n for n in verified if n in registry]
    chosen: dict[str, BackendAdapter] = {FALLBACK: fallback()}
    chosen.update({n: registry[n] for n in wanted if n != FALLBACK})
    return chosen, FALLBACK


def sizes_beside_model(*, heads_q: int | None, heads_kv: int | None, seqlen_k: int | None,
                       head_dims: Sequence[int]) -> list[str]:
    """The size flags given that a ``--model`` config sets itself (:func:`choose_shapes` refuses them beside it)."""
    return [flag for flag, value in (("--heads", heads_q), ("--kv-heads", heads_kv), ("--seqlen-k", seqlen_k),
                                     ("--head-dim", head_dims or None)) if value is not None]


def choose_shapes(
    shape_set: ShapeSet, *, device: DeviceInfo, dtype: str, causal: str, mode: str, batch: int | None,
    heads_q: int | None, heads_kv: int | None, head_dims: Sequence[int], seqlens: Sequence[int],
    seqlen_k: int | None, model_config: Path | None = None, model: ModelAttention | None = None,
) -> list[AttentionShape]:
    """The shapes for ``--shapes``, restricted by ``--head-dim``/``--seqlen`` when given.

    ``model`` takes a Hugging Face ``--model config.json`` (:mod:`attnforge.bench.models`) or the sizes given
    by ``--batch --heads --head-dim --seqlen``; ``grid`` and ``diffusion`` are shrunk on a CPU. ``model``: the
    config as the caller read it already (a config read twice from a pipe, ``<(...)`` or ``/dev/stdin``, was empty the
    second time).

    Raises:
        UsageError: model-only options with a grid, a missing or non-positive model size, or a filter
            (``--head-dim``/``--seqlen``, ``--causal`` with ``--model``) that leaves nothing.
    """
    causals, modes = _CAUSAL[causal], _MODES[mode]
    cpu = device.type is DeviceType.CPU
    if shape_set is ShapeSet.MODEL and model_config is not None:
        from attnforge.bench.models import model_config_shapes, read_model_config

        clash = sizes_beside_model(heads_q=heads_q, heads_kv=heads_kv, seqlen_k=seqlen_k, head_dims=head_dims)
        if clash:
            raise UsageError(f"{', '.join(clash)} cannot be combined with --model (the config sets them)",
                             hint="keep --model with --batch/--seqlen, or drop --model and give the sizes")

        model = model or read_model_config(model_config)
        shapes = model_config_shapes(model, dtype=dtype, batch=1 if batch is None else batch,
                                     seqlens=tuple(seqlens), modes=modes, cpu=cpu, causals=causals)
        if not shapes:
            runs = "full (non-causal)" if not model.causal else "causal prefill and non-causal decode"
            raise UsageError(f"--causal {causal} leaves no shape class of {model_config}: {model.name} runs {runs} "
                             "attention", hint="drop --causal (with --model the config decides each class's mask)")
        return shapes
    if shape_set is ShapeSet.MODEL:
        return model_shapes(batch=batch, heads_q=heads_q, heads_kv=heads_kv, head_dims=head_dims, seqlens=seqlens,
                            seqlen_k=seqlen_k, dtype=dtype, causals=causals, modes=modes)
    model_only = [flag for flag, value in (("--batch", batch), ("--heads", heads_q), ("--kv-heads", heads_kv),
                                           ("--seqlen-k", seqlen_k), ("--model", model_config))
                  if value is not None]
    if model_only:
        raise UsageError(f"{', '.join(model_only)} only apply to --shapes model",
                         hint="add --shapes model to time your own shape")
    if shape_set is ShapeSet.GRID:
        grid = real_grid(dtype=dtype, modes=modes, cpu=cpu)
    elif shape_set is ShapeSet.DIFFUSION:
        grid = diffusion_grid(dtype=dtype, modes=modes, cpu=cpu)
    else:
        tiny = shape_set is ShapeSet.DEFAULT and cpu
        grid = (cpu_grid if tiny else paper_grid)(dtype=dtype, causals=causals, modes=modes)
    shapes = [s for s in grid
              if (not head_dims or s.head_dim in head_dims) and (not seqlens or s.seqlen_q in seqlens)]
    if not shapes:
        have_d = sorted({s.head_dim for s in grid})
        have_s = sorted({s.seqlen_q for s in grid})
        raise UsageError("--head-dim/--seqlen leave no shape of the grid",
                         hint=f"the grid has head dims {have_d} and seqlens {have_s}; or use --shapes model")
    return shapes


def choose_timing(device: DeviceInfo, timer: str) -> TimingConfig:
    """perf_counter on a CPU; on a GPU triton's do_bench when it imports (the H200 fixture's method), else
    CUDA events.

    Raises:
        UsageError: ``do_bench`` was asked for and triton does not import.
    """
    if device.type is DeviceType.CPU:
        return CPU_PERF_COUNTER
    if timer == "events":
        return GPU_EVENTS
    try:
        import triton.testing  # noqa: F401
    except Exception:  # triton missing or broken: CUDA events time the same way
        if timer == "do_bench":
            raise UsageError("--timer do_bench needs triton",
                             hint="pip install triton, or use --timer events") from None
        return GPU_EVENTS
    return GPU_DO_BENCH
