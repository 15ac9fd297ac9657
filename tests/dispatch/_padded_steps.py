"""A padded batch's decode step for the tests of the paths that serve it as varlen sequences (SDPA's FlashAttention-2
op, FlashAttention-4's masked decode route): ``q [3, 2 * groups, 1, D]``, K/V ``[3, 2, Sk, D]`` slices of a cache, and
the step's mask, one run of visible keys per row unless ``case`` says otherwise."""

from __future__ import annotations

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
