"""How many floating-point operations one attention call counts as, so TFLOP/s compare across backends.

The convention is the FlashAttention papers' (and that of tests/fixtures/h200_bench_2026-11-21.json):

* forward: ``4 * B * Hq * Sq * Sk * D``: two matmuls (``Q K^T`` and ``P V``), each ``2 * Sq * Sk * D``
  multiply-adds per head; softmax and scaling are not counted.
* causal: only the unmasked (query, key) pairs count. When ``Sq == Sk`` that is taken as exactly half of
  ``Sq * Sk`` (the papers' convention, which ignores the diagonal's ``S / 2`` extra pairs); when ``Sq != Sk``
  the exact count of pairs the bottom-right aligned mask keeps (query ``i`` sees keys ``j <= i + Sk - Sq``).
* forward + backward: ``3.5 *`` forward, i.e. the backward pass counts ``2.5 *`` forward (five matmuls
  instead of two).

Sources: Dao-AILab/flash-attention ``benchmarks/benchmark_flash_attention.py`` (``flops``: ``4 * batch *
seqlen**2 * nheads * headdim // (2 if causal else 1)``, backward ``2.5 *`` forward); FlashAttention-2 paper
(arXiv 2307.08691) §4.1; the H200 fixture's ``flops`` field.
"""

from __future__ import annotations

from attnforge.types.shapes import AttentionShape, Mode

#: The formula in one line, quoted in every table, JSON document and plot.
FORMULA = ("fwd = 4*B*Hq*Sq*Sk*D, halved when causal (exact unmasked pairs when Sq != Sk); "
           "fwd+bwd = 3.5 * fwd (bwd = 2.5 * fwd)")
#: Backward counts this many times the forward FLOPs.
BACKWARD_FACTOR = 2.5




def causal_pairs(seqlen_q: int, seqlen_k: int) -> int:
    """The number of (query, key) pairs a bottom-right aligned causal mask keeps.

    Query ``i`` (``0 <= i < Sq``) sees keys ``0 .. i + Sk - Sq``; rows with no key count 0.

    Raises:
        ValueError: a negative length.
    """
    if seqlen_q < 0 or seqlen_k < 0:
        raise ValueError(f"sequence lengths must be >= 0, got Sq={seqlen_q}, Sk={seqlen_k}")
    offset = seqlen_k - seqlen_q
    # Rows i < -offset see no key; row i >= that sees i + offset + 1 keys (the last row sees all Sk).
    first = min(seqlen_q, max(0, -offset))
    n = seqlen_q - first
    return n * (first + offset + 1) + n * (n - 1) // 2


def attended_pairs(seqlen_q: int, seqlen_k: int, *, causal: bool) -> float:
    """``Sq * Sk``; with causal, half of it when ``Sq == Sk`` and :func:`causal_pairs` otherwise."""
    if not causal:
        return float(seqlen_q * seqlen_k)
    if seqlen_q == seqlen_k:
        return seqlen_q * seqlen_k / 2
    return float(causal_pairs(seqlen_q, seqlen_k))


def attention_flops(*, batch: int, heads_q: int, seqlen_q: int, seqlen_k: int, head_dim: int, causal: bool,
                    mode: Mode) -> float:
    """FLOPs one call counts as (see the module docstring for the convention and its sources).

    Args:
        batch, heads_q, seqlen_q, seqlen_k, head_dim: ``B, Hq, Sq, Sk, D`` (``Hkv`` does not change the count).
        causal: bottom-right aligned causal mask.
        mode: forward only, or forward and backward.

    Returns:
        The FLOP count (a float: counts reach 10^13).
    """
    fwd = 4.0 * batch * heads_q * head_dim * attended_pairs(seqlen_q, seqlen_k, causal=causal)
    return fwd if mode is Mode.FWD else fwd * (1.0 + BACKWARD_FACTOR)


def tflops(flops: float, duration_ms: float) -> float:
    """TFLOP/s of ``flops`` done in ``duration_ms`` milliseconds (0 for a non-positive duration)."""
    return flops / (duration_ms * 1e-3) / 1e12 if duration_ms > 0 else 0.0


def shape_flops(shape: AttentionShape) -> float:
    """FLOPs of one call of ``shape`` (:func:`attention_flops`)."""
    return attention_flops(batch=shape.batch, heads_q=shape.heads_q, seqlen_q=shape.seqlen_q,
                           seqlen_k=shape.seqlen_k, head_dim=shape.head_dim, causal=shape.causal,
                           mode=shape.mode)
