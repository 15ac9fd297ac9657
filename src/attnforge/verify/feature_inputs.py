"""The inputs of a verify case that uses a feature, and how its output is checked.

Every feature but dropout is checked like a plain case: the backend's output (and its log-sum-exp for
``lse``) against :func:`attnforge.backends.exact.reference_attention` in float64 with the same keywords.
Dropout draws random numbers, so no reference can match it; its case checks what can be checked: the same
torch seed gives the same output, the output is finite and of the right shape, and it differs from the output
without dropout.
"""

from __future__ import annotations

import math
from typing import Any

from attnforge.verify.cases import VerifyCase

#: dropout probability of a dropout case
DROPOUT_P = 0.25
#: keys per page of a paged KV case (FlashAttention-2 wants multiples of 256 on GPU; the pool is small here)
PAGE_SIZE = 16


def case_inputs(case: VerifyCase, device: str) -> tuple[Any, Any, Any, dict[str, Any]]:
    """Seeded ``q, k, v`` (bhsd, or packed ``[total, H, D]`` for varlen) and the feature keywords of ``case``."""
    import torch

    gen = torch.Generator().manual_seed(case.seed)
    dtype = getattr(torch, case.dtype)

    def draw(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)

    dv = case.head_dim_v or case.head_dim
    opts: dict[str, Any] = {}
    if case.feature == "varlen":
        lens = [int(n) for n in torch.randint(1, case.seqlen_q + 1, (case.batch,), generator=gen)]
        total = sum(lens)
        offsets = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
        q, k, v = (draw(total, case.heads_q, case.head_dim), draw(total, case.heads_kv, case.head_dim),
                   draw(total, case.heads_kv, dv))
        opts.update(cu_seqlens_q=offsets, cu_seqlens_k=offsets, max_seqlen_q=max(lens), max_seqlen_k=max(lens))
        return q, k, v, opts
    q = draw(case.batch, case.heads_q, case.seqlen_q, case.head_dim)
    if case.feature == "paged":
        page = PAGE_SIZE
        per_seq = -(-case.seqlen_k // page)
        blocks = torch.randperm(case.batch * per_seq + 1, generator=gen)[: case.batch * per_seq]
        opts["block_table"] = blocks.view(case.batch, per_seq).to(device=device, dtype=torch.int32)
        opts["seqused_k"] = torch.full((case.batch,), case.seqlen_k, dtype=torch.int32, device=device)
        pool = case.batch * per_seq + 1
        return (q, draw(pool, page, case.heads_kv, case.head_dim), draw(pool, page, case.heads_kv, dv), opts)
    k = draw(case.batch, case.heads_kv, case.seqlen_k, case.head_dim)
    v = draw(case.batch, case.heads_kv, case.seqlen_k, dv)
    if case.feature == "mask" and case.seqlen_q == 1:  # a decode step: a padded batch's mask, one run per row
        sk = case.seqlen_k
        first = torch.randint(0, max(1, sk // 3), (case.batch,), generator=gen)
        end = sk - torch.randint(0, max(1, sk // 4), (case.batch,), generator=gen)
        keys = torch.arange(sk)
        opts["attn_mask"] = ((keys >= first[:, None]) & (keys < end[:, None]))[:, None, None, :].to(device)
    elif case.feature == "mask":
        opts["attn_mask"] = (torch.rand(case.batch, 1, case.seqlen_q, case.seqlen_k, generator=gen) > 0.2).to(device)
    elif case.feature == "window":
        opts["window"] = (max(1, case.seqlen_k // 4), 0)
    elif case.feature == "softcap":
        opts["softcap"] = 2.0 * math.sqrt(case.head_dim) / 4
    elif case.feature == "sinks":
        opts["sinks"] = draw(case.heads_q).float()
    elif case.feature == "lse":
        opts["return_lse"] = True
    elif case.feature == "causal_top_left":
        opts["causal_alignment"] = "top_left"
    elif case.feature == "dropout":
        opts["dropout_p"] = DROPOUT_P
    return q, k, v, opts


def check_dropout(adapter: Any, q: Any, k: Any, v: Any, *, causal: bool, seed: int) -> str | None:
    """What is wrong with ``adapter``'s dropout on these inputs, or None (see the module docstring)."""
    import torch

    outs = []
    for _ in range(2):
        torch.manual_seed(seed)
        outs.append(adapter(q, k, v, causal=causal, scale=None, dropout_p=DROPOUT_P))
    plain = adapter(q, k, v, causal=causal, scale=None)
    first, second = outs
    if tuple(first.shape) != tuple(plain.shape) or first.dtype != q.dtype:
        return f"dropout output is {tuple(first.shape)} {first.dtype}, expected {tuple(plain.shape)} {q.dtype}"
    if not bool(torch.isfinite(first).all()):
        return "dropout output has NaN/Inf"
    if not torch.equal(first, second):
        return "the same torch seed gave two different dropout outputs"
    if torch.equal(first, plain):
        return f"dropout_p={DROPOUT_P} changed nothing"
    return None
