"""A padded batch's decode step for the tests of the paths that serve it as varlen sequences (SDPA's FlashAttention-2
op, FlashAttention-4's masked decode route): ``q [3, 2 * groups, 1, D]``, K/V ``[3, 2, Sk, D]`` slices of a cache, and
the step's mask, one run of visible keys per row unless ``case`` says otherwise."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch


def padded_step(case: str, *, groups: int, sk: int, d: int, dtype: torch.dtype,
                seed: int) -> tuple[torch.Tensor, ...]:
    """``(q, k, v, mask)``: row 1 left-padded by ``sk // 6`` keys; ``right``: row 2 right-padded too; ``holes``: two
    keys hidden inside row 0's run; ``empty-row``: row 2 sees nothing; ``additive``, ``other-values``, ``finfo-min``:
    the mask as 0 and -inf (one entry -2 for the second; the dtype's lowest value for the third); ``static-cache``:
    K/V slices of a longer cache; ``bshd-kv``: K/V bhsd views of bshd tensors; ``per-head``: the mask per query
    head."""
    g = torch.Generator().manual_seed(seed)
    b, hkv = 3, 2
    q = torch.randn(b, hkv * groups, 1, d, generator=g).to(dtype)
    cache = torch.randn(2, b, hkv, sk + (9 if case == "static-cache" else 0), d, generator=g).to(dtype)
    k, v = cache[0, :, :, :sk], cache[1, :, :, :sk]
    if case == "bshd-kv":
        k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))
    allowed = torch.ones(b, 1, 1, sk, dtype=torch.bool)
    allowed[1, ..., : sk // 6] = False
    if case == "right":
        allowed[2, ..., -4:] = False
    if case == "holes":
        allowed[0, ..., 10:12] = False
    if case == "empty-row":
        allowed[2] = False
    if case == "per-head":
        allowed = allowed.expand(b, hkv * groups, 1, sk).clone()
    mask: torch.Tensor = allowed
    if case in ("additive", "other-values", "finfo-min"):
        hidden = torch.finfo(dtype).min if case == "finfo-min" else float("-inf")  # transformers' eager masks: min
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, hidden)
        if case == "other-values":
            mask[0, ..., 3] = -2.0
    return q, k, v, mask


def fa4_only_dispatcher(adapter: Any, home: Path, monkeypatch: Any, *, device: str, version: str) -> list[int]:
    """Make the process dispatcher one whose only backend is ``adapter`` (FlashAttention-4, a verify record of it in
    ``home`` for ``device``, ``"cpu"`` or ``"cuda"``), with no lane kept, until the test ends (``monkeypatch`` puts
    the previous one back); returns a list that gets one entry per call of the adapter's masked path
    (``FlashAttn4Adapter._masked``), so a test can tell the calls the lane served from those the adapter did."""
    from attnforge.backends.flash import FlashAttn4Adapter
    from attnforge.dispatch import features, runtime
    from attnforge.dispatch.dispatcher import Dispatcher
    from attnforge.records import RecordStore, VerifyRecord

    store = RecordStore(home)
    dispatcher = Dispatcher({"flash-attn-4": adapter}, records=store)
    # under the key the dispatcher looks up (a GPU's name: "NVIDIA H200|9.0|torch ..."): a record under another key,
    # "cuda|9.0|...", left FlashAttention-4 unverified and the exact math served every call (the GPU run of 2026-11-28)
    key = dispatcher._device(torch.device(device)).key
    store.add_verify(VerifyRecord(device_key=key, backend="flash-attn-4", backend_version=version, ok=True,
                                  summary="assumed"))
    masked: list[int] = []
    real = FlashAttn4Adapter._masked

    def counting(self: FlashAttn4Adapter, *args: Any, **kwargs: Any) -> Any:
        masked.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(FlashAttn4Adapter, "_masked", counting)
    monkeypatch.setattr(runtime, "_DISPATCHER", dispatcher)
    monkeypatch.setattr(features, "_LANES", threading.local())
    return masked
