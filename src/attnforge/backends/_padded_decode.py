"""A padded batch's decode step as varlen sequences: one answer for every kernel that serves it so.

A decode step (``q [B, Hq, 1, D]``, ``k/v [B, Hkv, Sk, D]``) under a padding mask (bool, or additive with only 0 and
-inf or the dtype's lowest value; broadcastable to ``[B, 1, 1, Sk]``, the same for every head) whose every batch row
sees one run of keys, as a left- or right-padded batch's decode mask does, is a varlen call with no mask at all: each
(batch row, K/V head) is one sequence of one query row carrying its ``g = Hq / Hkv`` query heads (``q`` viewed
``[B * Hkv, g, D]``) over one K/V head (``k``/``v`` viewed ``[N, 1, D]`` on their own storage: no copy), the run's
first key its start (``cu_seqlens_k``) and the run's length ``seqused_k``. FlashAttention-2's varlen op in SDPA
(:func:`attnforge.backends.sdpa._varlen_decode`) and FlashAttention-4's varlen forward
(:meth:`attnforge.backends.flash.FlashAttn4Adapter`'s masked decode) both take it this way.

Reading the runs costs one host sync (the mask's copy back) per mask object, so they are kept per caller's
mask object (:class:`~attnforge.backends._base.KeptPerMask`): a model passes one mask to every layer of a step.
Where a mask object serves one call only, the read costs more than the kernel saves (:class:`MaskSharing`).
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnforge.backends._base import KeptPerMask, four_dims, host_to_device, made_for_autograd

if TYPE_CHECKING:
    import torch

#: a decode mask's runs of visible keys (:func:`padding_runs`), kept per caller's mask object and the K/V layout
_RUNS: KeptPerMask[tuple[torch.Tensor, ...]] = KeptPerMask()


@dataclass(frozen=True, slots=True)
class VarlenDecode:
    """One decode step as varlen sequences (see the module docstring).

    Attributes:
        q: ``[B * Hkv, g, D]``, a view of the caller's ``q``.
        k, v: ``[N, 1, D]`` and ``[N, 1, Dv]`` views of the caller's K/V storage (``N``: :func:`key_rows`).
        cu_seqlens_q: int32 ``[B * Hkv + 1]``: ``0, 1, ..., B * Hkv`` (one query row per sequence).
        cu_seqlens_k: int32 ``[B * Hkv + 1]``: each sequence's first key, in rows of ``k.stride(2)`` from ``k``'s
            first element; the last entry is ``N``.
        seqused_k: int32 ``[B * Hkv]``: each sequence's keys.
        max_seqlen_k: ``Sk``.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    seqused_k: torch.Tensor
    max_seqlen_k: int


def varlen_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, *,
                  read: bool = True) -> VarlenDecode | None:
    """The decode call ``q [B, Hq, 1, D]``, ``k [B, Hkv, Sk, D]``, ``v [B, Hkv, Sk, Dv]`` under the caller's ``mask`` as
    varlen sequences, or None where it is not one: another query length, K and V of other strides, a K/V layout
    whose rows are not whole multiples of its row stride (8-element aligned) or that repeats them (an expanded K/V,
    stride 0 over batch or heads), a mask of another dtype than bool or
    q's or another shape than ``[B or 1, 1, 1, Sk]`` (after :func:`four_dims`), or a row that does not see exactly
    one run of keys (a row that sees none too: the kernels differ on what they return for it). The runs are read
    once per mask object and K/V layout (one host sync), never under CUDA graph capture or while ``torch.compile``
    traces: the caller checks that. ``read=False``: None where the mask's runs are not kept already (no read)."""
    import torch

    b, hq, sq, _ = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    rs = k.stride(2)
    if (sq != 1 or hq % hkv or k.stride() != v.stride() or rs <= 0 or rs % 8 or k.stride(0) % rs
            or k.stride(1) % rs or mask.dtype not in (torch.bool, q.dtype) or k.stride(-1) != 1
            or v.stride(-1) != 1 or (b > 1 and k.stride(0) <= 0) or (hkv > 1 and k.stride(1) <= 0)):
        return None  # (an expanded K/V, stride 0 over batch or heads, would make overlapping sequences)
    m = four_dims(mask)
    if m.shape[1] != 1 or m.shape[2] != 1 or m.shape[0] not in (1, b) or m.shape[3] != sk:
        return None
    params = (b, hkv, sk, k.stride(), q.device)
    runs = _RUNS.get(mask, params)
    if runs is None:
        if not read:
            return None
        runs = padding_runs(m, b=b, hkv=hkv, k=k)
        _RUNS.put(mask, params, runs)
    if not runs:
        return None
    starts, used = runs
    qv, kv, vv = varlen_views(q, k, v, key_rows(k))
    return VarlenDecode(q=qv, k=kv, v=vv, cu_seqlens_q=query_starts(b * hkv, q.device), cu_seqlens_k=starts,
                        seqused_k=used, max_seqlen_k=sk)


def varlen_views(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The varlen kernels' views of a decode step (the module docstring): ``q [B, Hq, 1, D]`` as ``[B * Hkv, g, D]``,
    ``k``/``v`` as ``[rows, 1, D]`` / ``[rows, 1, Dv]`` on their own storage, one row every ``k.stride(2)`` elements
    (``rows``: :func:`key_rows`). Views only, no copy; the layout checks are :func:`varlen_decode`'s."""
    b, hkv, rs = k.shape[0], k.shape[1], k.stride(2)
    d, dv = q.shape[-1], v.shape[-1]
    return (q.reshape(b * hkv, q.shape[1] // hkv, d), k.as_strided((rows, 1, d), (rs, d, 1)),
            v.as_strided((rows, 1, dv), (rs, dv, 1)))


def padding_runs(m: torch.Tensor, *, b: int, hkv: int, k: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """For a decode mask ``m`` (``[B or 1, 1, 1, Sk]``, bool or additive) over ``k [B, Hkv, Sk, D]``: where each
    (batch row, K/V head)'s run of visible keys starts in ``k``'s storage, counted in rows of ``k.stride(2)`` from
    ``k``'s first element (int32 ``[B * Hkv + 1]``, the last entry the end, as ``cu_seqlens_k``), and its length
    (int32 ``[B * Hkv]``, ``seqused_k``). ``()`` when some row's visible keys are not one run, or a row sees no key
    (FlashAttention-2's kernel without split writes zeros for an empty sequence only under causal; the caller's
    path zeroes such rows), or an additive mask holds a value other than 0 and a hiding one: -inf, or the dtype's
    lowest finite value as transformers' eager masks use (its softmax weight is 0 in float32 beside any visible
    key).

    The mask is read on the host: one copy back (``B x Sk`` entries; the one host sync), numpy on it (each op ~1 µs,
    where a torch CPU op costs the H200's host 10-20 µs: the tenth session measured the read through a dozen torch
    CPU ops at ~370 µs a mask object, ``decode_probe.py fa4_varlen_decode``'s ``fa4_replay_new_runs_us`` against
    ``fa4_replay_us``), and one copy up of both int32 vectors (``seqused_k`` at a 16-byte aligned offset of the same
    buffer). Reading it on the device instead took ~20 small kernels (~190 µs a mask object in the ninth session).
    Offsets past int32 give ``()`` too."""
    import numpy as np
    import torch

    sk = m.shape[-1]
    rows_t = m.reshape(m.shape[0], sk).cpu()  # the one host sync: the mask's copy back
    if rows_t.dtype == torch.bool:
        visible = rows_t.numpy()
    else:
        lowest = torch.finfo(rows_t.dtype).min
        rows = rows_t.float().numpy() if rows_t.dtype in (torch.bfloat16, torch.float16) else rows_t.numpy()
        visible = rows == 0
        if not bool((visible | (rows <= lowest)).all()):
            return ()
    visible = np.broadcast_to(visible, (b, sk))
    count = visible.sum(axis=-1)
    first = visible.argmax(axis=-1)
    end = sk - visible[:, ::-1].argmax(axis=-1)
    if not bool(((count == end - first) & (count > 0)).all()):
        return ()
    rs = k.stride(2)
    n = b * hkv
    used_at = -(-(n + 1) // 4) * 4  # 16 bytes of int32: seqused_k's offset in the buffer
    host = np.zeros(used_at + n, dtype=np.int64)
    host[:n] = (np.arange(b)[:, None] * (k.stride(0) // rs) + np.arange(hkv)[None, :] * (k.stride(1) // rs)
                + first[:, None]).ravel()
    host[n] = key_rows(k)
    host[used_at:] = np.repeat(count, hkv)
    if int(host.max()) > np.iinfo(np.int32).max:
        return ()
    both = host_to_device(host.astype(np.int32), k.device)  # the one copy up, queued without a sync
    return both[: n + 1], both[used_at:]


def key_rows(k: torch.Tensor) -> int:
    """The rows of ``k [B, Hkv, Sk, D]``'s storage (each ``k.stride(2)`` elements) from its first element through its
    last key: the length of the ``[N, 1, D]`` views, and the end of the last varlen sequence (:func:`padding_runs`)."""
    rs = k.stride(2)
    return (k.shape[0] - 1) * (k.stride(0) // rs) + (k.shape[1] - 1) * (k.stride(1) // rs) + k.shape[2]


class MaskSharing:
    """Whether reading a mask's runs pays, learned per kind of call (``key``: the caller's batch size, heads, head
    dim, dtype and device; not the length, which grows every step) from the masks met before: a mask object met
    before (its runs are kept after the read), the first mask of its kind (nothing says the read will not pay; a
    verify case is one), or one that follows masks of its kind of which some served :data:`SHARED` or more calls (a
    model's later steps, when its layers share each step's mask). Otherwise the mask's first call is left to the
    caller's other path and its runs are read at its second call.

    Measured on an H200 (2026-11-28, docs/benchmarks.md "ninth session", FlashAttention-4's route, Gemma-2-9B-shaped
    decoder, a padded batch, the runs read at every mask's first call): two masks a step (sliding and full), each
    serving 4 layers of 8: decode 1.015x eager's tokens/s (0.93x on the exact math before); each serving 1 layer
    of 2: 0.878x (1.00-1.05x on the exact math). The read (then one host sync and ~20 small kernels on the device;
    on the host since, not re-measured) costs more than one call saves."""

    __slots__ = ("_recent",)

    #: calls a mask must serve to count as shared
    SHARED = 2
    #: masks remembered per kind (weakly) with their call counts
    RECENT = 4
    #: kinds remembered at once (all forgotten when full)
    KINDS = 64

    def __init__(self) -> None:
        self._recent: dict[tuple[Any, ...], list[list[Any]]] = {}  # kind -> [weakref to a mask, calls], newest first

    def worth_reading(self, mask: torch.Tensor, key: tuple[Any, ...]) -> bool:
        """Counts this call of ``mask`` under ``key``; True when its runs should be read now (see the class
        docstring)."""
        recent = self._recent.get(key)
        if recent is None:
            if len(self._recent) >= self.KINDS:
                self._recent.clear()
            self._recent[key] = [[weakref.ref(mask), 1]]
            return True
        for entry in recent:
            if entry[0]() is mask:
                entry[1] += 1
                return True
        shared = any(calls >= self.SHARED for _, calls in recent)
        self._recent[key] = [[weakref.ref(mask), 1], *recent[: self.RECENT - 1]]
        return shared

    def would_decline(self, mask: torch.Tensor, key: tuple[Any, ...]) -> bool:
        """Whether :meth:`worth_reading` would say False for this call of ``mask`` now, without counting it: a
        caller that then serves the call another way counts it with :meth:`worth_reading` (whose answer it knows),
        so the counts are the ones :meth:`worth_reading` alone would leave."""
        recent = self._recent.get(key)
        if recent is None or any(entry[0]() is mask for entry in recent):
            return False
        return not any(calls >= self.SHARED for _, calls in recent)


@functools.lru_cache(maxsize=64)
@made_for_autograd  # kept across calls: a normal tensor, not an inference one (see made_for_autograd)
def query_starts(n: int, device: Any) -> torch.Tensor:
    """``cu_seqlens_q`` of ``n`` varlen sequences of one query row each: ``0, 1, ..., n`` (int32)."""
    import torch

    return torch.arange(n + 1, dtype=torch.int32, device=device)
