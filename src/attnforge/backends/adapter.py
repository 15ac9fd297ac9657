"""The contract every attention backend adapter fulfils, and the float64 reference they are checked against.

Conventions for every adapter call (they are the ones of :func:`attnforge.attention`):
    q: ``[B, Hq, Sq, D]``, k and v: ``[B, Hkv, Sk, D]`` (layout "bhsd"), Hq a multiple of Hkv (GQA).
    causal: when Sq != Sk the mask is aligned to the bottom-right (query i sees keys j <= i + Sk - Sq), as in
    FlashAttention >= 2.1; adapters of top-left backends convert.
    scale: softmax scale; None means 1/sqrt(D).
    Returns ``[B, Hq, Sq, Dv]`` in q's dtype.

Features: a call that uses a feature (:data:`FEATURES`) reaches only an adapter that declares it (its
capabilities' ``features``, or a ``features`` attribute; :func:`supported_features`), and gets exactly the
keywords of the features it uses, as :func:`attnforge.backends.exact.exact_attention` names them:
``attn_mask``, ``dropout_p``, ``causal_alignment="top_left"``, ``window``, ``softcap``, ``sinks``,
``return_lse=True`` (then it returns ``(out, lse)``), ``cu_seqlens_q/k`` + ``max_seqlen_q/k`` (packed
``[total, H, D]`` tensors), ``block_table`` + ``seqused_k`` (K/V page pools). A plain call passes none, so an
adapter that declares no feature keeps the two-keyword signature.

Optional: an adapter whose kernel takes ``[B, S, H, D]`` natively (FlashAttention, xFormers, SageAttention
with ``tensor_layout="NHD"``) also defines ``call_bshd(q, k, v, *, causal, scale)``, which takes
``[B, Sq, Hq, D]`` / ``[B, Sk, Hkv, D]`` and returns ``[B, Sq, Hq, D]``. The dispatcher gives it
``layout="bshd"`` inputs as they are, so neither side transposes; adapters without it get ``[B, H, S, D]``
views and the dispatcher transposes the output back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionCall:
    """The properties of one call that decide which backends can serve it (no tensors: hashable, cacheable).

    Attributes:
        device_type: ``"cuda"`` or ``"cpu"``.
        compute_capability: the GPU's ``(9, 0)``; None on CPU.
        dtype: ``"float16"``, ``"bfloat16"``, ``"float32"``, ``"float64"``.
        batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim: sizes (``B, Hq, Hkv, Sq, Sk, D``).
        causal: causal masking, bottom-right aligned.
        needs_grad: any input requires grad.
        precision: ``"exact"`` or ``"allow_quantized"``.
        features: the optional features the call uses that are part of its shape class (the names of
            ``attnforge.types.shapes.Feature``: mask, window, softcap, sinks, varlen, dropout, lse, paged);
            empty for a plain call. :func:`required_features` adds the two routing-only ones.
        head_dim_v: V's head dim ``Dv`` when it differs from ``D`` (feature ``"dv"``), else None.
        top_left: causal or window aligned top-left with Sq != Sk (feature ``"causal_top_left"``).
        layout: the memory layout of the caller's K (``"bhsd"``: heads outer, ``"bshd"``: sequence outer, as a
            ``[B, S, H, D]`` tensor or a transposed view of one; :func:`attnforge.dispatch.inputs.memory_layout`):
            measurements are kept and read per layout; no backend's support depends on it.
    """

    device_type: str
    compute_capability: tuple[int, int] | None
    dtype: str
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool
    needs_grad: bool
    precision: str = "exact"
    features: frozenset[str] = frozenset()
    head_dim_v: int | None = None
    top_left: bool = False
    layout: str = "bhsd"


#: The optional features of :func:`attnforge.attention` a backend may support, by the name capability tables
#: use. A call that uses a feature is only routed to a backend that declares it (the exact fallback has all).
FEATURES: dict[str, str] = {
    "mask": "attn_mask: a bool or additive mask broadcastable to [B, Hq, Sq, Sk]",
    "dropout": "dropout_p > 0 on the attention probabilities",
    "causal_top_left": "causal with causal_alignment='top_left' and Sq != Sk (SDPA's is_causal)",
    "window": "sliding window (left, right)",
    "softcap": "logit soft-capping c * tanh(logits / c)",
    "sinks": "attention sinks: one extra logit per head in the softmax denominator (GPT-OSS s_aux)",
    "lse": "return_lse: the softmax log-sum-exp per query row",
    "varlen": "packed [total, H, D] sequences with cu_seqlens_q / cu_seqlens_k",
    "dv": "value head dim Dv != query/key head dim D",
    "paged": "paged KV: K/V page pools addressed by block_table (and seqused_k)",
}


#: features that are not part of a shape class (``Dv`` is its own field there; the alignment is a routing
#: matter): carried by :class:`AttentionCall` as ``head_dim_v`` and ``top_left``
ROUTING_ONLY = frozenset({"dv", "causal_top_left"})


def required_features(call: AttentionCall) -> frozenset[str]:
    """Every feature a backend needs to serve ``call``: its ``features`` plus ``dv`` and ``causal_top_left``."""
    if call.head_dim_v is None and not call.top_left:
        return call.features
    extra = {"dv"} if call.head_dim_v is not None else set()
    if call.top_left:
        extra.add("causal_top_left")
    return call.features | extra


def supported_features(adapter: object) -> frozenset[str]:
    """The features an adapter serves: its capabilities' ``features``, else its own ``features``, else none
    (an adapter that declares nothing is never given a call that uses a feature)."""
    caps = getattr(adapter, "caps", None)
    found = getattr(caps, "features", None) if caps is not None else getattr(adapter, "features", None)
    return frozenset(found) if found is not None else frozenset()


class BackendAdapter(Protocol):
    """One attention backend behind the common call convention (see the module docstring)."""

    #: catalog id, e.g. "flash-attn", "sdpa-cudnn"
    name: str

    def load_error(self) -> str | None:
        """None if the backend's package imports here, else why not (cheap after the first call)."""
        ...

    def unsupported_reasons(self, call: AttentionCall) -> list[str]:
        """Pure: every reason this backend cannot serve ``call`` (empty list = supported)."""
        ...

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None) -> torch.Tensor:
        """Run attention; see the module docstring for shapes, the causal alignment rule and the feature
        keywords an adapter that declares features also takes."""
        ...


