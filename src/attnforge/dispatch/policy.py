"""The choice, as a pure function: which backends may serve a call, and in which order to try them.

A backend is *eligible* when its package loads, verify passed for it on this device, it supports the call
(its ``unsupported_reasons`` are empty) and it has not raised at run time in this process. Eligible backends
are ordered by the throughput bench measured for the call's *shape class* (highest TFLOP/s first); backends
without a measurement follow, by the catalog's ``priority``. PyTorch SDPA (unforced) closes every order: it
needs no verify record, and it moves up when bench measured it faster than the others for the shape class.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from attnforge.backends.adapter import AttentionCall, BackendAdapter
from attnforge.records import BenchRecord, VerifyRecord

FALLBACK = "sdpa"


def bucket(n: int) -> int:
    """The power of two a sequence length falls in: the smallest ``2**k >= n`` (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@dataclass(frozen=True, slots=True, kw_only=True)
class ShapeClass:
    """Calls whose speed ranking is taken to be the same: bench results transfer within a class.

    Attributes:
        dtype, head_dim, causal: as in the call.
        gqa: Hq != Hkv.
        seqlen_q_bucket, seqlen_k_bucket: Sq and Sk rounded up to a power of two.
        mode: ``"fwd"``, or ``"fwd+bwd"`` when an input requires grad (bench's ``mode``).
    """

    dtype: str
    head_dim: int
    causal: bool
    gqa: bool
    seqlen_q_bucket: int
    seqlen_k_bucket: int
    mode: str

    @classmethod
    def of_call(cls, call: AttentionCall) -> ShapeClass:
        return cls(dtype=call.dtype, head_dim=call.head_dim, causal=call.causal,
                   gqa=call.heads_q != call.heads_kv, seqlen_q_bucket=bucket(call.seqlen_q),
                   seqlen_k_bucket=bucket(call.seqlen_k), mode="fwd+bwd" if call.needs_grad else "fwd")

    @classmethod
    def of_record(cls, rec: BenchRecord) -> ShapeClass:
        return cls(dtype=rec.dtype, head_dim=rec.head_dim, causal=rec.causal, gqa=rec.heads != rec.kv_heads,
                   seqlen_q_bucket=bucket(rec.seqlen_q), seqlen_k_bucket=bucket(rec.seqlen_k), mode=rec.mode)

    def __str__(self) -> str:
        parts = [self.dtype, f"D={self.head_dim}", f"Sq<={self.seqlen_q_bucket}",
                 f"Sk<={self.seqlen_k_bucket}", self.mode]
        if self.causal:
            parts.append("causal")
        if self.gqa:
            parts.append("GQA")
        return " ".join(parts)


def measured_tflops(records: Iterable[BenchRecord], shape: ShapeClass) -> dict[str, float]:
    """Mean TFLOP/s per backend over the bench records of ``shape``.

    TFLOP/s rather than milliseconds, so rows of one class with different batch or head counts compare fairly.
    Records come oldest first; a later record of the same backend and exact shape replaces an earlier one.
    """
    latest: dict[tuple[object, ...], BenchRecord] = {}
    for rec in records:
        if ShapeClass.of_record(rec) == shape:
            latest[(rec.backend, rec.batch, rec.heads, rec.kv_heads, rec.seqlen_q, rec.seqlen_k)] = rec
    sums: dict[str, list[float]] = {}
    for rec in latest.values():
        sums.setdefault(rec.backend, []).append(rec.tflops)
    return {name: sum(values) / len(values) for name, values in sums.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """A backend that will not serve the call, and every reason why."""

    backend: str
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """The outcome of :func:`decide`.

    Attributes:
        order: backends to try, first choice first; always ends with ``"sdpa"`` unless SDPA itself is broken.
        basis: for each backend in ``order``, why it stands there ("412.0 TFLOP/s measured", "priority 25").
        rejected: every other backend with its reasons.
    """

    order: tuple[str, ...]
    basis: tuple[str, ...]
    rejected: tuple[Rejection, ...]


def decide(call: AttentionCall, adapters: Mapping[str, BackendAdapter], *, priorities: Mapping[str, int],
           verified: Mapping[str, VerifyRecord], tflops: Mapping[str, float],
           broken: Mapping[str, str]) -> Decision:
    """Order the backends that may serve ``call``; reject the rest with reasons. Pure but for ``load_error``,
    which each adapter computes once.

    Args:
        call: what is asked.
        adapters: candidate backends by id, not including the SDPA fallback.
        priorities: catalog priority per backend id (lower first); missing ids go last.
        verified: the newest verify record per backend id on this device.
        tflops: measured throughput per backend id for the call's shape class (may include ``"sdpa"``).
        broken: backends that raised at run time in this process, with the error.
    """
    eligible: list[str] = []
    rejected: list[Rejection] = []
    for name, adapter in adapters.items():
        reasons = _reasons(name, adapter, call, verified, broken)
        if reasons:
            rejected.append(Rejection(backend=name, reasons=tuple(reasons)))
        else:
            eligible.append(name)
    if FALLBACK in broken:
        rejected.append(Rejection(backend=FALLBACK, reasons=(f"raised at run time: {broken[FALLBACK]}",)))
    else:
        eligible.append(FALLBACK)

    def rank(name: str) -> tuple[int, float, int, str]:
        if name in tflops:
            return (0, -tflops[name], 0, name)
        if name == FALLBACK:
            return (2, 0.0, 0, name)
        return (1, 0.0, priorities.get(name, 1 << 30), name)

    order = tuple(sorted(eligible, key=rank))
    basis = tuple(_basis(name, tflops, priorities) for name in order)
    return Decision(order=order, basis=basis, rejected=tuple(rejected))


def _reasons(name: str, adapter: BackendAdapter, call: AttentionCall, verified: Mapping[str, VerifyRecord],
             broken: Mapping[str, str]) -> list[str]:
    reasons: list[str] = []
    if name in broken:
        reasons.append(f"raised at run time in this process: {broken[name]}")
    load_error = adapter.load_error()
    if load_error is not None:
        reasons.append(f"not usable: {load_error}")
    record = verified.get(name)
    if record is None:
        reasons.append(f"not verified on this device (run: attnforge verify {name})")
    elif not record.ok:
        reasons.append(f"verify failed: {record.summary}")
    reasons.extend(adapter.unsupported_reasons(call))
    return reasons


def _basis(name: str, tflops: Mapping[str, float], priorities: Mapping[str, int]) -> str:
    if name in tflops:
        return f"{tflops[name]:.1f} TFLOP/s measured for this shape class"
    if name == FALLBACK:
        return "fallback: PyTorch SDPA, always available"
    return f"verified, not measured for this shape class; catalog priority {priorities.get(name, '-')}"
