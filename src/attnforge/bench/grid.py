"""The shapes ``attnforge bench`` times: the papers' grid, the real-shape grid, diffusion lengths, a model's.

The papers' grid (FlashAttention-2 ``benchmarks/benchmark_flash_attention.py``, FlashAttention-2 paper §4.1,
FlashAttention-3 paper §4.1): 16k tokens per batch (``B = 16384 // S``), ``S`` from 512 to 16k, hidden size
2048 (``H = 2048 // D``: 32 heads of 64, 16 of 128), causal on and off, forward and forward + backward.
The H200 fixture (tests/fixtures/h200_bench_2026-11-21.json) is the ``D = 128`` column of that grid at
``S`` = 1k, 4k and 16k.

The real-shape grid (``--shapes grid``, issue 17's cells the papers' grid does not hold): GQA prefill, chunked
prefill with GQA (``Sq < Sk``), decode (``Sq = 1``), head dims 64/128/256. ``--shapes diffusion``: Flux
(``B1 H24 S4608 D128``, 4096 image + 512 text tokens) and Wan 2.1 14B at 720p (``B1 H40 S32760 D128``).
On a CPU every set keeps its structure (GQA ratio, ``Sq`` vs ``Sk``, head dims) at lengths divided by
:data:`CPU_DIVISOR` and at most :data:`CPU_MAX_HEADS` heads, so a CPU run takes seconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from attnforge._compat import StrEnum
from attnforge.backends.adapter import AttentionCall
from attnforge.errors import UsageError
from attnforge.types.shapes import AttentionShape, Mode

PAPER_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
PAPER_HEAD_DIMS = (64, 128)
PAPER_TOKENS = 16384
PAPER_HIDDEN = 2048
#: The CPU grid keeps the papers' structure at a size that runs in CI in seconds.
CPU_SEQLENS = (64, 128)
CPU_HEAD_DIMS = (32, 64)
CPU_TOKENS = 256
CPU_HIDDEN = 128
CPU_DIVISOR = 64
CPU_MAX_HEADS = 4

#: ``(name, B, Hq, Hkv, Sq, Sk, D, causal, fwd+bwd too)`` of ``--shapes grid``: the cells of issue 17's check on
#: the H200 (``scripts/gpu/grid_check.py`` reads this table, so the check measures exactly the classes the policy
#: looks up after ``attnforge bench --shapes grid``; diffusion lengths are :data:`DIFFUSION`).
REAL_GRID = (
    ("mha-1k", 8, 16, 16, 1024, 1024, 128, False, True),
    ("mha-1k-causal", 8, 16, 16, 1024, 1024, 128, True, True),
    ("gqa4-4k-causal", 2, 32, 8, 4096, 4096, 128, True, True),
    ("gqa8-8k-causal", 1, 64, 8, 8192, 8192, 128, True, True),
    ("chunked-prefill-gqa", 1, 32, 8, 512, 4096, 128, True, True),
    ("decode-gqa", 8, 32, 8, 1, 4096, 128, False, False),
    ("decode-gqa-causal", 8, 32, 8, 1, 8192, 128, True, False),
    ("d64-2k-causal", 4, 16, 16, 2048, 2048, 64, True, True),
    ("d256-4k-causal", 2, 16, 16, 4096, 4096, 256, True, True),
    ("16k-causal", 1, 16, 16, 16384, 16384, 128, True, True),
)
#: ``(name, B, H, S, D)`` of ``--shapes diffusion``: non-causal, bf16 on a GPU.
DIFFUSION = (
    ("flux", 1, 24, 4608, 128),  # Flux.1: 24 heads of 128, 4096 image tokens (1024x1024) + 512 text tokens
    ("wan-720p", 1, 40, 32760, 128),  # Wan 2.1 14B: 40 heads of 128, 21 latent frames x 1560 tokens at 720p
    ("16k", 1, 24, 16384, 128),
)


class ShapeSet(StrEnum):
    """``--shapes``: the device's default grid, the papers' full grid, or the user's model shape."""

    DEFAULT = "default"
    PAPER = "paper"
    GRID = "grid"
    DIFFUSION = "diffusion"
    MODEL = "model"


def shrink_for_cpu(shape: AttentionShape) -> AttentionShape:
    """The same structure at CPU size: lengths / ``CPU_DIVISOR`` but at least 8 (a length under 8 stays: never
    longer than the model allows, ``max_position_embeddings: 1`` included), at most 4 heads, B1."""
    ratio = max(1, shape.heads_q // shape.heads_kv)
    heads = max(ratio, min(shape.heads_q, CPU_MAX_HEADS))
    return replace(shape, batch=1, heads_q=heads, heads_kv=max(1, heads // ratio),
                   seqlen_q=_cpu_length(shape.seqlen_q), seqlen_k=_cpu_length(shape.seqlen_k))


def _cpu_length(length: int) -> int:
    return min(length, max(8, length // CPU_DIVISOR))


def real_grid(*, dtype: str, modes: Iterable[Mode] = (Mode.FWD, Mode.FWD_BWD), cpu: bool = False,
              names: Iterable[str] | None = None) -> list[AttentionShape]:
    """``--shapes grid`` (:data:`REAL_GRID`), decode in forward only; shrunk with ``cpu``."""
    wanted = set(names) if names is not None else None
    modes = tuple(modes)
    out = [AttentionShape(batch=b, heads_q=hq, heads_kv=hkv, head_dim=d, seqlen_q=sq, seqlen_k=sk, causal=causal,
                          mode=mode, dtype=dtype)
           for name, b, hq, hkv, sq, sk, d, causal, train in REAL_GRID if wanted is None or name in wanted
           for mode in modes if train or mode is Mode.FWD]
    return [shrink_for_cpu(s) for s in out] if cpu else out


def diffusion_grid(*, dtype: str, modes: Iterable[Mode] = (Mode.FWD,), cpu: bool = False) -> list[AttentionShape]:
    """``--shapes diffusion`` (:data:`DIFFUSION`): non-causal self-attention at video/image lengths."""
    out = [AttentionShape(batch=b, heads_q=h, heads_kv=h, head_dim=d, seqlen_q=s, seqlen_k=s, causal=False,
                          mode=mode, dtype=dtype)
           for mode in modes for _name, b, h, s, d in DIFFUSION]
    return [shrink_for_cpu(s) for s in out] if cpu else out


def to_call(shape: AttentionShape, *, device_type: str, compute_capability: tuple[int, int] | None,
            precision: str = "exact") -> AttentionCall:
    """The adapter-facing description of ``shape`` (``needs_grad`` for fwd+bwd)."""
    return AttentionCall(
        device_type=device_type, compute_capability=compute_capability, dtype=shape.dtype,
        batch=shape.batch, heads_q=shape.heads_q, heads_kv=shape.heads_kv, seqlen_q=shape.seqlen_q,
        seqlen_k=shape.seqlen_k, head_dim=shape.head_dim, causal=shape.causal,
        needs_grad=shape.mode is Mode.FWD_BWD, precision=precision,
    )


def paper_grid(
    *, dtype: str, causals: Iterable[bool] = (False, True), modes: Iterable[Mode] = (Mode.FWD, Mode.FWD_BWD),
    seqlens: Iterable[int] = PAPER_SEQLENS, head_dims: Iterable[int] = PAPER_HEAD_DIMS,
    tokens: int = PAPER_TOKENS, hidden: int = PAPER_HIDDEN,
) -> list[AttentionShape]:
    """The FlashAttention papers' grid (module docstring), ordered mode > causal > head dim > seqlen.

    Args:
        dtype: ``"bfloat16"`` or ``"float16"`` (``"float32"`` for CPU runs).
        causals, modes, seqlens, head_dims: restrict the grid.
        tokens: tokens per batch (``B = max(1, tokens // S)``).
        hidden: model width (``H = max(1, hidden // D)``).
    """
    out: list[AttentionShape] = []
    for mode in modes:
        for causal in causals:
            for head_dim in head_dims:
                heads = max(1, hidden // head_dim)
                for s in seqlens:
                    out.append(AttentionShape(batch=max(1, tokens // s), heads_q=heads, heads_kv=heads,
                                          head_dim=head_dim, seqlen_q=s, seqlen_k=s, causal=causal, mode=mode,
                                          dtype=dtype))
    return out


def cpu_grid(*, dtype: str, causals: Iterable[bool] = (False, True),
             modes: Iterable[Mode] = (Mode.FWD, Mode.FWD_BWD), seqlens: Iterable[int] = CPU_SEQLENS,
             head_dims: Iterable[int] = CPU_HEAD_DIMS) -> list[AttentionShape]:
    """The papers' grid shrunk for a CPU (``CPU_*`` constants): the whole path in seconds."""
    return paper_grid(dtype=dtype, causals=causals, modes=modes, seqlens=seqlens, head_dims=head_dims,
                      tokens=CPU_TOKENS, hidden=CPU_HIDDEN)


def model_shapes(
    *, batch: int | None, heads_q: int | None, heads_kv: int | None, head_dims: Iterable[int],
    seqlens: Iterable[int], seqlen_k: int | None, dtype: str, causals: Iterable[bool], modes: Iterable[Mode],
) -> list[AttentionShape]:
    """The user's own shape (``--shapes model``), one per head dim x seqlen x causal x mode.

    Raises:
        UsageError: a size is missing or not positive, or ``heads_q`` is not a multiple of ``heads_kv``.
    """
    head_dims, seqlens = tuple(head_dims), tuple(seqlens)
    missing = [name for name, value in (("--batch", batch), ("--heads", heads_q)) if value is None]
    missing += ["--head-dim"] if not head_dims else []
    missing += ["--seqlen"] if not seqlens else []
    if missing or batch is None or heads_q is None:
        raise UsageError(f"--shapes model needs {', '.join(missing)}",
                         hint="pass a Hugging Face config: attnforge bench --shapes model --model config.json; "
                              "or the sizes: --batch 2 --heads 32 --kv-heads 8 --head-dim 128 --seqlen 4096")
    hkv = heads_q if heads_kv is None else heads_kv
    check_positive([("--batch", batch), ("--heads", heads_q), ("--kv-heads", hkv), ("--seqlen-k", seqlen_k),
                    *(("--head-dim", d) for d in head_dims), *(("--seqlen", s) for s in seqlens)])
    if heads_q % hkv:
        raise UsageError(f"--heads {heads_q} is not a multiple of --kv-heads {hkv}",
                         hint="grouped-query attention shares each K/V head among heads/kv-heads query heads")
    return [
        AttentionShape(batch=batch, heads_q=heads_q, heads_kv=hkv, head_dim=d, seqlen_q=s,
                       seqlen_k=s if seqlen_k is None else seqlen_k, causal=causal, mode=mode, dtype=dtype)
        for mode in modes for causal in causals for d in head_dims for s in seqlens
    ]


def check_positive(sizes: Iterable[tuple[str, int | None]]) -> None:
    """Refuse a size the user gave (``("--batch", 0)``) that is not positive; None is "not given". 0 is refused
    like -5: no option reads 0 as "the default".

    Raises:
        UsageError: naming every such option with its value.
    """
    bad = [f"{flag} {value}" for flag, value in sizes if value is not None and value <= 0]
    if bad:
        raise UsageError(f"sizes must be positive: {', '.join(bad)}",
                         hint="give each size as a whole number of 1 or more, or leave the option out")
