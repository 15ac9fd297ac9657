"""attention() on CPU against an independent float64 reference, the way a demanding model calls it.

The reference here is written from the definition in plain torch (GQA by repeating K/V heads, an explicit softmax
over masked logits, sinks as one extra logit per head in the denominator, rows that see no key zeros); it shares
nothing with attnforge's exact math. Hypothesis draws the combinations: Sq above and below Sk with causal and
windows of both alignments (sides of 0, sides past the sequences), GQA ratios 1-8, odd head dims and Dv != D,
batches of 0, 1 and 3, bool and additive masks in every broadcast shape (rows they hide entirely included, in a
dtype wider or narrower than q's), softcap with windows and sinks, non-contiguous inputs (transposed, sliced,
stride-0 expanded), both layouts, every float dtype, return_lse, numpy and int scales, varlen with empty sequences
and paged KV with one-token pages and unused pages. One dispatcher serves every example of a test, so its route
and plan caches see calls of one signature with other masks and strides; a call is also repeated A, B, A.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnforge
from attnforge.backends import sdpa as sdpa_module
from attnforge.backends.adapter import AttentionCall
from attnforge.dispatch import runtime
from attnforge.errors import DispatchError
from attnforge.records import RecordStore, VerifyRecord
from tests.dispatch._measured import CPU_KEY, faster_records

Window = tuple[int | None, int | None] | None


@pytest.fixture(autouse=True)
def dispatcher(tmp_path: Path) -> Iterator[runtime.Dispatcher]:
    """The real registry over an empty record store (SDPA or the exact math serve every call), one per test: every
    hypothesis example of a test meets the routes and plans the earlier ones left."""
    previous = runtime.set_dispatcher(runtime.Dispatcher(records=RecordStore(tmp_path / "records")))
    yield runtime.get_dispatcher()
    runtime.set_dispatcher(previous)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor | None = None,
              causal: bool = False, top_left: bool = False, window: Window = None, softcap: float | None = None,
              sinks: torch.Tensor | None = None, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition in float64 on bhsd tensors: ``(out [B, Hq, Sq, Dv], lse [B, Hq, Sq])``, differentiable.

    Query ``i`` is aligned to ``i' = i + Sk - Sq`` (bottom-right) or ``i' = i`` (top-left); causal keeps keys
    ``j <= i'``; a window ``(left, right)`` keeps ``i' - left <= j <= i' + right``, a None or negative side
    unbounded; softcap ``c`` maps a scaled logit ``x`` to ``c * tanh(x / c)`` before the mask; a bool mask keeps
    True, a float mask is added; sinks add ``exp(sink_h)`` to each row's denominator. A row that sees no key is
    zeros, its lse ``-inf`` (the sink's logit with sinks)."""
    q, k, v = q.double(), k.double(), v.double()
    b, hq, sq, d = q.shape
    sk = k.shape[2]
    k = k.repeat_interleave(hq // k.shape[1], dim=1)
    v = v.repeat_interleave(hq // v.shape[1], dim=1)
    logits = torch.einsum("bhid,bhjd->bhij", q, k) * (1.0 / math.sqrt(d) if scale is None else float(scale))
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    i = torch.arange(sq).view(-1, 1) + (0 if top_left else sk - sq)
    j = torch.arange(sk).view(1, -1)
    seen = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        seen &= j <= i
    left, right = window if window is not None else (None, None)
    if left is not None and left >= 0:
        seen &= j >= i - left
    if right is not None and right >= 0:
        seen &= j <= i + right
    seen = seen.expand(b, hq, sq, sk)
    if mask is not None:
        if mask.dtype == torch.bool:
            seen = seen & mask.expand(b, hq, sq, sk)
        else:
            logits = logits + mask.double().expand(b, hq, sq, sk)
    logits = logits.masked_fill(~seen, -math.inf)
    if sinks is not None:
        logits = torch.cat([logits, sinks.double().view(1, hq, 1, 1).expand(b, hq, sq, 1)], dim=-1)
    peak = logits.amax(dim=-1, keepdim=True) if logits.shape[-1] else logits.new_full((b, hq, sq, 1), -math.inf)
    peak = torch.where(peak.isfinite(), peak, torch.zeros_like(peak)).detach()
    weights = torch.exp(logits - peak)
    total = weights.sum(dim=-1, keepdim=True)
    safe = torch.where(total > 0, total, torch.ones_like(total))
    out = (weights[..., :sk] / safe) @ v
    lse = torch.where(total > 0, torch.log(safe) + peak, torch.full_like(total, -math.inf)).squeeze(-1)
    return out, lse


#: (atol, rtol) of an output against the reference, by input dtype
TOLERANCE = {torch.float64: (1e-9, 1e-8), torch.float32: (3e-5, 1e-4), torch.float16: (1e-2, 1e-2),
             torch.bfloat16: (5e-2, 5e-2)}


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str = "output") -> None:
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(got.double(), want, atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


def _lse_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert got.dtype == torch.float32 and got.shape == want.shape
    tol = 2e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-4
    assert torch.equal(got.isneginf(), want.isneginf()), "rows that see no key: lse -inf exactly there"
    torch.testing.assert_close(got.double().nan_to_num(neginf=0.0), want.nan_to_num(neginf=0.0), atol=tol, rtol=tol)


def _strided(t: torch.Tensor, how: str, g: torch.Generator) -> torch.Tensor:
    """``t``'s values in another memory layout: ``bshd`` memory seen as bhsd, a slice of a larger tensor, or (its
    batch row 0 and head 0 repeated) a stride-0 expansion."""
    if how == "transposed":
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    if how == "sliced":
        big = torch.randn(t.shape[0], t.shape[1], 2 * t.shape[2] + 1, t.shape[3] + 3, generator=g).to(t.dtype)
        big[:, :, 1::2, 2 : 2 + t.shape[3]] = t
        return big[:, :, 1::2, 2 : 2 + t.shape[3]]
    if how == "expanded":
        return t[:1, :1].expand(t.shape)
    return t


MASK_SHAPES = ("Sk", "SqSk", "11SqSk", "B11Sk", "BHqSqSk", "HqSqSk", "Sq1")


def _mask(kind: str, shape_name: str, dims: dict[str, int], dtype: torch.dtype, g: torch.Generator, *,
          hide_row: bool) -> torch.Tensor:
    shape = {"Sk": ("Sk",), "SqSk": ("Sq", "Sk"), "11SqSk": ("1", "1", "Sq", "Sk"), "B11Sk": ("B", "1", "1", "Sk"),
             "BHqSqSk": ("B", "Hq", "Sq", "Sk"), "HqSqSk": ("Hq", "Sq", "Sk"), "Sq1": ("Sq", "1")}[shape_name]
    sizes = tuple(dims[name] for name in shape)
    keep = torch.rand(sizes, generator=g) > 0.35
    if hide_row and len(sizes) >= 2 and sizes[-2] > 0:
        keep[..., 0, :] = False  # the first query row sees no key
    if kind == "bool":
        return keep
    # additive: biases of either sign, -inf where hidden; "wide" is a float32/float64 bias of large values close
    # together (ALiBi far from the diagonal), which loses its offsets in a half dtype
    bias = torch.randn(sizes, generator=g, dtype=torch.float64)
    if kind == "wide":
        bias = bias - 300.0
    return bias.masked_fill(~keep, -math.inf).to(dtype)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(batch=st.sampled_from([0, 1, 3]), hkv=st.integers(1, 2), group=st.integers(1, 8), sq=st.integers(1, 9),
       sk=st.integers(1, 9), d=st.sampled_from([1, 3, 8, 17, 64, 256]), dv=st.sampled_from([None, 1, 5, 32]),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]),
       causal=st.sampled_from(["", "bottom_right", "top_left", "is_causal"]),
       window=st.none() | st.tuples(st.none() | st.sampled_from([-1, 0, 1, 3, 50]),
                                    st.none() | st.sampled_from([-1, 0, 2, 50])),
       window_top_left=st.booleans(), softcap=st.none() | st.sampled_from([0.7, 5.0]), use_sinks=st.booleans(),
       mask_kind=st.sampled_from([None, "bool", "additive", "wide"]), mask_shape=st.sampled_from(MASK_SHAPES),
       mask_dtype=st.sampled_from(["q", "float32", "float64", "other-half"]), hide_row=st.booleans(),
       layout=st.sampled_from(["bhsd", "bshd"]), memory=st.sampled_from(["", "transposed", "sliced", "expanded"]),
       lse=st.booleans(), scale=st.sampled_from([None, 0.3, 2, np.float32(0.5), np.float64(0.25)]),
       seed=st.integers(0, 2**16))
def test_any_dense_call_matches_the_definition(  # noqa: PLR0917 - hypothesis draws
        batch: int, hkv: int, group: int, sq: int, sk: int, d: int, dv: int | None, dtype: torch.dtype, causal: str,
        window: Window, window_top_left: bool, softcap: float | None, use_sinks: bool, mask_kind: str | None,
        mask_shape: str, mask_dtype: str, hide_row: bool, layout: str, memory: str, lse: bool, scale: Any,
        seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    hq = hkv * group
    dv = d if dv is None else dv
    q, k, v = (torch.randn(batch, h, s, e, generator=g).to(dtype) for h, s, e in ((hq, sq, d), (hkv, sk, d),
                                                                                    (hkv, sk, dv)))
    q, k, v = (_strided(t, memory, g) for t in (q, k, v))
    kwargs: dict[str, Any] = {"scale": scale, "softcap": softcap, "window": window, "return_lse": lse}
    want_kw: dict[str, Any] = {"scale": scale, "softcap": softcap, "window": window}
    if causal == "is_causal":
        kwargs["is_causal"] = True
    elif causal:
        kwargs["causal"], kwargs["causal_alignment"] = True, causal
    elif window is not None and window_top_left:
        kwargs["causal_alignment"] = "top_left"  # a window's own alignment
    want_kw["causal"] = bool(causal)
    want_kw["top_left"] = causal in ("top_left", "is_causal") or kwargs.get("causal_alignment") == "top_left"
    if use_sinks:
        kwargs["sinks"] = want_kw["sinks"] = torch.randn(hq, generator=g).to(dtype)
    if mask_kind is not None:
        half = {torch.float16: torch.bfloat16, torch.bfloat16: torch.float16}.get(dtype, dtype)
        m_dtype = {"q": dtype, "float32": torch.float32, "float64": torch.float64, "other-half": half}[mask_dtype]
        dims = {"B": batch, "Hq": hq, "Sq": sq, "Sk": sk, "1": 1}
        kwargs["attn_mask"] = want_kw["mask"] = _mask(mask_kind, mask_shape, dims, m_dtype, g, hide_row=hide_row)
    want, want_lse = reference(q, k, v, **want_kw)
    args = (q, k, v) if layout == "bhsd" else tuple(t.transpose(1, 2) for t in (q, k, v))
    got = attnforge.attention(*args, layout=layout, **kwargs)
    out, got_lse = got if lse else (got, None)
    if layout == "bshd":
        out = out.transpose(1, 2)
    assert out.dtype == dtype and out.shape == want.shape
    _close(out, want, dtype)
    if got_lse is not None:
        _lse_close(got_lse, want_lse, dtype)
    # the same signature again, without lse (maybe another backend) and on contiguous copies: the same answer
    again = attnforge.attention(*(t.contiguous() for t in args), layout=layout, **{**kwargs, "return_lse": False})
    _close(again.transpose(1, 2) if layout == "bshd" else again, want, dtype, "repeat")


def _packed_features(g: torch.Generator, hq: int, dtype: torch.dtype, *, causal: str, window: Window,
                     softcap: float | None, use_sinks: bool, lse: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The varlen and paged tests' feature keywords: attention()'s, and the reference's for the same call (``causal``:
    "" off, else its alignment; sinks drawn from ``g`` in ``dtype``)."""
    kwargs: dict[str, Any] = {"softcap": softcap, "window": window, "return_lse": lse}
    feats: dict[str, Any] = {"softcap": softcap, "window": window, "causal": bool(causal),
                             "top_left": causal == "top_left"}
    if causal:
        kwargs["causal"], kwargs["causal_alignment"] = True, causal
    if use_sinks:
        kwargs["sinks"] = feats["sinks"] = torch.randn(hq, generator=g, dtype=dtype)
    return kwargs, feats


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lens=st.lists(st.tuples(st.sampled_from([0, 1, 2, 5]), st.sampled_from([0, 1, 3, 6])), min_size=1, max_size=4),
       hkv=st.integers(1, 2), group=st.sampled_from([1, 2, 4]), d=st.sampled_from([1, 5, 16]),
       dv=st.sampled_from([None, 3]), causal=st.sampled_from(["", "bottom_right", "top_left"]),
       window=st.none() | st.tuples(st.none() | st.sampled_from([0, 2]), st.none() | st.sampled_from([0, 1])),
       softcap=st.none() | st.just(1.5), use_sinks=st.booleans(), lse=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 2**16))
def test_varlen_with_empty_sequences_matches_each_sequence_alone(  # noqa: PLR0917 - hypothesis draws
        lens: list[tuple[int, int]], hkv: int, group: int, d: int, dv: int | None, causal: str, window: Window,
        softcap: float | None, use_sinks: bool, lse: bool, dtype: torch.dtype, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    hq, dv = hkv * group, d if dv is None else dv
    lens_q, lens_k = [a for a, _ in lens], [b for _, b in lens]
    q = torch.randn(sum(lens_q), hq, d, generator=g, dtype=dtype)
    k = torch.randn(sum(lens_k), hkv, d, generator=g, dtype=dtype)
    v = torch.randn(sum(lens_k), hkv, dv, generator=g, dtype=dtype)
    cu_q, cu_k = (torch.tensor([0, *np.cumsum(n).tolist()], dtype=torch.int32) for n in (lens_q, lens_k))
    kwargs, feats = _packed_features(g, hq, dtype, causal=causal, window=window, softcap=softcap,
                                     use_sinks=use_sinks, lse=lse)
    got = attnforge.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **kwargs)
    out, got_lse = got if lse else (got, None)
    outs, lses = [], []
    for (q0, q1), (k0, k1) in zip(zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True),
                                  zip(cu_k[:-1].tolist(), cu_k[1:].tolist(), strict=True), strict=True):
        o, s = reference(*(t.transpose(0, 1).unsqueeze(0) for t in (q[q0:q1], k[k0:k1], v[k0:k1])), **feats)
        outs.append(o[0].transpose(0, 1))
        lses.append(s[0])
    assert out.shape == (sum(lens_q), hq, dv) and out.dtype == dtype
    _close(out, torch.cat(outs), dtype)
    if got_lse is not None:
        _lse_close(got_lse, torch.cat(lses, dim=-1), dtype)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, 3), page=st.sampled_from([1, 2, 4]), blocks=st.integers(1, 3), spare=st.integers(0, 3),
       hkv=st.integers(1, 2), group=st.sampled_from([1, 3]), sq=st.integers(1, 4), dv=st.sampled_from([None, 3]),
       used=st.booleans(), causal=st.sampled_from(["", "bottom_right", "top_left"]),
       window=st.none() | st.tuples(st.none() | st.sampled_from([0, 2]), st.none() | st.sampled_from([0, 1])),
       softcap=st.none() | st.just(2.0), use_sinks=st.booleans(), lse=st.booleans(),
       layout=st.sampled_from(["bhsd", "bshd"]), seed=st.integers(0, 2**16))
def test_paged_kv_with_one_token_pages_and_unused_pages_matches_the_gathered_keys(  # noqa: PLR0917
        batch: int, page: int, blocks: int, spare: int, hkv: int, group: int, sq: int, dv: int | None, used: bool,
        causal: str, window: Window, softcap: float | None, use_sinks: bool, lse: bool, layout: str,
        seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    hq, d = hkv * group, 8
    dv = d if dv is None else dv
    pool = batch * blocks + spare  # pages no row points to
    k_pool = torch.randn(pool, page, hkv, d, generator=g)
    v_pool = torch.randn(pool, page, hkv, dv, generator=g)
    table = torch.randperm(pool, generator=g)[: batch * blocks].view(batch, blocks).to(torch.int32)
    lengths = torch.randint(0, blocks * page + 1, (batch,), generator=g, dtype=torch.int32) if used else None
    q = torch.randn(batch, hq, sq, d, generator=g)
    kwargs, feats = _packed_features(g, hq, torch.float32, causal=causal, window=window, softcap=softcap,
                                     use_sinks=use_sinks, lse=lse)
    got = attnforge.attention(q.transpose(1, 2) if layout == "bshd" else q, k_pool, v_pool, block_table=table,
                              seqused_k=lengths, layout=layout, **kwargs)
    out, got_lse = got if lse else (got, None)
    if layout == "bshd":
        out = out.transpose(1, 2)
    outs, lses = [], []
    for row in range(batch):
        n = blocks * page if lengths is None else int(lengths[row])
        keys = (pool_[table[row].long()].flatten(0, 1)[:n].transpose(0, 1).unsqueeze(0) for pool_ in (k_pool, v_pool))
        o, s = reference(q[row : row + 1], *keys, **feats)
        outs.append(o)
        lses.append(s)
    _close(out, torch.cat(outs), torch.float32)
    if got_lse is not None:
        _lse_close(got_lse, torch.cat(lses), torch.float32)


# -- one signature, other masks and strides: no route or plan of one call serves another wrongly -----------------
def _abab(calls: list[tuple[str, dict[str, Any], tuple[torch.Tensor, ...], dict[str, Any]]]) -> None:
    for name, kwargs, tensors, want_kw in calls + calls:  # A, B, ..., then A, B, ... again
        out = attnforge.attention(*tensors, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        if kwargs.get("layout") == "bshd":
            out = out.transpose(1, 2)
        bhsd = tuple(t.transpose(1, 2) for t in tensors) if kwargs.get("layout") == "bshd" else tensors
        _close(out, reference(*bhsd, **want_kw)[0], torch.float32, name)


def test_one_signature_with_other_strides_and_masks_is_served_right_in_any_order() -> None:
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, h, s, 8, generator=g) for h, s in ((4, 5), (2, 7), (2, 7)))
    transposed = tuple(_strided(t, "transposed", g) for t in (q, k, v))
    expanded = tuple(_strided(t, "expanded", g) for t in (q, k, v))
    keep = torch.rand(2, 1, 5, 7, generator=g) > 0.4
    keep[0, :, 0] = False
    other = torch.rand(2, 1, 5, 7, generator=g) > 0.6
    bias = torch.randn(2, 1, 5, 7, generator=g).masked_fill(~other, -math.inf)
    calls = []
    for name, tensors in (("contiguous", (q, k, v)), ("transposed", transposed), ("expanded", expanded)):
        calls += [
            (f"{name} plain", {}, tensors, {}),
            (f"{name} causal", {"causal": True}, tensors, {"causal": True}),
            (f"{name} top-left", {"is_causal": True}, tensors, {"causal": True, "top_left": True}),
            (f"{name} bool mask", {"attn_mask": keep}, tensors, {"mask": keep}),
            (f"{name} other bool mask", {"attn_mask": other}, tensors, {"mask": other}),
            (f"{name} additive mask", {"attn_mask": bias}, tensors, {"mask": bias}),
            (f"{name} mask + window", {"attn_mask": keep, "window": (1, 0)}, tensors, {"mask": keep, "window": (1, 0)}),
            (f"{name} bshd", {"layout": "bshd"}, tuple(t.transpose(1, 2) for t in tensors), {}),
        ]
    _abab(calls)


def test_a_mask_changed_in_place_or_replaced_by_an_equal_shape_is_read_again() -> None:
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, h, s, 16, generator=g) for h, s in ((4, 3), (1, 9), (1, 9)))
    mask = torch.ones(1, 1, 1, 9, dtype=torch.bool)
    for step in range(4):
        out = attnforge.attention(q, k, v, attn_mask=mask)
        _close(out, reference(q, k, v, mask=mask)[0], torch.float32, f"step {step}")
        mask[..., step * 2] = False  # in place, as a decode loop's padding mask object
    for step in range(3):
        fresh = torch.rand(1, 1, 1, 9, generator=g) > 0.5
        fresh[..., step] = True
        _close(attnforge.attention(q, k, v, attn_mask=fresh), reference(q, k, v, mask=fresh)[0], torch.float32)


# -- gradients against the float64 reference --------------------------------------------------------------------
GRAD_CASES = [
    pytest.param({}, id="plain"),
    pytest.param({"causal": True, "sq": 7, "sk": 4}, id="causal-sq-over-sk"),
    pytest.param({"causal": True, "causal_alignment": "top_left", "sq": 3, "sk": 6}, id="top-left-sq-under-sk"),
    pytest.param({"window": (2, 0), "softcap": 3.0, "sinks": True}, id="window-softcap-sinks"),
    pytest.param({"mask": "bool-hidden-row"}, id="bool-mask-hidden-row"),
    pytest.param({"mask": "additive-grad", "causal": True}, id="additive-mask-with-grad"),
    pytest.param({"window": (0, 0), "return_lse": True, "sinks": True}, id="diagonal-window-lse"),
    pytest.param({"layout": "bshd", "window": (1, 1), "dv": 3}, id="bshd-dv"),
]


@pytest.mark.parametrize("case", GRAD_CASES)
def test_gradients_match_the_float64_reference(case: dict[str, Any]) -> None:
    g = torch.Generator().manual_seed(8)
    sq, sk, dv = case.get("sq", 5), case.get("sk", 6), case.get("dv", 8)
    q, k, v = (torch.randn(2, h, s, e, generator=g) for h, s, e in ((4, sq, 8), (2, sk, 8), (2, sk, dv)))
    inputs: dict[str, torch.Tensor] = {"q": q, "k": k, "v": v}
    kwargs: dict[str, Any] = {n: case[n] for n in ("causal", "causal_alignment", "window", "softcap", "return_lse")
                              if n in case}
    feats: dict[str, Any] = {"causal": case.get("causal", False), "window": case.get("window"),
                             "softcap": case.get("softcap"), "top_left": case.get("causal_alignment") == "top_left"}
    if case.get("sinks"):
        inputs["sinks"] = torch.randn(4, generator=g)
    if case.get("mask") == "bool-hidden-row":
        keep = torch.rand(2, 1, sq, sk, generator=g) > 0.4
        keep[:, :, 0] = False
        kwargs["attn_mask"] = feats["mask"] = keep
    elif case.get("mask") == "additive-grad":  # a learned bias (T5's position bias): its gradient too
        inputs["mask"] = torch.randn(1, 4, sq, sk, generator=g)
    layout = case.get("layout", "bhsd")
    ours = {n: t.clone().requires_grad_() for n, t in inputs.items()}
    theirs = {n: t.double().requires_grad_() for n, t in inputs.items()}
    qkv = [ours[n] for n in "qkv"]
    extra = {("attn_mask" if n == "mask" else n): t for n, t in ours.items() if n not in "qkv"}
    got = attnforge.attention(*(t.transpose(1, 2) for t in qkv) if layout == "bshd" else qkv, layout=layout,
                              **kwargs, **extra)
    out, lse = got if case.get("return_lse") else (got, None)
    out = out.transpose(1, 2) if layout == "bshd" else out
    want, want_lse = reference(*(theirs[n] for n in "qkv"), **feats,
                               **{n: t for n, t in theirs.items() if n not in "qkv"})
    weights = torch.randn(out.shape, generator=g)
    loss, want_loss = (out * weights).sum(), (want * weights.double()).sum()
    if lse is not None:
        lse_weights = torch.randn(lse.shape, generator=g)
        loss = loss + (lse * lse_weights).sum()
        want_loss = want_loss + (want_lse * lse_weights.double()).sum()
    grads = torch.autograd.grad(loss, list(ours.values()))
    want_grads = torch.autograd.grad(want_loss, list(theirs.values()))
    for name, got_grad, want_grad in zip(ours, grads, want_grads, strict=True):
        torch.testing.assert_close(got_grad.double(), want_grad, atol=1e-4, rtol=1e-4,
                                   msg=lambda m, n=name: f"d{n}: {m}")


CHECKPOINTED = [
    pytest.param({}, {}, id="plain"),
    pytest.param({"causal": True}, {"causal": True}, id="causal"),
    pytest.param({"mask": True}, {"mask": True}, id="mask"),
    pytest.param({"window": (2, 0), "is_causal": True}, {"window": (2, 0), "causal": True, "top_left": True},
                 id="window-top-left"),
]


@pytest.mark.parametrize(("kwargs", "feats"), CHECKPOINTED)
@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_activation_checkpointing_recomputes_the_same_call_and_its_gradients(
        dispatcher: runtime.Dispatcher, kwargs: dict[str, Any], feats: dict[str, Any], reentrant: bool) -> None:
    """``torch.utils.checkpoint`` around attention() (Hugging Face's gradient checkpointing): non-reentrant
    checkpointing stops the recomputation early by raising ``_StopRecomputationError`` from its saved-tensor hook,
    inside the backend's call. The dispatcher took it for SDPA failing: it warned, skipped SDPA for the signature for
    the rest of the process, and ran the exact math inside the stopped recomputation, which raised "Unexpected state:
    target_frame.early_stop is set". Two steps: the second meets the route and the plan the first one left."""
    g = torch.Generator().manual_seed(14)
    q, k, v = (torch.randn(2, h, s, 16, generator=g) for h, s in ((4, 9), (2, 9), (2, 9)))
    if kwargs.get("mask"):
        keep = torch.rand(2, 1, 9, 9, generator=g) > 0.3
        kwargs, feats = {"attn_mask": keep}, {"mask": keep}
    for _step in range(2):
        ours = [t.clone().requires_grad_() for t in (q, k, v)]
        out = torch.utils.checkpoint.checkpoint(lambda a, b, c: attnforge.attention(a, b, c, **kwargs), *ours,
                                                use_reentrant=reentrant)
        weights = torch.randn(out.shape, generator=g)
        (out * weights).sum().backward()
        theirs = [t.double().requires_grad_() for t in (q, k, v)]
        want = reference(*theirs, **feats)[0]
        (want * weights.double()).sum().backward()
        _close(out, want.detach(), torch.float32)
        for name, got, expected in zip("qkv", ours, theirs, strict=True):
            assert got.grad is not None and expected.grad is not None
            torch.testing.assert_close(got.grad.double(), expected.grad, atol=1e-4, rtol=1e-4,
                                       msg=lambda m, n=name: f"d{n}: {m}")
    assert dispatcher.demoted == {} and dispatcher.broken == {}  # no backend was taken for a failing one


@pytest.mark.parametrize("mode", ["inference_mode", "no_grad"])
def test_calls_inside_inference_mode_and_no_grad_match_and_leave_nothing_behind(mode: str) -> None:
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, h, s, 8, generator=g) for h, s in ((4, 6), (2, 4), (2, 4)))
    keep = torch.rand(2, 1, 6, 4, generator=g) > 0.3
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({}, {}), ({"causal": True}, {"causal": True}), ({"attn_mask": keep}, {"mask": keep}),
        ({"window": (1, 0), "softcap": 2.0}, {"window": (1, 0), "softcap": 2.0}),
    ]
    context = torch.inference_mode() if mode == "inference_mode" else torch.no_grad()
    with context:
        for kwargs, feats in cases:
            _close(attnforge.attention(q, k, v, **kwargs), reference(q, k, v, **feats)[0], torch.float32, str(kwargs))
    for kwargs, feats in cases:  # the same signatures recording gradients afterwards
        qg = q.clone().requires_grad_()
        out = attnforge.attention(qg, k, v, **kwargs)
        _close(out, reference(q, k, v, **feats)[0], torch.float32, f"after {mode}: {kwargs}")
        (grad,) = torch.autograd.grad(out.sum(), qg)
        assert grad.isfinite().all()


# -- regressions ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", [None, "sdpa", "sdpa-math", "exact"])
@pytest.mark.parametrize("mask_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_an_additive_mask_wider_than_half_inputs_keeps_its_precision(backend: str | None, mask_dtype: torch.dtype,
                                                                     dtype: torch.dtype) -> None:
    """An ALiBi-like float32 bias far from 0 (-500 plus small offsets) beside bfloat16 q, k, v: SDPA on CPU takes a
    float32 mask as it is and adds it in float32, as the exact math does; the SDPA adapter cast it to q's dtype first
    (bfloat16's spacing at 500 is 4), and the output was off by up to 1.1 where the reference's values are ~1."""
    g = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(2, h, s, 64, generator=g).to(dtype) for h, s in ((4, 6), (2, 40), (2, 40)))
    bias = (torch.randn(6, 40, generator=g, dtype=torch.float64) * 2 - 500).to(mask_dtype)
    for kwargs, feats in (({}, {}), ({"causal": True}, {"causal": True}), ({"window": (8, 8)}, {"window": (8, 8)})):
        out = attnforge.attention(q, k, v, attn_mask=bias, backend=backend, **kwargs)
        _close(out, reference(q, k, v, mask=bias, **feats)[0], dtype, f"{kwargs}")


def _efficient_kernel_on_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                             *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    """SDPA's memory-efficient op (``aten::_scaled_dot_product_efficient_attention``) played by SDPA itself on the
    CPU, refusing a bias in another dtype than q's as the CUDA kernel does ("invalid dtype for bias")."""
    if bias is not None and bias.dtype != q.dtype:
        raise RuntimeError("invalid dtype for bias - should match query's dtype")
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=kwargs.get("scale"))
    return out.transpose(1, 2).contiguous().transpose(1, 2), torch.empty(0), torch.empty(0), torch.empty(0)


def test_a_decode_bias_from_a_float32_mask_of_finfo_min_hides_as_the_exact_math(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA decode path's bias (:func:`attnforge.backends.sdpa._decode_bias`) copied a float32 mask into q's
    bfloat16 with a plain cast: transformers' hiding value ``torch.finfo(torch.float32).min`` became -inf, and a batch
    row whose keys it hides entirely came back zeros where the exact math (and the reference) give the mean of v, as
    :func:`attnforge.backends._base.narrowed` keeps it for the general path. Run on the CPU through the kernel seam.
    (float16 cannot hold such a value: its lowest, -65504, no longer swamps the logits beside it.)"""
    dtype = torch.bfloat16
    monkeypatch.setattr(torch, "_scaled_dot_product_efficient_attention", _efficient_kernel_on_cpu)
    monkeypatch.setattr(sdpa_module, "_EFFICIENT_DEVICES", frozenset({"cuda", "cpu"}))
    monkeypatch.setattr(sdpa_module, "_REFUSED", {})
    g = torch.Generator().manual_seed(12)
    q = torch.randn(2, 4, 1, 8, generator=g).to(dtype)
    k, v = (torch.randn(2, 2, 19, 8, generator=g).to(dtype) for _ in range(2))
    mask = torch.zeros(2, 1, 1, 19)
    mask[0, ..., :5] = torch.finfo(torch.float32).min
    mask[1] = torch.finfo(torch.float32).min  # every key of batch row 1
    got = sdpa_module._efficient_decode(q, k, v, mask, seen=None, scale=None)
    assert got is not None and sdpa_module._REFUSED == {}
    _close(got, reference(q, k, v, mask=mask)[0], dtype)
    assert got[1].abs().amax() > 0.1  # the mean of v, not zeros


@pytest.mark.parametrize("softcap", [1e39, 1e300, 10**50, 1e-40, 1e-46])
def test_a_softcap_past_float32s_range_is_refused_not_nan(softcap: float) -> None:
    """``softcap=1e300`` passed the check (finite) and is infinite in float32: ``c * tanh(x / c)`` gave
    ``inf * 0 = NaN`` for every logit of a float32 or half call, silently. Under float32's smallest normal a softcap is
    0 or subnormal there: ``1e-46`` gave NaN rows from the exact math and zeros from Flex (CPU fuzz, 2026-12-03)."""
    q, k, v = (torch.randn(1, 2, 3, 8) for _ in range(3))
    with pytest.raises(DispatchError, match="softcap must be positive and a normal float32 number") as err:
        attnforge.attention(q, k, v, softcap=softcap)
    assert err.value.hint
    largest = float(torch.finfo(torch.float32).max)  # still served, and right
    _close(attnforge.attention(q, k, v, softcap=largest), reference(q, k, v, softcap=largest)[0], torch.float32)


@pytest.mark.parametrize("grad", [False, True])
def test_a_scale_over_a_softcap_past_float32s_range_is_refused_not_nan(grad: bool) -> None:
    """Each in range, ``scale=1e30, softcap=1e-10`` multiply the logits by ``scale / softcap = 1e40``, infinite in the
    kernels' float32 (and in the exact math's without a gradient): a logit of 0 became ``inf * 0 = NaN``, whole rows
    NaN without a gradient and right with one (CPU fuzz, 2026-12-03). Refused alike on both paths; a quotient at
    float32's largest is still served, and right."""
    q, k, v = (torch.randn(1, 2, 3, 8, requires_grad=grad) for _ in range(3))
    with torch.no_grad():
        q[0, 0, 0] = 0.0  # a row of logits 0
    with pytest.raises(DispatchError, match="past float32's largest") as err:
        attnforge.attention(q, k, v, scale=1e30, softcap=1e-10)
    assert err.value.hint
    out = attnforge.attention(q, k, v, scale=1e28, softcap=1e-10)  # 1e38: inside float32
    _close(out.detach(), reference(q.detach(), k.detach(), v.detach(), scale=1e28, softcap=1e-10)[0], torch.float32)


def test_a_float8_mask_is_refused_with_a_hint() -> None:
    """A float8 additive mask passed validation (any floating dtype) and raised torch's "Promotion for Float8 Types is
    not supported" from the exact math's ``mask + logits`` with a softcap (CPU fuzz, 2026-12-03)."""
    q, k, v = (torch.randn(1, 2, 3, 8) for _ in range(3))
    mask = torch.zeros(1, 1, 3, 3).to(torch.float8_e4m3fn)
    for kwargs in ({}, {"softcap": 30.0}):
        with pytest.raises(DispatchError, match="bool or floating-point tensor") as err:
            attnforge.attention(q, k, v, attn_mask=mask, **kwargs)
        assert "mask.to(q.dtype)" in (err.value.hint or "")


@dataclasses.dataclass
class _NoBackward:
    """A verified masked kernel without a backward pass (as flex on a CPU): it says so for a call that needs a
    gradient, and its output records nothing for autograd."""

    name: str = "no-backward"
    features: frozenset[str] = frozenset({"mask"})
    calls: int = 0

    def load_error(self) -> str | None:
        return None

    def unsupported_reasons(self, call: AttentionCall) -> list[str]:
        return ["no backward pass"] if call.needs_grad else []

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float | None,
                 attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        self.calls += 1
        return reference(q, k, v, mask=attn_mask, causal=causal, scale=scale)[0].to(q.dtype).detach()


def test_a_mask_that_requires_grad_needs_a_backend_with_a_backward_pass(tmp_path: Path) -> None:
    """A learned additive bias (T5's position bias, ALiBi slopes) beside q, k, v that need none: the call needs a
    backward pass all the same. The featured call's ``needs_grad`` counted q, k, v and sinks but not the mask, so a
    kernel without a backward (this fake; flex on a CPU) served it: an output with no graph, the bias never learned
    (and flex forced on a CPU raised inside Inductor, an IndexError, instead of the refusal)."""
    g = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(1, h, 6, 8, generator=g) for h in (4, 2, 2))
    bias = torch.randn(1, 4, 6, 6, generator=g)
    fake = _NoBackward()
    store = RecordStore(tmp_path / "no-backward")
    store.add_verify(VerifyRecord(device_key=CPU_KEY, backend=fake.name, backend_version="1", ok=True, summary="ok"))
    store.add_bench(faster_records([fake.name], q, k, features=("mask",)))
    previous = runtime.set_dispatcher(runtime.Dispatcher({fake.name: fake}, records=store))
    try:
        _close(attnforge.attention(q, k, v, attn_mask=bias), reference(q, k, v, mask=bias)[0], torch.float32)
        assert fake.calls == 1  # it serves the class without a gradient
        learned = bias.clone().requires_grad_()
        out = attnforge.attention(q, k, v, attn_mask=learned)
        assert fake.calls == 1 and out.requires_grad
        theirs = bias.double().requires_grad_()
        weights = torch.randn(out.shape, generator=g)
        (got,) = torch.autograd.grad((out * weights).sum(), learned)
        (want,) = torch.autograd.grad((reference(q, k, v, mask=theirs)[0] * weights.double()).sum(), theirs)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-4)
    finally:
        runtime.set_dispatcher(previous)
    with pytest.raises(DispatchError, match="cannot serve this call") as err:  # flex: no backward on a CPU
        attnforge.attention(q, k, v, attn_mask=bias.clone().requires_grad_(), backend="flex")
    assert "backward" in str(err.value.cause) and err.value.hint
