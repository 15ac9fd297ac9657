"""The shapes ``attnforge bench`` times: the FlashAttention papers' grid, a tiny CPU grid, the user's shape.

The papers' grid (FlashAttention-2 ``benchmarks/benchmark_flash_attention.py``, FlashAttention-2 paper §4.1,
FlashAttention-3 paper §4.1): 16k tokens per batch (``B = 16384 // S``), ``S`` from 512 to 16k, hidden size
2048 (``H = 2048 // D``: 32 heads of 64, 16 of 128), causal on and off, forward and forward + backward.
The H200 fixture (tests/fixtures/h200_bench_2026-11-21.json) is the ``D = 128`` column of that grid at
``S`` = 1k, 4k and 16k.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from attnforge.backends.adapter import AttentionCall
from attnforge.bench.flops import Mode, attention_flops
from attnforge.errors import UsageError

PAPER_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
PAPER_HEAD_DIMS = (64, 128)
PAPER_TOKENS = 16384
PAPER_HIDDEN = 2048
#: The CPU grid keeps the papers' structure at a size that runs in CI in seconds.
CPU_SEQLENS = (64, 128)
CPU_HEAD_DIMS = (32, 64)
CPU_TOKENS = 256
CPU_HIDDEN = 128


class ShapeSet(StrEnum):
    """``--shapes``: the device's default grid, the papers' full grid, or the user's model shape."""

    DEFAULT = "default"
    PAPER = "paper"
    MODEL = "model"


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchShape:
    """One timed problem: ``q [B, Hq, Sq, D]``, ``k, v [B, Hkv, Sk, D]``, dtype, causal, mode."""

    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    seqlen_q: int
    seqlen_k: int
    causal: bool
    mode: Mode
    dtype: str

    @property
    def flops(self) -> float:
        """FLOPs per call (:func:`attnforge.bench.flops.attention_flops`)."""
        return attention_flops(batch=self.batch, heads=self.heads, seqlen_q=self.seqlen_q,
                               seqlen_k=self.seqlen_k, head_dim=self.head_dim, causal=self.causal,
                               mode=self.mode)

    @property
    def label(self) -> str:
        """``"fwd causal D128 B4 H16 S4096"`` (``S4096x8192`` when Sq != Sk, ``H16/4`` with GQA)."""
        seq = f"S{self.seqlen_q}" if self.seqlen_q == self.seqlen_k else f"S{self.seqlen_q}x{self.seqlen_k}"
        heads = f"H{self.heads}" if self.heads == self.kv_heads else f"H{self.heads}/{self.kv_heads}"
        mask = "causal" if self.causal else "full"
        return f"{self.mode.value} {mask} D{self.head_dim} B{self.batch} {heads} {seq}"

    def call(self, *, device_type: str, compute_capability: tuple[int, int] | None,
             precision: str = "exact") -> AttentionCall:
        """The adapter-facing description (``needs_grad`` for fwd+bwd)."""
        return AttentionCall(
            device_type=device_type, compute_capability=compute_capability, dtype=self.dtype,
            batch=self.batch, heads_q=self.heads, heads_kv=self.kv_heads, seqlen_q=self.seqlen_q,
            seqlen_k=self.seqlen_k, head_dim=self.head_dim, causal=self.causal,
            needs_grad=self.mode is Mode.FWD_BWD, precision=precision,
        )


def paper_grid(
    *, dtype: str, causals: Iterable[bool] = (False, True), modes: Iterable[Mode] = (Mode.FWD, Mode.FWD_BWD),
    seqlens: Iterable[int] = PAPER_SEQLENS, head_dims: Iterable[int] = PAPER_HEAD_DIMS,
    tokens: int = PAPER_TOKENS, hidden: int = PAPER_HIDDEN,
) -> list[BenchShape]:
    """The FlashAttention papers' grid (module docstring), ordered mode > causal > head dim > seqlen.

    Args:
        dtype: ``"bfloat16"`` or ``"float16"`` (``"float32"`` for CPU runs).
        causals, modes, seqlens, head_dims: restrict the grid.
        tokens: tokens per batch (``B = max(1, tokens // S)``).
        hidden: model width (``H = max(1, hidden // D)``).
    """
    out: list[BenchShape] = []
    for mode in modes:
        for causal in causals:
            for head_dim in head_dims:
                heads = max(1, hidden // head_dim)
                for s in seqlens:
                    out.append(BenchShape(batch=max(1, tokens // s), heads=heads, kv_heads=heads,
                                          head_dim=head_dim, seqlen_q=s, seqlen_k=s, causal=causal, mode=mode,
                                          dtype=dtype))
    return out


def cpu_grid(*, dtype: str, causals: Iterable[bool] = (False, True),
             modes: Iterable[Mode] = (Mode.FWD, Mode.FWD_BWD), seqlens: Iterable[int] = CPU_SEQLENS,
             head_dims: Iterable[int] = CPU_HEAD_DIMS) -> list[BenchShape]:
    """The papers' grid shrunk for a CPU (``CPU_*`` constants): the whole path in seconds."""
    return paper_grid(dtype=dtype, causals=causals, modes=modes, seqlens=seqlens, head_dims=head_dims,
                      tokens=CPU_TOKENS, hidden=CPU_HIDDEN)


def model_shapes(
    *, batch: int | None, heads: int | None, kv_heads: int | None, head_dims: Iterable[int],
    seqlens: Iterable[int], seqlen_k: int | None, dtype: str, causals: Iterable[bool], modes: Iterable[Mode],
) -> list[BenchShape]:
    """The user's own shape (``--shapes model``), one per head dim x seqlen x causal x mode.

    Raises:
        UsageError: a size is missing or not positive, or ``heads`` is not a multiple of ``kv_heads``.
    """
    head_dims, seqlens = tuple(head_dims), tuple(seqlens)
    missing = [name for name, value in (("--batch", batch), ("--heads", heads)) if value is None]
    missing += ["--head-dim"] if not head_dims else []
    missing += ["--seqlen"] if not seqlens else []
    if missing or batch is None or heads is None:
        raise UsageError(f"--shapes model needs {', '.join(missing)}",
                         hint="e.g. attnforge bench --shapes model --batch 2 --heads 32 --kv-heads 8 "
                              "--head-dim 128 --seqlen 4096")
    hkv = heads if kv_heads is None else kv_heads
    sizes = {"--batch": batch, "--heads": heads, "--kv-heads": hkv, "--seqlen-k": seqlen_k or 1,
             **{f"--head-dim {d}": d for d in head_dims}, **{f"--seqlen {s}": s for s in seqlens}}
    bad = [name for name, value in sizes.items() if value <= 0]
    if bad:
        raise UsageError(f"sizes must be positive: {', '.join(bad)}")
    if heads % hkv:
        raise UsageError(f"--heads {heads} is not a multiple of --kv-heads {hkv}",
                         hint="grouped-query attention shares each K/V head among heads/kv-heads query heads")
    return [
        BenchShape(batch=batch, heads=heads, kv_heads=hkv, head_dim=d, seqlen_q=s, seqlen_k=seqlen_k or s,
                   causal=causal, mode=mode, dtype=dtype)
        for mode in modes for causal in causals for d in head_dims for s in seqlens
    ]
