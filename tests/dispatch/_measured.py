"""Bench records that make fake backends the measured winners of a call's shape class.

The policy lets a backend precede plain SDPA only where it was measured faster (``dispatch/policy.py``), so a
test of the routing machinery (routes, fallbacks, broken backends, forced backends) records its fakes as faster
than SDPA for the classes it calls, the way ``attnforge bench`` would after timing them.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from attnforge.records import BenchRecord, RecordStore, device_key

CPU_KEY = device_key("cpu", None, torch.__version__)


def record_faster(store: RecordStore, names: Iterable[str], q: torch.Tensor, k: torch.Tensor, *,
                  v: torch.Tensor | None = None, causal: bool = False, grad: bool = False,
                  features: Iterable[str] = (), key: str = CPU_KEY) -> None:
    """Store plain SDPA at 1 TFLOP/s and ``names`` at 100, 90, 80 ... TFLOP/s (first fastest) for the shape
    class of bhsd ``q [B, Hq, Sq, D]`` / ``k [B, Hkv, Sk, D]`` (``v``: its ``Dv``), ``causal`` and ``grad``."""
    store.add_bench(faster_records(names, q, k, v=v, causal=causal, grad=grad, features=features, key=key))


def faster_records(names: Iterable[str], q: torch.Tensor, k: torch.Tensor, *, v: torch.Tensor | None = None,
                   causal: bool = False, grad: bool = False, features: Iterable[str] = (),
                   key: str = CPU_KEY) -> list[BenchRecord]:
    """The records :func:`record_faster` stores."""
    b, hq, sq, d = q.shape
    _, hkv, sk, _ = k.shape
    dv = v.shape[3] if v is not None and v.shape[3] != d else None
    joined = ",".join(sorted(features))
    rates = {"sdpa": 1.0} | {name: 100.0 - 10 * i for i, name in enumerate(names)}
    return [BenchRecord(device_key=key, backend=name, backend_version="1", dtype=str(q.dtype).removeprefix("torch."),
                        mode="fwd+bwd" if grad else "fwd", causal=causal, batch=b, heads_q=hq, heads_kv=hkv,
                        head_dim=d, seqlen_q=sq, seqlen_k=sk, ms=1.0, tflops=rate, peak_mem_bytes=None,
                        run_id="test", head_dim_v=dv, features=joined)
            for name, rate in rates.items()]


def record_faster_over(store: RecordStore, names: Iterable[str], *, heads_q_kv: Iterable[tuple[int, int]] = ((4, 2),),
                       seqlens: Iterable[int] = (1, 2, 4, 8, 16, 32, 64, 128, 512), head_dims: Iterable[int] = (16,),
                       dtypes: Iterable[torch.dtype] = (torch.float32, torch.float64), key: str = CPU_KEY) -> None:
    """:func:`record_faster` for every class of the given sizes (all ``Sq x Sk`` pairs, causal and not, forward
    and with gradients): for tests that call a fake backend on many small shapes."""
    names, lengths = list(names), list(seqlens)
    records: list[BenchRecord] = []
    for (hq, hkv), d, dtype in ((h, d, t) for h in heads_q_kv for d in head_dims for t in dtypes):
        for sq, sk in ((sq, sk) for sq in lengths for sk in lengths):
            q, k = torch.empty(1, hq, sq, d, dtype=dtype), torch.empty(1, hkv, sk, d, dtype=dtype)
            for causal, grad in ((c, g) for c in (False, True) for g in (False, True)):
                records += faster_records(names, q, k, causal=causal, grad=grad, key=key)
    store.add_bench(records)
