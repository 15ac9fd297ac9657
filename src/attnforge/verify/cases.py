"""The random shapes a backend is verified on: dtypes x head dims x causal, with GQA and Sq != Sk mixed in.

The matrix is generated from what the backend claims (its catalog dtypes and largest head dim) with a seeded
``random.Random``, as xformers generates its test matrix from each op's declared capabilities.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from attnforge.backends.adapter import ROUTING_ONLY, AttentionCall
from attnforge.types.shapes import Dims

#: dtypes verified per device when the backend claims them: fp16/bf16 on CUDA (what the kernels are for);
#: float32/bfloat16 on CPU (what CPU paths such as SDPA math compute in).
DEVICE_DTYPES: dict[str, tuple[str, ...]] = {
    "cuda": ("float16", "bfloat16"),
    "cpu": ("float32", "bfloat16"),
}
#: head dims tried, capped by the backend's ``max_head_dim``; CPU stays small so verify takes seconds.
DEVICE_HEAD_DIMS: dict[str, tuple[int, ...]] = {
    "cuda": (64, 96, 128, 256),
    "cpu": (32, 64, 128),
}
#: the largest sequence length drawn per device.
DEVICE_MAX_SEQLEN: dict[str, int] = {"cuda": 1024, "cpu": 160}


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyCase(Dims):
    """One random attention problem: sizes ``B, Hq, Hkv, Sq, Sk, D`` (:class:`~attnforge.types.shapes.Dims`),
    dtype, causal and the input seed."""

    dtype: str
    causal: bool
    seed: int
    feature: str | None = None
    head_dim_v: int | None = None

    def call(self, *, device_type: str, compute_capability: tuple[int, int] | None,
             precision: str = "exact") -> AttentionCall:
        """The adapter-facing description of this case (forward only)."""
        return AttentionCall(
            device_type=device_type, compute_capability=compute_capability, dtype=self.dtype,
            batch=self.batch, heads_q=self.heads_q, heads_kv=self.heads_kv, seqlen_q=self.seqlen_q,
            seqlen_k=self.seqlen_k,
            head_dim=self.head_dim, causal=self.causal, needs_grad=False, precision=precision,
            features=frozenset((self.feature,)) - ROUTING_ONLY if self.feature else frozenset(),
            head_dim_v=self.head_dim_v, top_left=self.feature == "causal_top_left",
        )

    @property
    def label(self) -> str:
        """``"bfloat16 causal B2 H8/2 S100x130 D64 +window"``: short enough for a table cell."""
        mask = "causal" if self.causal else "full"
        dims = f"D{self.head_dim}" + (f"/{self.head_dim_v}" if self.head_dim_v else "")
        extra = f" +{self.feature}" if self.feature else ""
        return (f"{self.dtype} {mask} B{self.batch} H{self.heads_q}/{self.heads_kv} "
                f"S{self.seqlen_q}x{self.seqlen_k} {dims}{extra}")


def generate_cases(
    *, dtypes: tuple[str, ...], head_dims: tuple[int, ...], max_seqlen: int, seed: int = 0,
) -> list[VerifyCase]:
    """Every dtype x head dim x causal combination, each with random sizes.

    Per combination one self-attention case (Sq == Sk, the shape of training) and one cross-shaped case
    (Sq != Sk, with GQA) so the bottom-right causal alignment and the head grouping are both exercised.
    Sequence lengths are not multiples of the kernels' block sizes on purpose (tails are where bugs live).

    Args:
        dtypes: dtype names (``"bfloat16"``).
        head_dims: head dims ``D`` to try.
        max_seqlen: the largest ``Sq``/``Sk`` drawn (at least 8).
        seed: seeds both the sizes and, through each case's ``seed``, its inputs.

    Returns:
        The cases, in a stable order for a given seed.
    """
    rng = random.Random(seed)  # noqa: S311 - test shapes, not secrets
    top = max(8, max_seqlen)
    cases: list[VerifyCase] = []
    for dtype in dtypes:
        for head_dim in head_dims:
            for causal in (False, True):
                s = rng.randint(top // 4, top)
                heads = rng.choice((1, 2, 4))
                cases.append(VerifyCase(batch=rng.randint(1, 2), heads_q=heads, heads_kv=heads, seqlen_q=s,
                                        seqlen_k=s, head_dim=head_dim, dtype=dtype, causal=causal,
                                        seed=rng.randrange(2**31)))
                group, heads_kv = rng.choice((2, 4)), rng.choice((1, 2))
                sq, sk = rng.randint(1, top), rng.randint(1, top)
                while sk == sq:
                    sk = rng.randint(1, top)
                cases.append(VerifyCase(batch=rng.randint(1, 2), heads_q=heads_kv * group, heads_kv=heads_kv,
                                        seqlen_q=sq, seqlen_k=sk, head_dim=head_dim, dtype=dtype,
                                        causal=causal, seed=rng.randrange(2**31)))
    return cases


def feature_cases(
    features: frozenset[str], *, dtypes: tuple[str, ...], head_dims: tuple[int, ...], max_seqlen: int,
    seed: int = 0, mask_max_seqlen_q: int = 0,
) -> list[VerifyCase]:
    """Per claimed feature and dtype, one random case that uses it (GQA, Sq != Sk, causal where it matters).

    The feature's inputs (mask, window, softcap, sinks, packed sequences) are drawn from the case's seed by
    :func:`attnforge.verify.feature_inputs.case_inputs`. ``mask_max_seqlen_q`` (the backend's capability: a mask
    only on a decode step): the mask case is then a decode step (Sq 1, three batch rows) under a padding mask.
    """
    rng = random.Random(seed ^ 0x5EED)  # noqa: S311 - test shapes, not secrets
    top = max(8, max_seqlen)
    cases: list[VerifyCase] = []
    if not head_dims:
        return cases
    for feature in sorted(features):
        for dtype in dtypes:
            head_dim = head_dims[min(1, len(head_dims) - 1)]
            heads_kv, group = rng.choice((1, 2)), rng.choice((1, 2))
            sq = rng.randint(2, top)
            sk = sq if feature == "varlen" else rng.randint(sq, top + 8)
            causal = feature in ("causal_top_left", "window", "varlen") or rng.random() < 0.5
            batch = 3 if feature == "varlen" else rng.randint(1, 2)
            if feature == "mask" and 0 < mask_max_seqlen_q < sq:
                sq, batch = 1, 3  # a decode step's padding mask (feature_inputs.case_inputs draws it)
            cases.append(VerifyCase(
                batch=batch, heads_q=heads_kv * group, heads_kv=heads_kv,
                seqlen_q=sq, seqlen_k=sk + (feature == "causal_top_left"), head_dim=head_dim, dtype=dtype,
                causal=causal, seed=rng.randrange(2**31), feature=feature,
                head_dim_v=head_dim // 2 if feature == "dv" else None))
    return cases


def claimed_matrix(
    *, device_type: str, backend_dtypes: tuple[str, ...], max_head_dim: int,
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The dtypes and head dims to verify for a backend that claims ``backend_dtypes`` and ``max_head_dim``.

    Returns:
        ``(dtypes, head_dims)``; either may be empty when the backend claims nothing usable on this device.
    """
    dtypes = tuple(d for d in DEVICE_DTYPES.get(device_type, ()) if d in backend_dtypes)
    head_dims = tuple(d for d in DEVICE_HEAD_DIMS.get(device_type, ()) if d <= max_head_dim)
    return dtypes, head_dims
