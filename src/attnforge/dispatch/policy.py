"""The choice, as a pure function: which backends may serve a call, and in which order to try them.

A backend is *eligible* when its package loads, verify passed for it on this device, it supports the call
(its ``unsupported_reasons`` are empty) and it has not raised at run time in this process. Eligible backends
that bench or measure-on-first-use measured for the call's *shape class* are ordered by the one "fastest" rule
(:mod:`attnforge.ranking`: median TFLOP/s, a lead within the noise margin is a tie and goes to the
lower-overhead path, so plain SDPA stays unless a candidate is faster beyond the noise). A backend without a
measurement never precedes plain SDPA ("never slower than doing nothing", issue 16), with one exception: in a
class that was not measured at all, the backend that beat plain SDPA beyond the noise in *both* measured classes
that bracket it (the same
family at the nearest shorter and longer lengths, :func:`attnforge.ranking.bracketing`) leads. The rest follow
SDPA by the catalog's ``priority`` (they serve a call only where SDPA cannot: a feature it lacks, or when it
raised). PyTorch SDPA (unforced) needs no verify record.

A quantized backend (SageAttention) is eligible only under ``precision="allow_quantized"`` *and* where it was
measured faster beyond the noise than the exact route that would serve the call without it (the winner of the
exact backends' ranking) *and* its recorded error on the class stays
within :func:`quantized_gate` (``[gate.quantized]`` in ``catalog/data/tolerances.toml``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from attnforge.backends.adapter import AttentionCall, BackendAdapter, required_features, supported_features
from attnforge.ranking import (
    PLAIN_SDPA,
    Bracket,
    Evidence,
    Measurement,
    Ranking,
    beats,
    bracketing,
    class_measurements,
    rank,
    tie_margin,
)
from attnforge.records import BenchRecord, VerifyRecord
from attnforge.types.shapes import AttentionShape, Feature, Layout, Mode, ShapeClass

if TYPE_CHECKING:
    from attnforge.catalog.tolerances import DispatchGate

FALLBACK = PLAIN_SDPA


def shape_of_call(call: AttentionCall) -> AttentionShape:
    """The :class:`AttentionShape` of ``call`` (its features, ``Dv`` and memory layout; sizes as bhsd)."""
    return AttentionShape(batch=call.batch, heads_q=call.heads_q, heads_kv=call.heads_kv, head_dim=call.head_dim,
                           seqlen_q=call.seqlen_q, seqlen_k=call.seqlen_k, causal=call.causal,
                           mode=Mode.FWD_BWD if call.needs_grad else Mode.FWD, dtype=call.dtype,
                           head_dim_v=call.head_dim_v, layout=Layout(call.layout),
                           features=frozenset(Feature(f) for f in call.features))


def class_of_call(call: AttentionCall) -> ShapeClass:
    """The shape class of ``call``: the key bench records are matched on."""
    return shape_of_call(call).shape_class


def measurements(records: Iterable[BenchRecord], shape_class: ShapeClass, layout: str = Layout.BHSD.value,
                 quantized: Collection[str] = ()) -> Evidence:
    """Per backend, what bench (or measure-on-first-use) stored for ``shape_class`` in the memory ``layout`` of
    the call (:func:`attnforge.dispatch.inputs.memory_layout`); when nothing was stored in that layout, what was
    stored in the other (``evidence.layout`` says which; a kernel's speed depends on the layout: on an H200,
    2026-11-29, FA3 ran MHA 1k fwd+bwd at 0.960x SDPA on ``[B, H, S, D]`` tensors and 1.080x on ``[B, S, H, D]``,
    and one decision served both); when nothing was stored for the class, the measured classes that bracket it
    (``bracket``, :func:`attnforge.ranking.bracketing`). ``quantized``: the backends that quantize Q/K/V (a live
    check supersedes only its own side's records: :func:`attnforge.ranking.class_measurements`)."""
    records = list(records)
    own = [r for r in records if r.layout == layout]
    evidence = Evidence(class_measurements(own, shape_class, quantized=quantized))
    if evidence:
        evidence.layout = layout
        return evidence
    if len(own) < len(records):  # none in the call's layout: what the other one says (all the class's records)
        evidence = Evidence(class_measurements(records, shape_class, quantized=quantized))
        if evidence:
            evidence.layout = next(r.layout for r in records if r.layout != layout)
            return evidence
    evidence.bracket = bracketing(records, shape_class)
    return evidence


def quantized_gate() -> DispatchGate:
    """The error a quantized backend may show on a shape class (vs float32) to be dispatched there:
    ``[gate.quantized]`` of the packaged ``catalog/data/tolerances.toml``, with its sources.

    Raises:
        CatalogError: the packaged file has no such table.
    """
    from attnforge.catalog.tolerances import load_quantized_gate
    from attnforge.errors import CatalogError

    gate = load_quantized_gate()
    if gate is None:
        raise CatalogError("tolerances.toml has no [gate.quantized]",
                           hint="restore the packaged catalog/data/tolerances.toml")
    return gate


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
        ranking: the "fastest" rule over the eligible measured backends (None when none was measured).
        exact: the exact math's measurement on the class, where SDPA lacks a feature of the call and the exact
            math was measured (the baseline of such calls, :func:`attnforge.dispatch.features.close_with_fallback`).
        layout: the memory layout the ranking's measurements were taken in (None: no ranking, or records of both
            layouts); another than the call's when the class was measured only in the other one.
    """

    order: tuple[str, ...]
    basis: tuple[str, ...]
    rejected: tuple[Rejection, ...]
    ranking: Ranking | None = None
    exact: Measurement | None = None
    layout: str | None = None


def decide(call: AttentionCall, adapters: Mapping[str, BackendAdapter], *, priorities: Mapping[str, int],
           verified: Mapping[str, VerifyRecord], measured: Mapping[str, Measurement],
           broken: Mapping[str, str], gate: DispatchGate | None = None) -> Decision:
    """Order the backends that may serve ``call``; reject the rest with reasons. Pure but for ``load_error``,
    which each adapter computes once.

    Args:
        call: what is asked.
        adapters: candidate backends by id, not including the SDPA fallback; their capabilities are dispatch's.
        priorities: catalog priority per backend id (lower first); missing ids go last.
        verified: the newest verify record per backend id on this device.
        measured: per backend id, the measurement of the call's shape class (may include ``"sdpa"``); an
            :class:`~attnforge.ranking.Evidence` also names the backends that never beat plain SDPA where both
            were measured: where unmeasured, they follow SDPA instead of preceding it.
        broken: backends that raised at run time in this process, with the error.
        gate: the error bound for quantized backends (:func:`quantized_gate` when None and one is asked).
    """
    eligible: list[str] = []
    rejected: list[Rejection] = []
    gated: list[str] = []  # quantized backends: eligible only past the gate, against the exact route that would serve
    for name, adapter in adapters.items():
        reasons = _reasons(name, adapter, call, verified, broken)
        if reasons:
            rejected.append(Rejection(backend=name, reasons=tuple(reasons)))
        elif quantizes(adapter):
            gated.append(name)
        else:
            eligible.append(name)
    if FALLBACK in broken:
        rejected.append(Rejection(backend=FALLBACK, reasons=(f"raised at run time: {broken[FALLBACK]}",)))
    else:
        eligible.append(FALLBACK)
    ranking = rank(measured[n] for n in eligible if n in measured)
    admitted = []
    for name in gated:  # against the exact route that would serve: the exact ranking's winner
        reasons = _gate_reasons(name, measured, gate or quantized_gate(),
                                against=ranking.measurements.get(ranking.winner) if ranking.winner else None)
        if reasons:
            rejected.append(Rejection(backend=name, reasons=tuple(reasons)))
        else:
            admitted.append(name)
    if admitted:
        eligible.extend(admitted)
        ranking = rank(measured[n] for n in eligible if n in measured)
    bracket: tuple[Bracket, Bracket] | None = getattr(measured, "bracket", None)
    lead = _interpolated(eligible, bracket) if not ranking.order else None
    unmeasured = sorted((n for n in eligible if n not in ranking.measurements and n not in (FALLBACK, lead)),
                        key=lambda n: (priorities.get(n, 1 << 30), n))
    order = (*ranking.order, *((lead,) if lead else ()))
    if FALLBACK in eligible and FALLBACK not in order:
        order = (*order, FALLBACK)
    order = (*order, *unmeasured)
    compiling = frozenset(n for n in unmeasured if compiles_per_variant(adapters[n]))
    basis = tuple(_basis(name, ranking, priorities, lead, bracket, compiling=compiling) for name in order)
    layout = getattr(measured, "layout", None) if ranking.order else None
    if layout is not None and layout != call.layout:
        seen = f"; measured on {_LAYOUT_WORDS[layout]} tensors, none on this call's {_LAYOUT_WORDS[call.layout]}"
        basis = tuple(b + seen if n in ranking.measurements else b for n, b in zip(order, basis, strict=True))
    return Decision(order=order, basis=basis, rejected=tuple(rejected), ranking=ranking if ranking.order else None,
                    layout=layout)


#: a memory layout in words, for explain()'s lines
_LAYOUT_WORDS = {Layout.BHSD.value: "[B, H, S, D]", Layout.BSHD.value: "[B, S, H, D]"}


def _interpolated(eligible: list[str], bracket: tuple[Bracket, Bracket] | None) -> str | None:
    """The eligible backend that beat plain SDPA in both bracketing classes (ranked among the eligible ones),
    or None."""
    if bracket is None or FALLBACK not in eligible:
        return None
    winners: set[str | None] = set()
    for side in bracket:
        ranking = rank(side.measurements[n] for n in eligible if n in side.measurements)
        if FALLBACK not in ranking.measurements:
            return None  # no evidence against doing nothing on this side
        winners.add(ranking.winner)
    winner = winners.pop() if len(winners) == 1 else None
    return winner if winner != FALLBACK else None


def quantizes(adapter: BackendAdapter) -> bool:
    """Whether the adapter's kernel quantizes Q/K/V (``caps.quantized``; an adapter without capabilities: no)."""
    return bool(getattr(getattr(adapter, "caps", None), "quantized", False))


def compiles_per_variant(adapter: BackendAdapter) -> bool:
    """Whether the adapter's kernel compiles on its first call per variant (``caps.jit_per_variant``: seconds each,
    so measure-on-first-use leaves it out, :func:`attnforge.dispatch.autotune.compiled_on_call`)."""
    return bool(getattr(getattr(adapter, "caps", None), "jit_per_variant", False))


def _gate_reasons(name: str, measured: Mapping[str, Measurement], gate: DispatchGate, *,
                  against: Measurement | None) -> list[str]:
    """Why a quantized backend may not serve this class: not measured, too inaccurate, or not faster beyond the
    noise than ``against``, the exact route that would serve it (the winner of the exact backends' ranking; None:
    none measured). Against the winner, not every exact backend: on an H200 (2026-12-02, docs/benchmarks.md
    "thirty-ninth session") the 16k forward's exact class went to SDPA after FlashAttention-3 tied with it, and
    SageAttention, 14.6 % faster than SDPA beyond the noise, was refused for not beating FlashAttention-3's
    tied timing: the ``allow_quantized`` calls ran SDPA, the slowest of the three."""
    m = measured.get(name)
    if m is None:
        return ["quantized: not measured for this shape class (run: attnforge bench on your shapes)"]
    reasons = []
    error = m.error
    if error is None:
        reasons.append("quantized: its error on this shape class was not measured")
    elif error.rel_l1 > gate.max_rel_l1 or error.cosine < gate.min_cosine:
        reasons.append(f"quantized: error on this shape class rel L1 {error.rel_l1:.3g} / cosine {error.cosine:.5f} is "
                       f"outside rel L1 <= {gate.max_rel_l1:g}, cosine >= {gate.min_cosine:g}")
    unbeaten = against if against is not None and not beats(m, against) else None
    if unbeaten is not None:
        reasons.append(f"quantized: not faster than {unbeaten.backend} beyond the noise "
                       f"({m.tflops:.1f} vs {unbeaten.tflops:.1f} TFLOP/s, a lead of more than "
                       f"{tie_margin(m, unbeaten):.1%} needed, or every round faster than its fastest: rounds apart)")
    return reasons
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


def _basis(name: str, ranking: Ranking, priorities: Mapping[str, int], lead: str | None,
           bracket: tuple[Bracket, Bracket] | None, *, compiling: frozenset[str] = frozenset()) -> str:
    if name in ranking.measurements:
        return ranking.basis(name)
    if name == lead and bracket is not None:
        shorter, longer = (str(side.shape_class) for side in bracket)
        return (f"not measured for this shape class; fastest beyond plain SDPA's noise in both measured classes"
                f" around it ({shorter}; {longer})")
    if name == FALLBACK:
        return "fallback: PyTorch SDPA, always available; unmeasured backends do not precede it"
    line = f"verified, not measured for this shape class; after SDPA, catalog priority {priorities.get(name, '-')}"
    if name in compiling:  # measure-on-first-use leaves it out (autotune.compiled_on_call)
        line += ("; compiles a kernel per variant on its first call (seconds), so first use does not time it"
                 " (run: attnforge warmup, or attnforge bench)")
    return line


def forced_decision(call: AttentionCall, name: str, adapter: BackendAdapter) -> Decision:
    """The decision for a call forced onto backend ``name`` (``adapter``): that backend alone, or nothing with
    every reason it cannot serve the call (it does not load, does not support the call or a feature it uses)."""
    reasons = [f"not usable: {err}"] if (err := adapter.load_error()) else []
    reasons += adapter.unsupported_reasons(call)
    missing = required_features(call) - supported_features(adapter)
    if missing and not any(r.startswith("does not support") for r in reasons):
        reasons.append(f"does not support {', '.join(sorted(missing))}")
    if reasons:
        return Decision(order=(), basis=(), rejected=(Rejection(backend=name, reasons=tuple(reasons)),))
    return Decision(order=(name,), basis=("forced",), rejected=())


def failure_class(call: AttentionCall | None) -> str:
    """The shape class a call's exact shapes are counted under (its features aside: a class with many shapes is
    dynamic); ``"empty"`` for a zero-sized call."""
    if call is None:
        return "empty"
    return str(class_of_call(replace(call, features=frozenset(), head_dim_v=None, top_left=False,
                                     precision="exact")))
