"""The attention shape and its shape class, declared once for bench, dispatch, records and doctor.

Letters: ``B`` batch, ``Hq``/``Hkv`` query and key/value heads (GQA when they differ, ``Hq % Hkv == 0``),
``Sq``/``Sk`` query and key lengths, ``D`` the query/key head dim, ``Dv`` the value head dim.

A *shape class* groups calls whose backend ranking is taken to be the same, so a measurement of one shape
transfers to the others of its class: dtype, mode, causal, ``D``/``Dv``, the GQA ratio ``Hq / Hkv``, ``Sq``
and ``Sk`` rounded up to a power of two (``Sq == 1`` is decode, ``Sq < Sk`` chunked prefill) and the
features the call uses (issue 16: mask, window, softcap, sinks, varlen, dropout, lse). Batch and head count
are not in the class: TFLOP/s compares across them. The class has one constructor (:meth:`ShapeClass.of`)
and a string form that :meth:`ShapeClass.parse` reads back.

A leaf module: no torch, nothing from attnforge.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from attnforge._compat import StrEnum

DTYPES = ("float16", "bfloat16", "float32", "float64")


class Mode(StrEnum):
    """What one call runs: forward only, or forward and backward (an input requires grad)."""

    FWD = "fwd"
    FWD_BWD = "fwd+bwd"


class Layout(StrEnum):
    """How q/k/v are laid out: ``[B, H, S, D]`` or ``[B, S, H, D]``."""

    BHSD = "bhsd"
    BSHD = "bshd"


class Feature(StrEnum):
    """Features of a call beyond plain (causal) attention; a backend must support each one it is given.

    The runtime's names (:data:`attnforge.backends.adapter.FEATURES`); ``dv`` and ``causal_top_left`` are not
    here: Dv is its own field of the shape, and the alignment does not change which backend is fastest.
    """

    MASK = "mask"  # attn_mask, bool or additive
    WINDOW = "window"  # sliding window (left, right)
    SOFTCAP = "softcap"  # logit softcap
    SINKS = "sinks"  # attention sinks (GPT-OSS s_aux)
    VARLEN = "varlen"  # packed sequences with cu_seqlens
    DROPOUT = "dropout"  # dropout_p > 0
    LSE = "lse"  # return_lse
    PAGED = "paged"  # paged KV cache


def bucket(n: int) -> int:
    """The power of two a sequence length falls in: the smallest ``2**k >= n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _features(values: Iterable[str | Feature]) -> frozenset[Feature]:
    return frozenset(Feature(v) for v in values)


@dataclass(frozen=True, slots=True, kw_only=True)
class Dims:
    """The sizes of an attention call, declared once for the shape and for a bench record that stores one.

    Attributes:
        batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim: ``B, Hq, Hkv, Sq, Sk, D`` (the names of
            :class:`attnforge.backends.adapter.AttentionCall`).
    """

    batch: int
    heads_q: int
    heads_kv: int
    head_dim: int
    seqlen_q: int
    seqlen_k: int


#: The head counts' names before issue 23 (bench --json schema 1-2, verify --json schema 1, records.db columns).
LEGACY_HEAD_KEYS: dict[str, str] = {"heads": "heads_q", "kv_heads": "heads_kv"}


def current_head_keys(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a recorded shape or case mapping with the head counts under :class:`Dims`' names.

    The one reader-side step for stored JSON (``bench --json`` rows' ``shape``, ``verify --json`` cases,
    ``docs/data`` and ``tests/fixtures``): ``heads``/``kv_heads`` become ``heads_q``/``heads_kv``; a mapping
    already in the new names comes back unchanged; other keys are kept as they are.

    Raises:
        ValueError: the mapping gives a head count under both its old and its new name.
    """
    out = dict(doc)
    for old, new in LEGACY_HEAD_KEYS.items():
        if old in out:
            if new in out:
                raise ValueError(f"both {old!r} and {new!r} in {dict(doc)!r}: one spelling per document")
            out[new] = out.pop(old)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionShape(Dims):
    """One attention problem: ``q [B, Hq, Sq, D]``, ``k [B, Hkv, Sk, D]``, ``v [B, Hkv, Sk, Dv]``.

    Attributes:
        batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim: ``B, Hq, Hkv, Sq, Sk, D`` (:class:`Dims`).
        head_dim_v: ``Dv``; None means ``D``.
        dtype: ``"bfloat16"`` (one of :data:`DTYPES`).
        causal: causal mask, bottom-right aligned when ``Sq != Sk``.
        mode: forward, or forward and backward.
        layout: how the caller lays q/k/v out.
        features: the call's features beyond plain attention.
    """

    causal: bool
    mode: Mode
    dtype: str
    head_dim_v: int | None = None
    layout: Layout = Layout.BHSD
    features: frozenset[Feature] = field(default_factory=frozenset)

    @property
    def dv(self) -> int:
        """``Dv`` (``D`` when not given)."""
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def label(self) -> str:
        """``"fwd causal D128 B4 H16 S4096"`` (``S512x4096`` when Sq != Sk, ``H32/8`` with GQA)."""
        seq = f"S{self.seqlen_q}" if self.seqlen_q == self.seqlen_k else f"S{self.seqlen_q}x{self.seqlen_k}"
        heads = f"H{self.heads_q}" if self.heads_q == self.heads_kv else f"H{self.heads_q}/{self.heads_kv}"
        dims = f"D{self.head_dim}" if self.dv == self.head_dim else f"D{self.head_dim}/{self.dv}"
        extra = "".join(f" +{f.value}" for f in sorted(self.features))
        return f"{self.mode.value} {'causal' if self.causal else 'full'} {dims} B{self.batch} {heads} {seq}{extra}"

    @property
    def shape_class(self) -> ShapeClass:
        return ShapeClass.of(self)


_CLASS_RE = re.compile(
    r"(?P<dtype>\w+) (?P<mode>fwd\+bwd|fwd) (?P<mask>causal|full) D(?P<d>\d+)(?:/(?P<dv>\d+))?"
    r" gqa(?P<gqa>\d+) Sq(?P<sq>\d+) Sk(?P<sk>\d+)(?P<features>(?: \+[a-z_]+)*)")


@dataclass(frozen=True, slots=True, kw_only=True)
class ShapeClass:
    """Calls whose backend ranking is taken to be the same (see the module docstring).

    String form (:meth:`parse` reads it back): ``"bfloat16 fwd+bwd causal D128 gqa4 Sq512 Sk4096 +window"``;
    ``D192/128`` when ``Dv != D``; ``Sq``/``Sk`` are the power-of-two buckets.
    """

    dtype: str
    mode: Mode
    causal: bool
    head_dim: int
    head_dim_v: int
    gqa_ratio: int
    seqlen_q_bucket: int
    seqlen_k_bucket: int
    features: frozenset[Feature] = field(default_factory=frozenset)

    @classmethod
    def of(cls, shape: AttentionShape) -> ShapeClass:
        """The class of one shape: the only constructor code outside tests should use."""
        return cls(dtype=shape.dtype, mode=shape.mode, causal=shape.causal, head_dim=shape.head_dim,
                   head_dim_v=shape.dv, gqa_ratio=max(1, shape.heads_q // max(1, shape.heads_kv)),
                   seqlen_q_bucket=bucket(shape.seqlen_q), seqlen_k_bucket=bucket(shape.seqlen_k),
                   features=_features(shape.features))

    @property
    def kind(self) -> str:
        """``"decode"`` (Sq = 1), ``"chunked-prefill"`` (Sq < Sk), ``"prefill"`` (Sq = Sk) or ``"cross"``."""
        if self.seqlen_q_bucket == 1:
            return "decode"
        if self.seqlen_q_bucket < self.seqlen_k_bucket:
            return "chunked-prefill"
        return "prefill" if self.seqlen_q_bucket == self.seqlen_k_bucket else "cross"

    def __str__(self) -> str:
        dims = f"D{self.head_dim}" if self.head_dim_v == self.head_dim else f"D{self.head_dim}/{self.head_dim_v}"
        extra = "".join(f" +{f.value}" for f in sorted(self.features))
        return (f"{self.dtype} {self.mode.value} {'causal' if self.causal else 'full'} {dims} gqa{self.gqa_ratio}"
                f" Sq{self.seqlen_q_bucket} Sk{self.seqlen_k_bucket}{extra}")

    @classmethod
    def parse(cls, text: str) -> ShapeClass:
        """Read :meth:`__str__`'s form back.

        Raises:
            ValueError: not that form, an unknown dtype or feature, or a bucket that is not a power of two.
        """
        m = _CLASS_RE.fullmatch(text.strip())
        if m is None:
            raise ValueError(f"not a shape class: {text!r} (e.g. 'bfloat16 fwd causal D128 gqa4 Sq512 Sk4096')")
        if m["dtype"] not in DTYPES:
            raise ValueError(f"unknown dtype {m['dtype']!r} in shape class {text!r} (expected one of {DTYPES})")
        sq, sk = int(m["sq"]), int(m["sk"])
        if bucket(sq) != sq or bucket(sk) != sk:
            raise ValueError(f"Sq{sq}/Sk{sk} in {text!r}: buckets are powers of two")
        names = [f for f in m["features"].split(" +") if f]
        unknown = [f for f in names if f not in Feature.__members__.values()]
        if unknown:
            raise ValueError(f"unknown feature(s) {unknown} in {text!r} (known: {[f.value for f in Feature]})")
        d = int(m["d"])
        return cls(dtype=m["dtype"], mode=Mode(m["mode"]), causal=m["mask"] == "causal", head_dim=d,
                   head_dim_v=int(m["dv"]) if m["dv"] else d, gqa_ratio=int(m["gqa"]), seqlen_q_bucket=sq,
                   seqlen_k_bucket=sk, features=_features(names))


__all__ = ["DTYPES", "LEGACY_HEAD_KEYS", "AttentionShape", "Dims", "Feature", "Layout", "Mode", "ShapeClass", "bucket",
           "current_head_keys"]
