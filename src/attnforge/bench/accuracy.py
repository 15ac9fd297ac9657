"""How far a (quantized) backend's output is from the float32 reference on a bench shape.

The metrics SageAttention reports (arXiv 2410.02367, 2411.10958): relative L1 ``sum|out - ref| / sum|ref|`` and
the cosine similarity of the flattened outputs. The reference is float32 math attention on the same rounded
inputs, computed for a few (batch, head) slices in query chunks, so 32k-token shapes stay within memory.
"""

from __future__ import annotations

import math
from typing import Any

from attnforge.backends.adapter import BackendAdapter
from attnforge.ranking import OutputError

#: (batch, head) slices compared; query rows per reference chunk
SLICES = 2
CHUNK_ROWS = 1024


def output_error(adapter: BackendAdapter, inputs: tuple[Any, ...], *, causal: bool) -> OutputError:
    """The relative L1 error and cosine of ``adapter``'s output on ``inputs = (q, k, v, ...)`` against float32 math.

    Args:
        adapter: the backend, called as in a bench cell (bhsd, bottom-right causal).
        inputs: ``q [B, Hq, Sq, D]``, ``k [B, Hkv, Sk, D]``, ``v [B, Hkv, Sk, Dv]``.
        causal: the shape's mask.

    Raises:
        Exception: whatever the backend raises.
    """
    import torch

    q, k, v = (t.detach() for t in inputs[:3])
    with torch.no_grad():
        out = adapter(q, k, v, causal=causal, scale=None)
    hq, hkv = q.shape[1], k.shape[1]
    picks = [(b % q.shape[0], (b * 7) % hq) for b in range(SLICES)]
    abs_err = abs_ref = dot = norm_o = norm_r = 0.0
    for b, h in dict.fromkeys(picks):
        ref = _reference(q[b, h].float(), k[b, h // (hq // hkv)].float(), v[b, h // (hq // hkv)].float(),
                         causal=causal)
        got = out[b, h].float()
        abs_err += float((got - ref).abs().sum())
        abs_ref += float(ref.abs().sum())
        dot += float((got * ref).sum())
        norm_o += float((got * got).sum())
        norm_r += float((ref * ref).sum())
    rel_l1 = abs_err / abs_ref if abs_ref > 0 else math.inf
    cosine = dot / math.sqrt(norm_o * norm_r) if norm_o > 0 and norm_r > 0 else 0.0
    return OutputError(rel_l1, cosine)


def _reference(q: Any, k: Any, v: Any, *, causal: bool) -> Any:
    """``softmax(q k^T / sqrt(D)) v`` for one head, ``q [Sq, D]``, in chunks of query rows (float32)."""
    import torch

    sq, sk = q.shape[0], k.shape[0]
    scale = 1.0 / math.sqrt(q.shape[-1])
    parts = []
    for start in range(0, sq, CHUNK_ROWS):
        scores = (q[start:start + CHUNK_ROWS] @ k.T) * scale
        if causal:
            i = torch.arange(start, start + scores.shape[0], device=q.device).unsqueeze(1)
            j = torch.arange(sk, device=q.device).unsqueeze(0)
            scores = scores.masked_fill(j > i + (sk - sq), float("-inf"))
        parts.append(torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0) @ v)
    return torch.cat(parts)
