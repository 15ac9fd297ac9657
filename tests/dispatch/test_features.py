"""attention()'s features on CPU: numerics against a float64 reference written independently here (a loop per
query row), gradients, dropout, zero-sized inputs, varlen, and the errors for inputs it refuses."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnforge
from attnforge.backends.exact import reference_attention
from attnforge.dispatch import runtime
from attnforge.errors import DispatchError
from attnforge.records import RecordStore
from tests._fakes import count_calls


@pytest.fixture(autouse=True)
def default_dispatcher(tmp_path: Path) -> Iterator[runtime.Dispatcher]:
    """The real registry over an empty record store: SDPA or the exact fallback serve every call."""
    previous = runtime.set_dispatcher(runtime.Dispatcher(records=RecordStore(tmp_path / "home")))
    yield runtime.get_dispatcher()
    runtime.set_dispatcher(previous)


def naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
          scale: float | None = None, attn_mask: torch.Tensor | None = None, top_left: bool = False,
          window: tuple[int | None, int | None] | None = None, softcap: float | None = None,
          sinks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition, one query row at a time in float64: ``(out [B, Hq, Sq, Dv], lse [B, Hq, Sq])``."""
    b, hq, sq, d = q.shape
    hkv, sk, dv = k.shape[1], k.shape[2], v.shape[3]
    s = scale if scale is not None else 1 / math.sqrt(d)
    mask = None if attn_mask is None else attn_mask.expand(b, hq, sq, sk)
    out = torch.zeros(b, hq, sq, dv, dtype=torch.float64)
    lse = torch.full((b, hq, sq), -math.inf, dtype=torch.float64)
    left, right = window or (None, None)
    offset = 0 if top_left else sk - sq
    for bi in range(b):
        for h in range(hq):
            kv = h // (hq // hkv)
            for i in range(sq):
                logits, values = [], []
                for j in range(sk):
                    if causal and j > i + offset:
                        continue
                    if right is not None and j > i + offset + right:
                        continue
                    if left is not None and j < i + offset - left:
                        continue
                    x = float(q[bi, h, i].double() @ k[bi, kv, j].double()) * s
                    if softcap:
                        x = softcap * math.tanh(x / softcap)
                    if mask is not None:
                        if mask.dtype == torch.bool:
                            if not mask[bi, h, i, j]:
                                continue
                        else:
                            x += float(mask[bi, h, i, j])
                    logits.append(x)
                    values.append(v[bi, kv, j].double())
                extra = [float(sinks[h])] if sinks is not None else []
                finite = [x for x in logits + extra if x > -math.inf]
                if not finite:
                    continue
                top = max(finite)
                total = sum(math.exp(x - top) for x in logits + extra)
                lse[bi, h, i] = top + math.log(total)
                for x, val in zip(logits, values, strict=True):
                    out[bi, h, i] += math.exp(x - top) / total * val
    return out, lse


def _inputs(b: int, hq: int, hkv: int, sq: int, sk: int, d: int, dv: int, *, seed: int = 3,  # noqa: PLR0917
            dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, s, e, generator=g, dtype=dtype)
                 for h, s, e in ((hq, sq, d), (hkv, sk, d), (hkv, sk, dv)))


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype = torch.float32) -> None:
    tol = {"atol": 2e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 1e-9, "rtol": 1e-8}
    torch.testing.assert_close(got.double(), want.double(), **tol)


# -- numerics of every feature -------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 2), hkv=st.integers(1, 2), groups=st.integers(1, 2), sq=st.integers(1, 7),
       sk=st.integers(1, 7), d=st.sampled_from([4, 8]), dv=st.sampled_from([4, 8, 6]), causal=st.booleans(),
       top_left=st.booleans(), window=st.none() | st.tuples(st.none() | st.integers(0, 4),
                                                             st.none() | st.integers(0, 3)),
       softcap=st.none() | st.floats(0.5, 5.0), use_sinks=st.booleans(),
       mask=st.sampled_from([None, "bool", "additive", "bool-rows"]), layout=st.sampled_from(["bhsd", "bshd"]),
       scale=st.none() | st.floats(0.1, 1.5), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_every_feature_matches_the_definition(  # noqa: PLR0917 - hypothesis draws
        b: int, hkv: int, groups: int, sq: int, sk: int, d: int, dv: int, causal: bool, top_left: bool,
        window: tuple[int | None, int | None] | None, softcap: float | None, use_sinks: bool, mask: str | None,
        layout: str, scale: float | None, dtype: torch.dtype) -> None:
    hq = hkv * groups
    q, k, v = _inputs(b, hq, hkv, sq, sk, d, dv, dtype=dtype)
    g = torch.Generator().manual_seed(9)
    sinks = torch.randn(hq, generator=g, dtype=dtype) if use_sinks else None
    attn_mask = None
    if mask == "bool":
        attn_mask = torch.rand(b, 1, sq, sk, generator=g) > 0.3
    elif mask == "bool-rows":  # a [Sq, Sk] mask that hides every key from the first query row
        attn_mask = torch.ones(sq, sk, dtype=torch.bool)
        attn_mask[0] = False
    elif mask == "additive":
        attn_mask = torch.randn(1, hq, 1, sk, generator=g, dtype=dtype)
    features: dict[str, Any] = {"causal": causal, "scale": scale, "attn_mask": attn_mask, "window": window,
                                "softcap": softcap, "sinks": sinks}
    alignment = "top_left" if top_left else "bottom_right"
    as_layout = (lambda t: t.transpose(1, 2)) if layout == "bshd" else (lambda t: t)
    out, lse = attnforge.attention(as_layout(q), as_layout(k), as_layout(v), causal_alignment=alignment,
                                   return_lse=True, layout=layout, **features)
    want_out, want_lse = naive(q, k, v, top_left=top_left, **features)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert out.shape == as_layout(want_out).shape and lse.shape == (b, hq, sq)
    _close(as_layout(out), want_out, dtype)
    torch.testing.assert_close(lse.double(), want_lse.float().double(), atol=1e-4, rtol=1e-4)
    plain = attnforge.attention(as_layout(q), as_layout(k), as_layout(v), causal_alignment=alignment,
                                layout=layout, **features)
    _close(as_layout(plain), want_out, dtype)  # without return_lse the same output (maybe another backend)


@pytest.mark.parametrize("feature", ["mask", "window", "softcap", "sinks", "dv", "top_left"])
def test_gradients_of_every_feature_match_the_float64_reference(feature: str) -> None:
    q, k, v = _inputs(2, 4, 2, 5, 7, 8, 6 if feature == "dv" else 8)
    kwargs: dict[str, Any] = {"causal": True}
    if feature == "mask":
        kwargs = {"attn_mask": torch.randn(1, 1, 5, 7)}
    elif feature == "window":
        kwargs["window"] = (2, None)
    elif feature == "softcap":
        kwargs["softcap"] = 1.5
    elif feature == "sinks":
        kwargs["sinks"] = torch.randn(4).requires_grad_()
    elif feature == "top_left":
        kwargs["causal_alignment"] = "top_left"
    leaves = [t.requires_grad_() for t in (q, k, v)]
    if "sinks" in kwargs:
        leaves.append(kwargs["sinks"])
    out = attnforge.attention(q, k, v, **kwargs)
    weights = torch.randn(out.shape, dtype=torch.float64)
    grads = torch.autograd.grad((out.double() * weights).sum(), leaves)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    extra = {key: val for key, val in kwargs.items() if key != "sinks"}
    sinks64 = kwargs["sinks"].detach().double().requires_grad_() if "sinks" in kwargs else None
    ref = reference_attention(q64, k64, v64, sinks=sinks64, **extra)
    want = torch.autograd.grad((ref * weights).sum(), [q64, k64, v64] + ([sinks64] if sinks64 is not None else []))
    for got, expect in zip(grads, want, strict=True):
        torch.testing.assert_close(got.double(), expect, atol=1e-4, rtol=1e-4)


def test_dropout_is_reproducible_from_the_seed_and_unbiased() -> None:
    q, k, v = _inputs(1, 2, 2, 6, 6, 8, 8)
    torch.manual_seed(0)
    first = attnforge.attention(q, k, v, dropout_p=0.3)
    torch.manual_seed(0)
    again = attnforge.attention(q, k, v, dropout_p=0.3)
    torch.testing.assert_close(first, again)
    plain = attnforge.attention(q, k, v)
    assert not torch.allclose(first, plain)
    torch.manual_seed(1)
    mean = torch.stack([attnforge.attention(q, k, v, dropout_p=0.3) for _ in range(400)]).mean(0)
    torch.testing.assert_close(mean, plain, atol=0.15, rtol=0)  # E[dropout(P) V] = P V
    for backend in ("exact", "sdpa"):
        torch.manual_seed(0)
        a = attnforge.attention(q, k, v, dropout_p=0.3, backend=backend)
        torch.manual_seed(0)
        torch.testing.assert_close(a, attnforge.attention(q, k, v, dropout_p=0.3, backend=backend))


def test_is_causal_means_sdpas_top_left_and_causal_keeps_bottom_right() -> None:
    q, k, v = _inputs(1, 2, 2, 3, 5, 8, 8)  # Sq != Sk: the alignments differ
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(attnforge.attention(q, k, v, is_causal=True), sdpa)
    torch.testing.assert_close(attnforge.attention(q, k, v, is_causal=True, causal_alignment="top_left"), sdpa)
    torch.testing.assert_close(attnforge.attention(q, k, v, causal=True, is_causal=True, causal_alignment="top_left"),
                               sdpa)
    bottom_right = attnforge.attention(q, k, v, causal=True)
    assert (bottom_right - sdpa).abs().max() > 0.1
    torch.testing.assert_close(bottom_right, reference_attention(q, k, v, causal=True).float())
    torch.testing.assert_close(attnforge.attention(q, k, v, is_causal=False), attnforge.attention(q, k, v))
    for both in ({"causal": True, "is_causal": False}, {"causal": True, "is_causal": True}):
        with pytest.raises(DispatchError, match="disagree") as err:
            attnforge.attention(q, k, v, **both)
        assert err.value.hint and "top_left" in err.value.hint


# -- zero-sized inputs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("sizes", [(0, 2, 2, 4, 4), (1, 2, 2, 0, 4), (1, 2, 2, 4, 0), (1, 2, 2, 0, 0),
                                   (2, 4, 2, 3, 0)])
@pytest.mark.parametrize("kwargs", [{}, {"causal": True}, {"window": (1, 0), "sinks": "sinks"},
                                    {"return_lse": True}], ids=["plain", "causal", "features", "lse"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_zero_sized_inputs_return_the_right_empty_result(sizes: tuple[int, ...], kwargs: dict[str, Any],
                                                         layout: str) -> None:
    b, hq, hkv, sq, sk = sizes
    q, k, v = (t.requires_grad_() for t in _inputs(b, hq, hkv, sq, sk, 8, 6))
    kwargs = {key: (torch.zeros(hq) if val == "sinks" else val) for key, val in kwargs.items()}
    as_layout = (lambda t: t.transpose(1, 2)) if layout == "bshd" else (lambda t: t)
    result = attnforge.attention(as_layout(q), as_layout(k), as_layout(v), layout=layout, **kwargs)
    out = result[0] if kwargs.get("return_lse") else result
    assert as_layout(out).shape == (b, hq, sq, 6)
    assert not out.abs().any()  # no key to see: zeros
    if kwargs.get("return_lse"):
        assert result[1].shape == (b, hq, sq) and bool((result[1] == -math.inf).all())
    out.sum().backward()
    assert all(t.grad is not None and not t.grad.any() for t in (q, k, v))


@pytest.mark.parametrize(("d", "dv"), [(0, 6), (8, 0), (0, 0)])
def test_zero_head_dims_never_reach_a_kernel(d: int, dv: int) -> None:
    q, k, v = _inputs(1, 2, 2, 3, 4, d, dv)
    out = attnforge.attention(q, k, v, causal=True)
    assert out.shape == (1, 2, 3, dv)
    if d == 0 and dv:  # every logit is 0: each row averages the values it sees
        want, _ = naive(q, k, v, causal=True, scale=1.0)
        _close(out, want)


# -- varlen ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{}, {"causal": True}, {"window": (1, 1), "softcap": 2.0},
                                    {"causal": True, "causal_alignment": "top_left"}])
def test_varlen_equals_each_sequence_on_its_own(kwargs: dict[str, Any]) -> None:
    lens_q, lens_k = [3, 1, 4], [5, 2, 4]
    g = torch.Generator().manual_seed(4)
    q = torch.randn(sum(lens_q), 4, 8, generator=g)
    k = torch.randn(sum(lens_k), 2, 8, generator=g)
    v = torch.randn(sum(lens_k), 2, 6, generator=g)
    cu_q = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 7, 11], dtype=torch.int32)
    out, lse = attnforge.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True, **kwargs)
    assert out.shape == (8, 4, 6) and lse.shape == (4, 8)
    alignment = kwargs.pop("causal_alignment", "bottom_right")
    for i in range(3):
        qs, ks, vs = (t[c[i]:c[i + 1]].transpose(0, 1).unsqueeze(0)
                      for t, c in ((q, cu_q), (k, cu_k), (v, cu_k)))
        want, want_lse = naive(qs, ks, vs, top_left=alignment == "top_left", **kwargs)
        _close(out[cu_q[i]:cu_q[i + 1]].transpose(0, 1).unsqueeze(0), want)
        torch.testing.assert_close(lse[:, cu_q[i]:cu_q[i + 1]].double(), want_lse[0], atol=1e-4, rtol=1e-4)


def test_one_offsets_tensor_is_read_once_until_it_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Self-attention offsets (one tensor as both ``cu_seqlens``) are read on the host once per tensor object and
    version: a model's layers share one; an in-place change, or two different tensors, are read again, and bad
    offsets after a change are still refused."""
    from attnforge.dispatch import inputs

    reads = count_calls(monkeypatch, inputs, "_read_offsets")
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(8, h, 8, generator=g) for h in (4, 2, 2))
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    first = attnforge.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)
    attnforge.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)
    assert len(reads) == 1
    attnforge.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu.clone(), causal=True)
    assert len(reads) == 2
    cu[1] = 5  # in place: read again, and the answer follows the new offsets
    moved = attnforge.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)
    assert len(reads) == 3 and not torch.equal(first, moved)
    cu[2] = 7
    with pytest.raises(DispatchError, match="cu_seqlens do not describe"):
        attnforge.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)


# -- paged KV -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{}, {"causal": True}, {"window": (2, 0), "sinks": "sinks"},
                                    {"causal": True, "causal_alignment": "top_left"}])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_paged_kv_equals_the_gathered_pages(kwargs: dict[str, Any], layout: str) -> None:
    g = torch.Generator().manual_seed(6)
    pool_k, pool_v = torch.randn(7, 4, 2, 8, generator=g), torch.randn(7, 4, 2, 6, generator=g)
    block_table = torch.tensor([[5, 0, 3], [1, 6, 2]], dtype=torch.int32)
    used = torch.tensor([10, 5], dtype=torch.int32)
    q = torch.randn(2, 4, 3, 8, generator=g)
    kwargs = {key: (torch.randn(4, generator=g) if val == "sinks" else val) for key, val in kwargs.items()}
    qi = q.transpose(1, 2) if layout == "bshd" else q
    out = attnforge.attention(qi, pool_k, pool_v, block_table=block_table, seqused_k=used, layout=layout,
                              **kwargs)
    out = out.transpose(1, 2) if layout == "bshd" else out
    assert out.shape == (2, 4, 3, 6)
    alignment = kwargs.pop("causal_alignment", "bottom_right")
    for b in range(2):
        k, v = (pool[block_table[b].long()].flatten(0, 1)[: used[b]].transpose(0, 1).unsqueeze(0)
                for pool in (pool_k, pool_v))
        want, _ = naive(q[b : b + 1], k, v, top_left=alignment == "top_left", **kwargs)
        _close(out[b : b + 1], want)
    reasons = {r.backend: r.reasons for r in attnforge.explain(q, pool_k, pool_v, block_table=block_table).rejected}
    assert "does not support paged" in reasons["sdpa"]


@pytest.mark.parametrize("kwargs", [{"is_causal": True}, {"causal": True, "causal_alignment": "top_left"}])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_a_paged_call_keeps_top_left_where_its_pools_dims_match_sq(kwargs: dict[str, Any], layout: str) -> None:
    """attention() turns top-left causal into bottom-right where Sq == Sk, read from q's and k's shapes; a paged
    call's k is a page pool ``[blocks, page_size, Hkv, D]`` whose dims there are not Sk. With Sq equal to the pool's
    Hkv (bhsd) or page size (bshd), the call is still aligned top-left, as the gathered pages' reference."""
    g = torch.Generator().manual_seed(7)
    pool_k, pool_v = torch.randn(7, 4, 2, 8, generator=g), torch.randn(7, 4, 2, 8, generator=g)
    block_table = torch.tensor([[5, 0, 3], [1, 6, 2]], dtype=torch.int32)
    used = torch.tensor([10, 7], dtype=torch.int32)
    sq = pool_k.shape[1] if layout == "bshd" else pool_k.shape[2]
    q = torch.randn(2, 4, sq, 8, generator=g)
    qi = q.transpose(1, 2) if layout == "bshd" else q
    out = attnforge.attention(qi, pool_k, pool_v, block_table=block_table, seqused_k=used, layout=layout, **kwargs)
    out = out.transpose(1, 2) if layout == "bshd" else out
    for b in range(2):
        k, v = (pool[block_table[b].long()].flatten(0, 1)[: used[b]].transpose(0, 1).unsqueeze(0)
                for pool in (pool_k, pool_v))
        want, _ = naive(q[b : b + 1], k, v, causal=True, top_left=True)
        _close(out[b : b + 1], want)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"block_table": torch.tensor([[0, 9]], dtype=torch.int32)}, "outside"),
    ({"block_table": torch.tensor([0, 1], dtype=torch.int32)}, "2-D"),
    ({"block_table": torch.tensor([[0, 1]], dtype=torch.int32), "seqused_k": torch.tensor([99])}, "seqused_k"),
    ({"block_table": torch.tensor([[-1, 1]], dtype=torch.int32)}, "outside"),
    ({"block_table": torch.tensor([[0, 1]], dtype=torch.int32),
      "seqused_k": torch.tensor([9], dtype=torch.int32)}, r"within 0\.\.8"),
    ({"block_table": torch.tensor([[0, 1]], dtype=torch.int32),
      "seqused_k": torch.tensor([-2], dtype=torch.int32)}, "got values -2..-2"),
    ({"block_table": torch.tensor([[0, 1]], dtype=torch.int32),
      "seqused_k": torch.tensor([3, 4], dtype=torch.int32)}, r"got \(2,\)"),
    ({"seqused_k": torch.tensor([3])}, "without block_table"),
    ({"block_table": torch.tensor([[0, 1], [1, 0]], dtype=torch.int32)}, "rows"),
])
def test_bad_paged_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    q = torch.randn(1, 4, 3, 8)
    pool = torch.randn(3, 4, 2, 8)
    with pytest.raises(DispatchError, match=message):
        attnforge.attention(q, pool, pool, **kwargs)


# -- refused inputs -------------------------------------------------------------------------------------
def test_a_packed_input_without_cu_seqlens_says_what_to_pass() -> None:
    q = torch.randn(10, 2, 8)
    with pytest.raises(DispatchError, match="cu_seqlens") as err:
        attnforge.attention(q, q, q)
    assert err.value.hint and "unsqueeze" in err.value.hint


def test_a_nested_tensor_is_refused_with_a_hint() -> None:
    nt = torch.nested.nested_tensor([torch.randn(3, 2, 8), torch.randn(5, 2, 8)], layout=torch.jagged)
    with pytest.raises(DispatchError, match="nested") as err:
        attnforge.attention(nt, nt, nt)
    assert err.value.hint and "cu_seqlens" in err.value.hint


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype")
@pytest.mark.parametrize("layout", [torch.strided, torch.jagged])
@pytest.mark.parametrize("kwargs", [{}, {"causal": True}, {"is_causal": True}, {"enable_gqa": False},
                                    {"window": (2, 0)}], ids=["plain", "causal", "is_causal", "no-gqa", "window"])
@pytest.mark.parametrize("which", ["q", "k"])
def test_a_nested_tensor_ragged_in_its_length_is_refused_on_every_path(
        layout: torch.layout, kwargs: dict[str, object], which: str) -> None:
    """Ragged in S (``[B, H, j, D]``): a strided nested tensor's ``.shape`` raises RuntimeError, and a jagged one's
    unpacks into a nested int that passed the shape checks and failed later (AttributeError 'NestedIntNode' ...).
    Both reached the caller as torch's internal errors, on the plain path and on SDPA's spelling of it."""
    nt = torch.nested.nested_tensor([torch.randn(2, 3, 8), torch.randn(2, 5, 8)], layout=layout)
    dense = torch.randn(2, 2, 4, 8)
    q, k = (nt, dense) if which == "q" else (dense, nt)
    with pytest.raises(DispatchError, match=f"{which} is a nested tensor") as err:
        attnforge.attention(q, k, k, **kwargs)  # type: ignore[arg-type]
    assert err.value.hint and "cu_seqlens" in err.value.hint


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype")
def test_a_nested_mask_is_named_as_nested_not_as_a_wrong_dtype() -> None:
    x = torch.randn(2, 2, 4, 8)
    mask = torch.nested.nested_tensor([torch.zeros(4, 4), torch.zeros(4, 4)])
    with pytest.raises(DispatchError, match="attn_mask is a nested tensor") as err:
        attnforge.attention(x, x, x, attn_mask=mask)
    assert err.value.hint and "to_padded_tensor" in err.value.hint


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"dropout_p": 1.0}, "dropout_p"),
    ({"window": (1, 2, 3)}, "window must be"),
    ({"softcap": -1.0}, "softcap must be positive"),
    ({"sinks": torch.zeros(3)}, "sinks must be"),
    ({"attn_mask": torch.ones(3, 3)}, "does not broadcast"),
    ({"attn_mask": torch.ones(4, 5, dtype=torch.int64)}, "bool or floating"),
    ({"causal_alignment": "middle", "causal": True}, "causal_alignment"),
    ({"enable_gqa": False}, "enable_gqa"),
    ({"cu_seqlens_q": torch.tensor([0, 4], dtype=torch.int32)}, "both"),
])
def test_bad_feature_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    q, k, v = _inputs(1, 4, 2, 4, 5, 8, 8)
    with pytest.raises(DispatchError, match=message):
        attnforge.attention(q, k, v, **kwargs)


def test_an_additive_mask_in_another_dtype_and_causal_combine() -> None:
    q, k, v = (t.to(torch.bfloat16) for t in _inputs(1, 2, 2, 4, 6, 8, 8))
    mask = torch.randn(4, 6)  # float32 with bfloat16 inputs
    out = attnforge.attention(q, k, v, attn_mask=mask, causal=True)
    want, _ = naive(q, k, v, attn_mask=mask, causal=True)
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)


def test_the_exact_math_in_row_chunks_equals_one_step(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnforge.backends import exact

    q, k, v = _inputs(2, 4, 2, 9, 11, 8, 6)
    mask = torch.randn(2, 1, 9, 11)
    kwargs: dict[str, Any] = {"causal": True, "window": (4, None), "sinks": torch.randn(4), "attn_mask": mask,
                              "return_lse": True}
    whole = exact.exact_attention(q, k, v, **kwargs)
    monkeypatch.setattr(exact, "CHUNK_ELEMENTS", 2 * 4 * 11 * 2)  # two query rows per step
    chunked = exact.exact_attention(q, k, v, **kwargs)
    for a, b in zip(whole, chunked, strict=True):
        torch.testing.assert_close(a, b)


def test_the_exact_math_of_a_gqa_decode_call_launches_few_ops() -> None:
    """Gemma-2's decode call (GQA, a padding mask, softcap) is served by the exact math on a GPU, where each torch op
    is a kernel launch of ~10 µs host time (H200 host, 2026-11-28, docs/benchmarks.md): K/V are read as they are
    (the query heads of one K/V head folded into its rows: no copy of K/V per query head, ``repeat_interleave``'s
    several kernels before), the mask applied with one ``where`` (no ``~mask`` first), a row's non-finite peak
    zeroed with one ``nan_to_num``."""
    from torch.profiler import ProfilerActivity, profile

    from attnforge.backends.exact import exact_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, s, 16, generator=g, dtype=torch.bfloat16) for h, s in ((8, 1), (4, 70), (4, 70)))
    mask = torch.rand(2, 1, 1, 70, generator=g) > 0.2
    exact_attention(q, k, v, attn_mask=mask, softcap=50.0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = exact_attention(q, k, v, attn_mask=mask, softcap=50.0)
    top = [e for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None]
    ops = [e.name for e in top]
    copying = [e.name for e in top if any(c.name == "aten::copy_" for c in e.cpu_children)]
    views = {"aten::alias", "aten::transpose", "aten::detach", "aten::unsqueeze", "aten::expand", "aten::view",
             "aten::reshape"}
    launching = [name for name in ops if name not in views]
    assert "aten::repeat_interleave" not in ops and "aten::bitwise_not" not in ops, ops
    assert "aten::reshape" not in copying and "aten::expand" not in ops, copying  # K/V not copied per query head
    # 23 before 2026-11-28 (repeat_interleave), 20 with one expanded copy of K and of V, 18 reading K/V as they are,
    # 12 with torch.softmax and in-place scaling where nothing records a gradient or reads the lse
    assert len(launching) <= 12, launching
    want, _ = naive(q.double(), k.double(), v.double(), attn_mask=mask, softcap=50.0)
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)


def _bmm_with_out_dtype_as_cuda_has_it(real: Any) -> Any:
    """torch.bmm as torch's CUDA build runs ``bmm(a, b, out_dtype=torch.float32)`` on half-precision inputs (the
    CPU build has no kernel for it): products of the inputs summed in float32, a float32 result."""
    def bmm(a: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        if out_dtype is None:
            return real(a, b)
        assert a.dtype == b.dtype and a.dtype in (torch.float16, torch.bfloat16) and out_dtype == torch.float32
        with torch.profiler.record_function("bmm.dtype"):  # one kernel on CUDA: the casts here are not counted
            return real(a.to(out_dtype), b.to(out_dtype))
    return bmm


def _baddbmm_with_out_dtype_as_cuda_has_it(real: Any) -> Any:
    """torch.baddbmm as torch's CUDA build runs ``baddbmm(c, a, b, beta=0, alpha=s, out_dtype=torch.float32)`` on
    half-precision inputs: the float32 sums of ``a @ b``, each multiplied by ``s`` once in float32 (the GEMM's
    epilogue), ``c`` ignored."""
    def baddbmm(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: float = 1.0, alpha: float = 1.0,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
        if out_dtype is None:
            return real(c, a, b, beta=beta, alpha=alpha)
        assert a.dtype == b.dtype and a.dtype in (torch.float16, torch.bfloat16) and out_dtype == torch.float32
        assert beta == 0 and c.dtype == out_dtype
        with torch.profiler.record_function("baddbmm.dtype"):  # one kernel on CUDA
            return torch.bmm(a.to(out_dtype), b.to(out_dtype)).mul_(alpha)
    return baddbmm


@pytest.mark.parametrize("mask_kind", ["bool", "additive-bf16", "additive-f32", "none"])
def test_the_exact_decode_math_takes_half_precision_q_and_k_as_they_are(
        monkeypatch: pytest.MonkeyPatch, mask_kind: str) -> None:
    """Where the device has ``bmm(..., out_dtype=float32)`` (CUDA), a decode call's logits come from one matmul of
    the bfloat16 q and K (no cast kernels, no float32 copy of the cache), and softcap's last multiply and an additive
    mask are one kernel: 9 launches for Gemma-2's call with its additive mask, the same values as the casts give."""
    from torch.profiler import ProfilerActivity, profile

    from attnforge.backends import exact

    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, h, 1, 16, generator=g).to(torch.bfloat16) if s == 1 else
               torch.randn(2, h, s, 16, generator=g).to(torch.bfloat16) for h, s in ((8, 1), (4, 70), (4, 70)))
    hidden = torch.rand(2, 1, 1, 70, generator=g) < 0.3
    hidden[1] = True  # a row that sees no key: zeros
    mask = {"bool": ~hidden, "none": None,
            "additive-bf16": torch.zeros(2, 1, 1, 70, dtype=torch.bfloat16).masked_fill(hidden, float("-inf")),
            "additive-f32": torch.zeros(2, 1, 1, 70).masked_fill(hidden, float("-inf"))}[mask_kind]
    cast = exact.exact_attention(q, k, v, attn_mask=mask, softcap=50.0)  # this CPU: the casts
    assert exact._MIXED_MATMUL.get("cpu") is None  # not even tried on a device without the kernel
    monkeypatch.setitem(exact._MIXED_MATMUL, "cpu", True)
    monkeypatch.setitem(exact._SCALED_MATMUL, "cpu", True)
    monkeypatch.setattr(torch, "bmm", _bmm_with_out_dtype_as_cuda_has_it(torch.bmm))
    monkeypatch.setattr(torch, "baddbmm", _baddbmm_with_out_dtype_as_cuda_has_it(torch.baddbmm))
    calls = []
    for _layer in range(2):  # the first call makes the zero scalar baddbmm ignores, once
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            mixed = exact.exact_attention(q, k, v, attn_mask=mask, softcap=50.0)
        torch.testing.assert_close(mixed, cast, atol=0, rtol=0)
        if mask is not None:
            assert mixed[1].abs().max() == 0
        calls.append([e.name for e in prof.events() if (e.name.startswith("aten::") or e.name.endswith("mm.dtype"))
                      and e.cpu_parent is None])
    views = {"aten::alias", "aten::transpose", "aten::view", "aten::reshape", "aten::expand"}
    for top in calls:
        # one matmul for the logits, their first multiply in it (the last one, softcap's, is an additive mask's
        # add, else a multiply); v's cast and the output's: q's and K's are gone
        assert top.count("baddbmm.dtype") == 1 and "bmm.dtype" not in top, top
        assert top.count("aten::mul_") == (not mask_kind.startswith("additive")), top
        assert len([name for name in top if name in ("aten::to", "aten::_to_copy")]) == 2, top
    first, later = ([name for name in top if name not in views] for top in calls)
    # v's cast, the matmul, tanh, the last multiply (with an additive mask: its add), softmax, the hidden rows'
    # zeros, the matmul with V, the output's cast: 8 with an additive mask (12 on 2026-11-27, 9 with the bmm); a
    # bool mask adds its where
    assert len(later) <= {"none": 7, "bool": 9}.get(mask_kind, 8), later
    assert len(first) <= len(later) + 1, first  # + the zero scalar, once


def test_the_exact_math_takes_the_casts_where_bmm_with_out_dtype_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device type whose torch lacks ``bmm(..., out_dtype=)`` raises on the first try; that call and every later
    one take the casts, with the same values."""
    from attnforge.backends import exact

    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, h, s, 8, generator=g).to(torch.float16) for h, s in ((4, 1), (2, 9), (2, 9)))
    want = exact.exact_attention(q, k, v, softcap=20.0)
    monkeypatch.setitem(exact._MIXED_MATMUL, "cpu", True)  # as if the device had it: torch 2.13's CPU raises
    got = exact.exact_attention(q, k, v, softcap=20.0)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert exact._MIXED_MATMUL["cpu"] is False


def test_the_exact_math_multiplies_after_bmm_where_baddbmm_with_out_dtype_raises(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A device type with ``bmm(..., out_dtype=)`` but not ``baddbmm(..., out_dtype=)``: the first try raises, that
    call and every later one take the bmm and a multiply, with the same values; the bmm stays on."""
    from attnforge.backends import exact

    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, h, s, 8, generator=g).to(torch.bfloat16) for h, s in ((4, 1), (2, 9), (2, 9)))
    want = exact.exact_attention(q, k, v, softcap=20.0, scale=0.3)
    monkeypatch.setitem(exact._MIXED_MATMUL, "cpu", True)
    monkeypatch.setattr(torch, "bmm", _bmm_with_out_dtype_as_cuda_has_it(torch.bmm))
    with torch.no_grad():
        for _ in range(2):
            got = exact.exact_attention(q, k, v, softcap=20.0, scale=0.3)  # torch 2.13's CPU baddbmm raises
            torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert exact._SCALED_MATMUL["cpu"] is False and exact._MIXED_MATMUL["cpu"] is True


def test_the_exact_math_takes_bmm_not_baddbmm_while_torch_compile_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    """``aten::baddbmm.dtype`` does not trace under torch.compile (its fake tensors reject the keywords, torch
    2.13): while tracing, the logits come from the bmm and a multiply, with the same values."""
    from attnforge.backends import exact

    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, h, s, 8, generator=g).to(torch.bfloat16) for h, s in ((4, 1), (2, 9), (2, 9)))
    want = exact.exact_attention(q, k, v, softcap=20.0, scale=0.3)

    def untraceable(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise AssertionError("baddbmm with out_dtype while tracing")

    monkeypatch.setitem(exact._MIXED_MATMUL, "cpu", True)
    monkeypatch.setitem(exact._SCALED_MATMUL, "cpu", True)
    monkeypatch.setattr(torch, "bmm", _bmm_with_out_dtype_as_cuda_has_it(torch.bmm))
    monkeypatch.setattr(torch, "baddbmm", untraceable)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with torch.no_grad():
        got = exact.exact_attention(q, k, v, softcap=20.0, scale=0.3)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert exact._SCALED_MATMUL["cpu"] is True  # not turned off: only skipped while tracing


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                   RuntimeError("CUDA error: an illegal memory access was encountered")],
                         ids=["oom", "cuda-error"])
def test_the_devices_state_in_the_exact_maths_one_matmul_reaches_the_caller(
        monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    """Out of memory or a CUDA error in ``bmm(..., out_dtype=)`` is the device's state, not a missing kernel
    (:func:`attnforge.backends._base.device_state`): it reaches the caller (whose rule for it applies) and the
    kernel stays on for the next call."""
    from attnforge.backends import exact

    real = torch.bmm

    def bmm(a: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        if out_dtype is not None:
            raise error
        return real(a, b)

    monkeypatch.setitem(exact._MIXED_MATMUL, "cpu", True)
    monkeypatch.setattr(torch, "bmm", bmm)
    q, k, v = (torch.randn(1, h, s, 8).to(torch.float16) for h, s in ((4, 1), (2, 9), (2, 9)))
    with torch.no_grad(), pytest.raises(type(error)):
        exact.exact_attention(q, k, v)
    assert exact._MIXED_MATMUL["cpu"] is True


@pytest.mark.parametrize("softcap", [None, 30.0])
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
def test_the_exact_math_without_grad_equals_its_general_path(softcap: float | None, mask_kind: str) -> None:
    """Where nothing records a gradient or reads the lse, the exact math takes torch.softmax and in-place scaling
    (fewer kernel launches): the same values as the path a backward pass takes, zeros for a row that hides every key,
    and that path's gradients stay finite there."""
    from attnforge.backends.exact import exact_attention

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, h, s, 16, generator=g, dtype=torch.float32) for h, s in ((8, 3), (4, 40), (4, 40)))
    hidden = torch.rand(2, 1, 3, 40, generator=g) < 0.3
    hidden[1, :, 0] = True  # a row that sees no key
    mask = {"bool": ~hidden, "additive": torch.zeros(2, 1, 3, 40).masked_fill(hidden, float("-inf")),
            "none": None}[mask_kind]
    with torch.no_grad():
        fast = exact_attention(q, k, v, attn_mask=mask, softcap=softcap, window=(5, 2))
    q.requires_grad_()
    general = exact_attention(q, k, v, attn_mask=mask, softcap=softcap, window=(5, 2))
    torch.testing.assert_close(fast, general.detach())
    if mask is not None:
        assert fast[1, :, 0].abs().max() == 0
    (grad,) = torch.autograd.grad(general.sum(), q)
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("kwargs", [{"softcap": 5.0}, {"sinks": "zeros"}, {"softcap": 5.0, "return_lse": True},
                                    {"window": (3, 0), "softcap": 2.0}, {"attn_mask": "bool"}])
def test_a_bshd_calls_output_is_contiguous_bshd_as_flash_attn_funcs_is(kwargs: dict[str, Any]) -> None:
    """A ``layout="bshd"`` caller (flash-attn's convention) reshapes the output with ``out.view(B, S, -1)``: the exact
    math for a softcap or sinks returned a transposed bhsd view, which ``view`` refuses (2026-12-02)."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 16, h, 8, generator=g) for h in (4, 2, 2))
    extra = dict(kwargs)
    if extra.get("sinks") == "zeros":
        extra["sinks"] = torch.zeros(4)
    if extra.get("attn_mask") == "bool":
        extra["attn_mask"] = torch.ones(16, 16, dtype=torch.bool).tril()
    got = attnforge.attention(q, k, v, layout="bshd", **extra)
    out = got[0] if isinstance(got, tuple) else got
    assert out.shape == (2, 16, 4, 8) and out.is_contiguous()
    flat = out.view(2, 16, -1)  # raised "view size is not compatible with input tensor's size and stride"
    want = attnforge.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **extra)
    want = (want[0] if isinstance(want, tuple) else want).transpose(1, 2)
    torch.testing.assert_close(flat, want.reshape(2, 16, -1))


@pytest.mark.parametrize("case", ["dv-differs", "exact", "compiled", "compiled-softcap"])
def test_every_bshd_route_returns_contiguous_bshd(case: str) -> None:
    """The plain route on SDPA's math for Dv != D and a forced exact math transposed a bhsd output back without a copy,
    and a compiled bshd call returned the op's bhsd output transposed: ``out.view(B, S, -1)`` raised in each
    (review, 2026-12-02)."""
    g = torch.Generator().manual_seed(6)
    q, k = torch.randn(2, 8, 4, 64, generator=g), torch.randn(2, 8, 4, 64, generator=g)
    v = torch.randn(2, 8, 4, 16 if case == "dv-differs" else 64, generator=g)
    kwargs: dict[str, Any] = {"softcap": 3.0} if case == "compiled-softcap" else {}
    if case == "exact":
        kwargs["backend"] = "exact"

    def flat(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnforge.attention(q, k, v, layout="bshd", **kwargs).view(2, 8, -1)

    fn = torch.compile(flat, backend="aot_eager", fullgraph=True) if case.startswith("compiled") else flat
    got = fn(q, k, v)
    want = attnforge.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kwargs).transpose(1, 2)
    torch.testing.assert_close(got, want.reshape(2, 8, -1))
