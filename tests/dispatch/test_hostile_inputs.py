"""attention() as a hostile user calls it (issue 31 items 3 and 4).

Three properties, each table-driven and over hypothesis shapes:

- every bad argument raises :class:`DispatchError` with a hint, before any backend runs;
- every accepted call is answered right (an independent float64 reference written here in plain torch math,
  not attnforge's exact adapter) and no backend raises on it (a backend that raised warns, and warnings are
  errors in this suite; the dispatcher's failure memory stays empty);
- no bad or failing call poisons others: after it, a valid call of the same shape class is served by the same
  backend as before (a fake at the ``Dispatcher(adapters=...)`` seam), and a backend that raises on one
  signature is skipped for that signature only, for its class only after it raised on three.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.autograd import forward_ad
from torch.utils._python_dispatch import TorchDispatchMode

import attnforge
from attnforge.backends.adapter import FEATURES, AttentionCall
from attnforge.dispatch import runtime
from attnforge.dispatch.failures import CLASS_AFTER, unrecorded_context
from attnforge.errors import DispatchError
from attnforge.records import RecordStore, VerifyRecord
from tests.dispatch._measured import CPU_KEY, faster_records

B, HQ, HKV, SQ, SK, D = 2, 4, 2, 5, 7, 8


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor | None = None,
              causal: bool = False, top_left: bool = False, window: tuple[int | None, int | None] | None = None,
              softcap: float | None = None, scale: float | None = None) -> torch.Tensor:
    """Attention by its definition, in float64: bhsd ``[B, Hq, Sq, Dv]``; rows that see no key are zeros.

    Query ``i`` is aligned to ``i' = i`` (top-left) or ``i + Sk - Sq`` (bottom-right); causal keeps keys
    ``j <= i'``, a window ``(left, right)`` keeps ``i' - left <= j <= i' + right`` (None: unbounded)."""
    q, k, v = q.double(), k.double(), v.double()
    sq, sk, group = q.shape[2], k.shape[2], q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    logits = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(q.shape[3]))
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    i = torch.arange(sq)[:, None] + (0 if top_left else sk - sq)
    j = torch.arange(sk)[None, :]
    visible = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        visible &= j <= i
    if window is not None:
        left, right = window
        if left is not None:
            visible &= j >= i - left
        if right is not None:
            visible &= j <= i + right
    if mask is not None:
        if mask.dtype == torch.bool:
            visible = visible & mask
        else:
            logits = logits + mask.double()
    logits = logits.masked_fill(~visible, -math.inf)
    probs = torch.softmax(logits, dim=-1).nan_to_num(nan=0.0)  # a row with no key: all -inf, NaN, zeros
    return probs @ v


def _qkv(sq: int = SQ, sk: int = SK, dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, h, s, D, generator=g, dtype=dtype) for h, s in ((HQ, sq), (HKV, sk), (HKV, sk)))


@pytest.fixture
def real(tmp_path: Path) -> Iterator[runtime.Dispatcher]:
    """The real registry over an empty record store: on CPU plain SDPA, then the exact math, serve every call."""
    previous = runtime.set_dispatcher(runtime.Dispatcher(records=RecordStore(tmp_path / "real")))
    yield runtime.get_dispatcher()
    runtime.set_dispatcher(previous)


# -- bad input: a DispatchError with a hint, and nothing remembered ------------------------------------------
def _mask(*shape: int, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    return torch.ones(*shape, dtype=dtype)


def _cu(*offsets: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.tensor(offsets, dtype=dtype)


PACKED = {"q": (17, HQ, D), "k": (17, HKV, D), "v": (17, HKV, D)}
CU = {"cu_seqlens_q": _cu(0, 5, 17), "cu_seqlens_k": _cu(0, 5, 17)}
POOL = {"q": (B, HQ, 1, D), "k": (6, 4, HKV, D), "v": (6, 4, HKV, D)}  # 6 pages of 4 keys, bhsd q

BAD = [
    # tensors
    pytest.param({"q": np.zeros((B, HQ, SQ, D), dtype=np.float32)}, "not a torch.Tensor", id="numpy-q"),
    pytest.param({"k": [[0.0]]}, "not a torch.Tensor", id="list-k"),
    pytest.param({"q": "q"}, "not a torch.Tensor", id="string-q"),
    pytest.param({"dtype": torch.int64}, "floating-point", id="int-tensors"),
    pytest.param({"dtype": torch.complex64}, "floating-point", id="complex-tensors"),
    pytest.param({"dtype": torch.float8_e4m3fn}, "floating-point", id="float8-tensors"),
    pytest.param({"numpy": "bshd"}, "not a torch.Tensor", id="numpy-bshd"),
    # scale
    pytest.param({"scale": math.inf}, "scale must be positive", id="scale-inf"),
    pytest.param({"scale": math.nan}, "scale must be positive", id="scale-nan"),
    pytest.param({"scale": -0.5}, "scale must be positive", id="scale-negative"),
    pytest.param({"scale": "0.5"}, "scale must be positive", id="scale-string"),
    pytest.param({"scale": True}, "scale must be positive", id="scale-bool"),
    pytest.param({"scale": torch.tensor(0.5)}, "scale must be positive", id="scale-tensor"),
    # softcap, dropout
    pytest.param({"softcap": math.inf}, "softcap must be positive", id="softcap-inf"),
    pytest.param({"softcap": math.nan}, "softcap must be positive", id="softcap-nan"),
    pytest.param({"softcap": -1.0}, "softcap must be positive", id="softcap-negative"),
    pytest.param({"softcap": "5"}, "softcap must be positive", id="softcap-string"),
    pytest.param({"softcap": True}, "softcap must be positive", id="softcap-bool"),
    pytest.param({"dropout_p": 1.0}, "dropout_p", id="dropout-one"),
    pytest.param({"dropout_p": -0.1}, "dropout_p", id="dropout-negative"),
    pytest.param({"dropout_p": math.nan}, "dropout_p", id="dropout-nan"),
    pytest.param({"dropout_p": "0.1"}, "dropout_p", id="dropout-string"),
    # window
    pytest.param({"window": (10**30,)}, "window must be", id="window-one-side"),
    pytest.param({"window": 5}, "window must be", id="window-int"),
    pytest.param({"window": (1.5, 0)}, "window must be", id="window-float"),
    pytest.param({"window": ("8", 0)}, "window must be", id="window-string"),
    pytest.param({"window": (True, 0)}, "window must be", id="window-bool"),
    pytest.param({"window": (-2, 0)}, ">= -1", id="window-below-minus-one"),
    # masks
    pytest.param({"attn_mask": _mask(SQ, SK, dtype=torch.int64)}, "bool or floating", id="mask-int"),
    pytest.param({"attn_mask": [[True]]}, "bool or floating", id="mask-list"),
    pytest.param({"attn_mask": _mask(SK + 1)}, "does not broadcast", id="mask-wrong-sk"),
    pytest.param({"attn_mask": _mask(SQ, SQ)}, "does not broadcast", id="mask-sq-sq"),
    pytest.param({"attn_mask": _mask(1, 1, 1, SQ, SK)}, "does not broadcast", id="mask-5d"),
    pytest.param({"attn_mask": _mask(3, 1, SQ, SK)}, "does not broadcast", id="mask-wrong-batch"),
    pytest.param({"attn_mask": torch.ones(SQ, SK, dtype=torch.bool, device="meta")}, "does not broadcast",
                 id="mask-other-device"),
    # flags
    pytest.param({"causal": "yes"}, "causal must be True or False", id="causal-string"),
    pytest.param({"causal": None}, "causal must be True or False", id="causal-none"),
    pytest.param({"is_causal": "True"}, "is_causal must be", id="is-causal-string"),
    pytest.param({"return_lse": "False"}, "return_lse must be", id="return-lse-string"),
    pytest.param({"enable_gqa": 0}, "enable_gqa must be", id="enable-gqa-int"),
    pytest.param({"causal": True, "is_causal": False}, "disagree", id="causal-vs-is-causal-false"),
    pytest.param({"causal": True, "is_causal": True}, "disagree", id="causal-vs-is-causal-alignment"),
    pytest.param({"causal_alignment": "middle"}, "causal_alignment", id="alignment-unknown"),
    # other arguments
    pytest.param({"layout": "bhds"}, "layout", id="layout-unknown"),
    pytest.param({"layout": ["bhsd"]}, "layout", id="layout-list"),
    pytest.param({"precision": None}, "precision", id="precision-none"),
    pytest.param({"backend": 5}, "unknown attention backend", id="backend-int"),
    pytest.param({"backend": ["sdpa"]}, "unknown attention backend", id="backend-list"),
    pytest.param({"sinks": torch.zeros(HQ + 1)}, "sinks must be", id="sinks-shape"),
    pytest.param({"sinks": torch.zeros(HQ, dtype=torch.int32)}, "sinks must be", id="sinks-int"),
    # varlen
    pytest.param({**PACKED, "cu_seqlens_q": _cu(2, 5, 17), "cu_seqlens_k": _cu(0, 5, 17)}, "do not describe",
                 id="varlen-not-from-zero"),
    pytest.param({**PACKED, **CU, "cu_seqlens_k": _cu(0, 5, 15)}, "do not describe", id="varlen-short-end"),
    pytest.param({**PACKED, **CU, "cu_seqlens_q": _cu(0, 12, 5, 17), "cu_seqlens_k": _cu(0, 5, 12, 17)},
                 "do not describe", id="varlen-decreasing"),
    pytest.param({**PACKED, **CU, "cu_seqlens_k": _cu(0, 17)}, "same length", id="varlen-batch-differs"),
    pytest.param({**PACKED, **CU, "cu_seqlens_q": _cu(0, 5, 17, dtype=torch.int64)}, "int32", id="varlen-int64"),
    pytest.param({**PACKED, **CU, "cu_seqlens_q": torch.tensor([[0, 5, 17]], dtype=torch.int32)}, "1-D int32",
                 id="varlen-2d"),
    pytest.param({**PACKED, **CU, "cu_seqlens_q": [0, 5, 17]}, "int32", id="varlen-list"),
    pytest.param({**PACKED, **CU, "cu_seqlens_k": _cu(0, 5, 17).to("meta")}, "on meta", id="varlen-offsets-device"),
    pytest.param({**PACKED, **CU, "k": torch.zeros(17, HKV, D, dtype=torch.float64)}, "dtypes differ",
                 id="varlen-dtypes-differ"),
    pytest.param({**PACKED, **CU, "q": np.zeros((17, HQ, D), dtype=np.float32)}, "packed", id="varlen-numpy"),
    pytest.param({**PACKED, **CU, "q": (17, 3, D)}, "heads", id="varlen-heads-not-a-multiple"),
    pytest.param({**PACKED, **CU, "max_seqlen_q": True}, "must be an int", id="varlen-max-bool"),
    pytest.param({**PACKED, **CU, "max_seqlen_q": -3}, "less than the longest", id="varlen-max-negative"),
    pytest.param({**PACKED, **CU, "max_seqlen_q": 11}, "less than the longest", id="varlen-max-too-small"),
    pytest.param({**PACKED, **CU, "max_seqlen_k": "12"}, "must be an int", id="varlen-max-string"),
    pytest.param({**PACKED, **CU, "max_seqlen_k": 12.0}, "must be an int", id="varlen-max-float"),
    pytest.param({**PACKED, **CU, "attn_mask": _mask(17)}, "no attn_mask", id="varlen-with-mask"),
    pytest.param({"q": (17, HQ, D), "k": (17, HKV, D), "v": (17, HKV, D)}, "cu_seqlens", id="packed-without-cu"),
    # paged
    pytest.param({**POOL, "block_table": torch.tensor([[0, 1], [2, 3]])}, "int32", id="paged-int64-table"),
    pytest.param({**POOL, "block_table": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
                  "seqused_k": torch.tensor([8, 8])}, "int32", id="paged-int64-seqused"),
    pytest.param({**POOL, "block_table": torch.tensor([[0.0, 1.0], [2.0, 3.0]])}, "int32", id="paged-float-table"),
    pytest.param({**POOL, "block_table": torch.tensor([[0, 6], [2, 3]], dtype=torch.int32)}, "outside",
                 id="paged-page-out-of-range"),
    pytest.param({**POOL, "block_table": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
                  "seqused_k": torch.tensor([[8], [8]], dtype=torch.int32)}, "1-D int32", id="paged-seqused-2d"),
    pytest.param({**POOL, "block_table": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
                  "q": np.zeros((B, HQ, 1, D), dtype=np.float32)}, "not a torch.Tensor", id="paged-numpy-q"),
    # K and V pools that do not pair page for page (an IndexError or a bmm's RuntimeError inside a backend before)
    pytest.param({**POOL, "v": (5, 4, HKV, D), "block_table": torch.tensor([[0, 5], [2, 3]], dtype=torch.int32)},
                 "pools differ", id="paged-v-fewer-pages"),
    pytest.param({**POOL, "v": (6, 2, HKV, D), "block_table": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)},
                 "pools differ", id="paged-v-other-page-size"),
    # numbers past float's range and values that are not one number (an OverflowError or a RuntimeError before)
    pytest.param({"scale": 10**400}, "scale must be positive", id="scale-huge-int"),
    # finite in Python, infinite in the kernels' float32 math: every output NaN, silently (a CPU fuzz, 2026-12-03)
    pytest.param({"scale": 1e39}, "finite in float32", id="scale-past-float32"),
    pytest.param({"softcap": 10**400}, "softcap must be positive", id="softcap-huge-int"),
    pytest.param({"dropout_p": 10**400}, "dropout_p", id="dropout-huge-int"),
    pytest.param({"dropout_p": torch.zeros(2)}, "dropout_p", id="dropout-two-element-tensor"),
    pytest.param({"dropout_p": torch.tensor(0.0)}, "dropout_p", id="dropout-tensor"),
    pytest.param({"dropout_p": False}, "dropout_p", id="dropout-bool"),
    pytest.param({"sinks": "nested"}, "sinks must be", id="sinks-nested"),
    # the packed path checks the words the dense one does
    pytest.param({**PACKED, **CU, "precision": "bogus"}, "unknown precision", id="varlen-precision-unknown"),
    pytest.param({**PACKED, **CU, "layout": ["bhsd"]}, "unknown layout", id="varlen-layout-list"),
    # an empty name is not "no backend"
    pytest.param({"backend": ""}, "unknown attention backend", id="backend-empty-string"),
    pytest.param({"q": (0, HQ, SQ, D), "k": (0, HKV, SK, D), "v": (0, HKV, SK, D), "backend": "nope"},
                 "unknown attention backend", id="backend-unknown-on-an-empty-call"),
]


def _arguments(case: dict[str, Any]) -> tuple[Any, Any, Any, dict[str, Any]]:
    """q, k, v and the keywords of a table row (shapes given as tuples become random float32 tensors)."""
    kwargs = dict(case)
    dtype = kwargs.pop("dtype", torch.float32)
    q, k, v = (t.to(dtype) for t in _qkv())
    if kwargs.pop("numpy", None) == "bshd":
        q, k, v = (t.transpose(1, 2).numpy() for t in (q, k, v))
        kwargs["layout"] = "bshd"
    if kwargs.get("sinks") == "nested":
        with warnings.catch_warnings():  # "The PyTorch API of nested tensors is in prototype stage"
            warnings.simplefilter("ignore", UserWarning)
            kwargs["sinks"] = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(2)])
    given = {name: kwargs.pop(name) for name in ("q", "k", "v") if name in kwargs}
    given = {name: torch.randn(*t) if isinstance(t, tuple) else t for name, t in given.items()}
    return given.get("q", q), given.get("k", k), given.get("v", v), kwargs


@pytest.mark.parametrize(("case", "message"), BAD)
def test_every_bad_argument_is_refused_with_a_hint(real: runtime.Dispatcher, case: dict[str, Any],
                                                   message: str) -> None:
    q, k, v, kwargs = _arguments(case)
    with pytest.raises(DispatchError, match=message) as err:
        attnforge.attention(q, k, v, **kwargs)
    assert err.value.hint, f"no hint for: {err.value}"
    with pytest.raises(DispatchError):  # explain() takes the same arguments and refuses the same ones
        attnforge.explain(q, k, v, **kwargs)
    assert real.demoted == {} and real.broken == {} and real.routes == {}


SPARSE = [
    pytest.param("q", {}, id="q"),
    pytest.param("k", {"causal": True}, id="k-causal"),
    pytest.param("v", {"layout": "bshd"}, id="v-bshd"),
    pytest.param("attn_mask", {"attn_mask": _mask(SQ, SK)}, id="mask-bool"),
    pytest.param("attn_mask", {"attn_mask": torch.zeros(SQ, SK)}, id="mask-float"),
    pytest.param("sinks", {"sinks": torch.zeros(HQ)}, id="sinks"),
    pytest.param("cu_seqlens_k", {**PACKED, **CU}, id="cu-seqlens-k"),
    pytest.param("q", {"backend": "sdpa"}, id="q-forced"),
]


@pytest.mark.parametrize(("name", "case"), SPARSE)
def test_a_sparse_argument_is_refused_with_a_hint_and_skips_no_backend(real: runtime.Dispatcher, name: str,
                                                                      case: dict[str, Any]) -> None:
    """A sparse COO tensor has a dense one's shape, dtype and device, so it passes validation and used to fail
    inside a kernel (``reshape is not implemented for sparse tensors``), after SDPA had been skipped for the dense
    calls of its signature. Now: a DispatchError naming the argument, and the dense calls keep SDPA."""
    q, k, v, kwargs = _arguments(case)
    if kwargs.get("layout") == "bshd":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    dense = _call(q, k, v, kwargs)  # the signature's route is built and kept first, as in a running model
    given = {"q": q, "k": k, "v": v, **kwargs}
    given[name] = given[name].to_sparse()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(DispatchError, match=f"{name} is a sparse_coo tensor") as err:
            attnforge.attention(**given)
    assert err.value.hint == f"pass {name}.to_dense()"
    assert _ours(caught) == [] and real.demoted == {} and real.broken == {}
    torch.testing.assert_close(_call(q, k, v, kwargs), dense)
    assert attnforge.explain(q, k, v, **{n: t for n, t in kwargs.items() if n != "backend"}).notes == ()


# -- accepted calls: right answers, and no backend raises ------------------------------------------------
def _call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    out = attnforge.attention(q, k, v, **kwargs)
    return out[0] if kwargs.get("return_lse") else out


GOOD = [
    # masks SDPA itself refuses or mishandles: served right, never by a backend that raises
    pytest.param({"attn_mask": torch.tensor([True, False] * 3 + [True])}, {"mask": "same"}, id="mask-1d-bool"),
    pytest.param({"attn_mask": torch.linspace(-2, 2, SK)}, {"mask": "same"}, id="mask-1d-float"),
    pytest.param({"attn_mask": torch.tensor(True)}, {}, id="mask-0d-bool"),
    pytest.param({"attn_mask": torch.randn(SQ, 1)}, {"mask": "same"}, id="mask-sq-by-1"),
    pytest.param({"attn_mask": torch.randn(B, 1, 1, SK, dtype=torch.float64)}, {"mask": "same"},
                 id="mask-float64-with-float32"),
    pytest.param({"attn_mask": torch.rand(SQ, SK) > 0.3, "causal": True}, {"mask": "same", "causal": True},
                 id="mask-and-causal"),
    # windows past the sequences: exact, never an overflow
    pytest.param({"window": (10**30, 0)}, {"window": (None, 0)}, id="window-huge-left"),
    pytest.param({"window": (2, 10**30)}, {"window": (2, None)}, id="window-huge-right"),
    pytest.param({"window": (10**30, 10**30)}, {}, id="window-huge-both"),
    pytest.param({"window": (np.int64(2), -1)}, {"window": (2, None)}, id="window-numpy-int"),
    pytest.param({"window": (0, 0)}, {"window": (0, 0)}, id="window-diagonal"),
    pytest.param({"window": (1, 0), "causal": True}, {"window": (1, 0), "causal": True}, id="window-causal"),
    # numbers of other kinds
    pytest.param({"scale": np.float32(0.25)}, {"scale": 0.25}, id="scale-numpy"),
    pytest.param({"scale": 1}, {"scale": 1.0}, id="scale-int"),
    pytest.param({"softcap": np.float64(2.0)}, {"softcap": 2.0}, id="softcap-numpy"),
    pytest.param({"softcap": 0}, {}, id="softcap-zero-is-off"),
    pytest.param({"dropout_p": np.float64(0.0)}, {}, id="dropout-numpy-zero"),
    pytest.param({"causal": np.bool_(True)}, {"causal": True}, id="causal-numpy-bool"),
    pytest.param({"return_lse": np.bool_(False)}, {}, id="return-lse-numpy-false"),
    # is_causal is SDPA's (top-left); causal is FlashAttention's (bottom-right)
    pytest.param({"is_causal": True}, {"causal": True, "top_left": True}, id="is-causal-top-left"),
    pytest.param({"causal": True}, {"causal": True}, id="causal-bottom-right"),
    pytest.param({"is_causal": True, "causal": True, "causal_alignment": "top_left"},
                 {"causal": True, "top_left": True}, id="both-agree"),
    pytest.param({"is_causal": True, "window": (2, 0)}, {"causal": True, "top_left": True, "window": (2, 0)},
                 id="is-causal-window-top-left"),
]


@pytest.mark.parametrize(("kwargs", "want"), GOOD)
def test_accepted_calls_are_exact_and_no_backend_raises(real: runtime.Dispatcher, kwargs: dict[str, Any],
                                                        want: dict[str, Any]) -> None:
    q, k, v = _qkv()
    expected = dict(want)
    if expected.get("mask") == "same":
        expected["mask"] = kwargs["attn_mask"]
    out = _call(q, k, v, kwargs)
    torch.testing.assert_close(out.double(), reference(q, k, v, **expected), atol=2e-5, rtol=1e-4)
    assert real.demoted == {} and real.broken == {}  # served by the first backend of its route
    explanation = str(attnforge.explain(q, k, v, **kwargs))
    assert "forced" not in explanation and "raised" not in explanation


def test_is_causal_matches_sdpa_and_patch_sdpa_keeps_it(real: runtime.Dispatcher) -> None:
    q, k, v = _qkv(sq=3, sk=7)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(attnforge.attention(q, k, v, is_causal=True), sdpa)
    with attnforge.patch_sdpa():
        patched = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(patched, sdpa)
    assert (attnforge.attention(q, k, v, causal=True) - sdpa).abs().max() > 0.1  # bottom-right differs


@pytest.mark.parametrize("kwargs", [
    pytest.param({"scale": -0.5}, id="negative-scale"),
    pytest.param({"scale": 0.0}, id="zero-scale"),
    pytest.param({"scale": math.inf}, id="inf-scale"),
    pytest.param({"dropout_p": 1.0}, id="dropout-one"),
])
def test_patch_sdpa_leaves_what_attention_refuses_to_sdpa_itself(real: runtime.Dispatcher,
                                                                 kwargs: dict[str, Any]) -> None:
    q, k, v = _qkv(sq=3, sk=3)
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
    with attnforge.patch_sdpa():
        patched = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
    torch.testing.assert_close(patched, sdpa, equal_nan=True)
    assert real.routes == {} and real.demoted == {}  # attnforge never saw the call


def test_varlen_offsets_are_checked_and_a_huge_max_seqlen_is_exact(real: runtime.Dispatcher) -> None:
    g = torch.Generator().manual_seed(3)
    lens_q, lens_k = (5, 12), (7, 10)
    q, k, v = (torch.randn(sum(lens), h, D, generator=g) for lens, h in ((lens_q, HQ), (lens_k, HKV), (lens_k, HKV)))
    cu_q, cu_k = _cu(0, 5, 17), _cu(0, 7, 17)
    out = attnforge.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True, max_seqlen_q=10**30,
                              max_seqlen_k=np.int64(10), window=(10**30, 0))
    rows = []
    for (q0, q1), (k0, k1) in zip(((0, 5), (5, 17)), ((0, 7), (7, 17)), strict=True):
        one = (t.transpose(0, 1).unsqueeze(0) for t in (q[q0:q1], k[k0:k1], v[k0:k1]))
        rows.append(reference(*one, causal=True)[0].transpose(0, 1))
    torch.testing.assert_close(out.double(), torch.cat(rows), atol=2e-5, rtol=1e-4)
    assert out.shape == q.shape
    assert real.demoted == {} and real.broken == {}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sq=st.integers(1, 9), sk=st.integers(1, 9), group=st.sampled_from([1, 2]),
       mask_dims=st.none() | st.integers(0, 4), bool_mask=st.booleans(),
       causal=st.sampled_from(["", "causal", "is", "top_left", "not_is"]),
       window=st.none() | st.tuples(st.none() | st.integers(-1, 12), st.none() | st.integers(-1, 12)),
       softcap=st.none() | st.sampled_from([0.0, 1.5, np.float32(4.0)]),
       scale=st.none() | st.sampled_from([0.3, np.float64(1.0), 2]), huge=st.booleans(),
       layout=st.sampled_from(["bhsd", "bshd"]), gqa_flag=st.sampled_from([None, True, False]))
def test_any_accepted_call_is_exact(  # noqa: PLR0917 - hypothesis draws
        real: runtime.Dispatcher, sq: int, sk: int, group: int, mask_dims: int | None,
                                    bool_mask: bool, causal: str, window: tuple[int | None, int | None] | None,
                                    softcap: Any, scale: Any, huge: bool, layout: str, gqa_flag: bool | None) -> None:
    """Every spelling of the same call gives the reference's answer: SDPA's (``is_causal``, ``is_causal=False``,
    ``enable_gqa``), FlashAttention's (``causal``, ``window=(-1, -1)``, ``softcap=0.0``), top-left alignment, and
    either layout; the plain path's rewrites of those spellings (Sq == Sk, no-op arguments) included."""
    if gqa_flag is False and group > 1:
        group = 1  # enable_gqa=False refuses a grouped call (its own test); here it must change nothing
    g = torch.Generator().manual_seed(sq * 100 + sk)
    hkv = 2
    q = torch.randn(B, hkv * group, sq, D, generator=g)
    k, v = (torch.randn(B, hkv, sk, D, generator=g) for _ in range(2))
    kwargs: dict[str, Any] = {"scale": scale, "softcap": softcap}
    if mask_dims is not None:  # a mask of that rank, each dimension full or 1 (SDPA's broadcasting)
        full = (B, hkv * group, sq, sk)[4 - mask_dims:]
        shape = tuple(n if torch.rand(1, generator=g).item() < 0.5 or i == mask_dims - 1 else 1
                      for i, n in enumerate(full))
        kwargs["attn_mask"] = (torch.rand(shape, generator=g) > 0.3 if bool_mask
                               else torch.randn(shape, generator=g))
    if window is not None:
        kwargs["window"] = tuple(10**30 if huge and s is not None and s > 8 else s for s in window)
    if causal == "causal":
        kwargs["causal"] = True
    elif causal == "is":
        kwargs["is_causal"] = True
    elif causal == "top_left":
        kwargs["causal"], kwargs["causal_alignment"] = True, "top_left"
    elif causal == "not_is":
        kwargs["is_causal"] = False
    if window is not None and causal in ("", "not_is") and torch.rand(1, generator=g).item() < 0.5:
        kwargs["causal_alignment"] = "top_left"  # a window's alignment without causal
    if gqa_flag is not None:
        kwargs["enable_gqa"] = gqa_flag
    causal_now = causal in ("causal", "is", "top_left")
    top_left = causal in ("is", "top_left") or kwargs.get("causal_alignment") == "top_left"
    args = (q, k, v) if layout == "bhsd" else tuple(t.transpose(1, 2).contiguous() for t in (q, k, v))
    if layout == "bshd":
        if "attn_mask" in kwargs:
            return  # masks are [B, H, Sq, Sk] in both layouts; covered on bhsd
        kwargs["layout"] = "bshd"
    out = attnforge.attention(*args, **kwargs)
    if layout == "bshd":
        out = out.transpose(1, 2)
    sides = None if window is None else tuple(None if s is None or s == -1 else s for s in window)
    want = reference(q, k, v, mask=kwargs.get("attn_mask"), causal=causal_now, top_left=top_left,
                     window=sides, softcap=float(softcap) if softcap else None,
                     scale=None if scale is None else float(scale))
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-4)
    assert real.demoted == {} and real.broken == {}


# -- no poisoning: a fake backend at the adapter seam ------------------------------------------------------
@dataclasses.dataclass
class Picky:
    """A verified backend with every feature that serves with :func:`reference` and raises on the calls
    ``fails`` picks (a kernel limit its capability table does not know)."""

    name: str = "picky"
    features: frozenset[str] = frozenset(FEATURES) - {"varlen", "paged", "sinks", "lse", "dv"}
    fails: Any = None
    calls: int = 0

    def load_error(self) -> str | None:
        return None

    def unsupported_reasons(self, call: AttentionCall) -> list[str]:
        return []

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float | None,
                 attn_mask: torch.Tensor | None = None, window: Any = None, softcap: float | None = None,
                 causal_alignment: str = "bottom_right", dropout_p: float = 0.0) -> torch.Tensor:
        self.calls += 1
        if self.fails is not None and self.fails(q, k, attn_mask, window):
            raise RuntimeError("CUDA error: invalid configuration argument\n(a long trace)")
        return reference(q, k, v, mask=attn_mask, causal=causal, top_left=causal_alignment == "top_left",
                         window=window, softcap=softcap, scale=scale).to(q.dtype)


@pytest.fixture
def picky(tmp_path: Path) -> Iterator[tuple[runtime.Dispatcher, Picky]]:
    """``Picky`` verified and measured faster than plain SDPA for every class this section calls."""
    store = RecordStore(tmp_path / "picky")
    fake = Picky()
    store.add_verify(VerifyRecord(device_key=CPU_KEY, backend=fake.name, backend_version="1", ok=True, summary="ok"))
    q, k, _ = _qkv()
    store.add_bench([r for features in ((), ("mask",), ("window",), ("softcap",), ("mask", "window"))
                     for causal in (False, True)
                     for r in faster_records([fake.name], q, k, causal=causal, features=features)])
    dispatcher = runtime.Dispatcher({fake.name: fake}, records=store)
    previous = runtime.set_dispatcher(dispatcher)
    yield dispatcher, fake
    runtime.set_dispatcher(previous)


#: (a bad call's keywords, a valid call of the same shape class)
SAME_CLASS = [
    pytest.param({"attn_mask": _mask(SK + 1)}, {"attn_mask": _mask(SQ, SK)}, id="mask"),
    pytest.param({"attn_mask": _mask(SQ, SK, dtype=torch.int64)}, {"attn_mask": _mask(1, SK)}, id="mask-dtype"),
    pytest.param({"window": (-5, 0)}, {"window": (3, 0)}, id="window"),
    pytest.param({"window": (10**30, 0), "causal": True, "is_causal": False}, {"window": (2, 0)}, id="window-flags"),
    pytest.param({"softcap": math.inf}, {"softcap": 3.0}, id="softcap"),
    pytest.param({"softcap": "5"}, {"softcap": 5.0}, id="softcap-string"),
    pytest.param({"scale": math.nan}, {}, id="scale"),
    pytest.param({"causal": "yes"}, {"causal": True}, id="causal"),
]


@pytest.mark.parametrize(("bad", "valid"), SAME_CLASS)
def test_a_bad_call_does_not_change_who_serves_its_class(picky: tuple[runtime.Dispatcher, Picky],
                                                         bad: dict[str, Any], valid: dict[str, Any]) -> None:
    dispatcher, fake = picky
    q, k, v = _qkv()
    _call(q, k, v, valid)
    assert fake.calls == 1 and attnforge.explain(q, k, v, **valid).chosen == fake.name
    with pytest.raises(DispatchError) as err:
        attnforge.attention(q, k, v, **bad)
    assert err.value.hint
    for _ in range(2):
        out = _call(q, k, v, valid)
    assert fake.calls == 3 and attnforge.explain(q, k, v, **valid).chosen == fake.name
    assert dispatcher.demoted == {} and dispatcher.broken == {}
    want = {"mask": valid.get("attn_mask"), "window": valid.get("window"), "softcap": valid.get("softcap"),
            "causal": valid.get("causal", False)}
    torch.testing.assert_close(out.double(), reference(q, k, v, **want), atol=2e-5, rtol=1e-4)


def _masked(rows: int) -> torch.Tensor:
    """A bool mask ``[rows, Sk]`` (rows 1 or Sq): its shape is part of the call's signature."""
    return torch.ones(rows, SK, dtype=torch.bool)


def test_a_backend_that_raises_is_skipped_for_that_signature_only(picky: tuple[runtime.Dispatcher, Picky]) -> None:
    dispatcher, fake = picky
    fake.fails = lambda q, k, mask, window: mask is not None and mask.shape[-2] == 1  # one mask shape only
    q, k, v = _qkv()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):  # tried once on the failing signature, then skipped for it: sdpa serves
            out = attnforge.attention(q, k, v, attn_mask=_masked(1))
            torch.testing.assert_close(out.double(), reference(q, k, v, mask=_masked(1)), atol=2e-5, rtol=1e-4)
    assert fake.calls == 1
    assert [str(w.message).split(";")[0] for w in caught] == [
        "attnforge: attention backend 'picky' raised RuntimeError: CUDA error: invalid configuration argument"]
    assert "skipped for this call signature" in str(caught[0].message) and "\n" not in str(caught[0].message)
    explanation = attnforge.explain(q, k, v, attn_mask=_masked(1))
    assert explanation.chosen == "sdpa" and not explanation.forced
    assert explanation.notes == ("picky raised on this signature: RuntimeError: CUDA error: invalid configuration"
                                 " argument; served by sdpa",)
    assert "forced backend cannot serve" not in str(explanation)
    for mask in (_masked(SQ), None):  # the same shape class, other signatures: still the fake, as before
        before = fake.calls
        out = attnforge.attention(q, k, v, attn_mask=mask) if mask is not None else attnforge.attention(q, k, v)
        assert fake.calls == before + 1
        torch.testing.assert_close(out.double(), reference(q, k, v, mask=mask), atol=2e-5, rtol=1e-4)
    assert attnforge.explain(q, k, v, attn_mask=_masked(SQ)).chosen == "picky"
    assert dispatcher.broken == {} and len(dispatcher.demoted["picky"]) == 1


def test_a_backend_that_raises_on_several_signatures_of_a_class_is_skipped_for_the_class(
        picky: tuple[runtime.Dispatcher, Picky]) -> None:
    dispatcher, fake = picky
    fake.fails = lambda q, k, mask, window: window is not None  # every windowed call
    q, k, v = _qkv()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for left in range(CLASS_AFTER + 2):
            out = attnforge.attention(q, k, v, window=(left, 0))
            torch.testing.assert_close(out.double(), reference(q, k, v, window=(left, 0)), atol=2e-5, rtol=1e-4)
    assert fake.calls == CLASS_AFTER  # tried on 3 signatures, then skipped for the class
    assert len(caught) == CLASS_AFTER and "skipped for that class" in str(caught[-1].message)
    assert list(dispatcher.broken) == ["picky"]
    rejected = {r.backend: r.reasons for r in attnforge.explain(q, k, v, window=(9, 0)).rejected}
    assert any("raised at run time" in r for r in rejected["picky"])
    attnforge.attention(q, k, v)  # another class (no window): still the fake
    assert fake.calls == CLASS_AFTER + 1


def test_a_forced_backend_that_raises_reaches_the_caller_and_is_not_skipped(
        picky: tuple[runtime.Dispatcher, Picky]) -> None:
    dispatcher, fake = picky
    fake.fails = lambda q, k, mask, window: True
    q, k, v = _qkv()
    for _ in range(2):
        with pytest.raises(RuntimeError, match="invalid configuration"):
            attnforge.attention(q, k, v, backend="picky")
    assert fake.calls == 2 and dispatcher.demoted == {} and dispatcher.broken == {}


# -- a failure inside what the signature does not hold is not remembered ---------------------------------------
def _ours(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    """attnforge's warnings among those caught (torch adds its own deprecation warnings on first use)."""
    return [w for w in caught if str(w.message).startswith("attnforge:")]


def test_sdpa_raising_under_forward_ad_is_not_remembered_for_plain_calls(real: runtime.Dispatcher) -> None:
    """torch 2.13's CPU SDPA kernel has no forward-AD formula: under ``torch.func.jvp`` it raises and the exact math
    serves. That must not hand the plain calls of the same signature to the exact math for the rest of the process
    (it did: every later call ran ~6x slower than SDPA)."""
    q, k, v = _qkv()
    tangent = torch.ones_like(q)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, dout = torch.func.jvp(lambda a: attnforge.attention(a, k, v), (q,), (tangent,))
    caught = _ours(caught)
    if not caught:
        pytest.skip("this torch has a forward-AD formula for SDPA's CPU kernel: nothing raises")
    assert "the call ran inside a torch.func transform" in str(caught[0].message)
    assert "nothing is remembered" in str(caught[0].message)
    want, dwant = torch.func.jvp(lambda a: attnforge.attention(a, k, v, backend="exact"), (q,), (tangent,))
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(dout, dwant)
    assert real.demoted == {} and real.broken == {}
    explanation = attnforge.explain(q, k, v)
    assert explanation.chosen == "sdpa" and explanation.notes == ()
    with forward_ad.dual_level():  # the same through the forward_ad API, outside torch.func
        dual = forward_ad.make_dual(q, tangent)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            primal, dprimal = forward_ad.unpack_dual(attnforge.attention(dual, k, v))
    assert "forward-mode AD" in str(_ours(caught)[0].message)
    torch.testing.assert_close(primal, want)
    torch.testing.assert_close(dprimal, dwant)
    assert real.demoted == {} and attnforge.explain(q, k, v).chosen == "sdpa"


def test_sdpa_raising_inside_an_sdpa_kernel_context_keeps_sdpa_outside_it(real: runtime.Dispatcher) -> None:
    """Inside ``sdpa_kernel(EFFICIENT_ATTENTION)`` a CPU SDPA has no kernel ("No viable backend"): the exact math
    serves the call. Outside the context SDPA serves that signature again (it was skipped for the rest of the
    process: the exact math, ~6x slower, for every later call)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _qkv()
    attnforge.attention(q, k, v)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            out = attnforge.attention(q, k, v)
    assert "the call ran inside an sdpa_kernel context" in str(_ours(caught)[0].message)
    torch.testing.assert_close(out.double(), reference(q, k, v), atol=2e-5, rtol=1e-4)
    assert real.demoted == {} and real.broken == {}
    explanation = attnforge.explain(q, k, v)
    assert explanation.chosen == "sdpa" and explanation.notes == ()


def test_a_backend_without_a_batching_rule_stays_chosen_outside_vmap(picky: tuple[runtime.Dispatcher, Picky]) -> None:
    """A kernel with no vmap batching rule raises on functorch's batched tensors (the seam: the fake checks what
    the C++ dispatcher checks); the next backend serves the vmapped call and the plain calls keep the kernel."""
    dispatcher, fake = picky
    fake.fails = lambda q, k, mask, window: torch._C._functorch.is_batchedtensor(q)
    q, k, v = _qkv()
    qs, ks, vs = (torch.stack([t, t.flip(-1)]) for t in (q, k, v))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.vmap(attnforge.attention)(qs, ks, vs)
    assert "the call ran inside a torch.func transform" in str(_ours(caught)[0].message)
    for i in range(2):
        torch.testing.assert_close(out[i].double(), reference(qs[i], ks[i], vs[i]), atol=2e-5, rtol=1e-4)
    assert dispatcher.demoted == {} and dispatcher.broken == {}
    before = fake.calls
    attnforge.attention(q, k, v)
    assert fake.calls == before + 1 and attnforge.explain(q, k, v).chosen == "picky"


def test_a_backend_that_raises_inside_a_cuda_graph_capture_stays_chosen_outside_it(
        picky: tuple[runtime.Dispatcher, Picky], monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel that synchronises raises only while a CUDA graph captures (simulated at its seam,
    ``torch.cuda.is_current_stream_capturing``, as tests/dispatch/test_capture.py does); the calls after the capture
    keep it."""
    dispatcher, fake = picky
    capturing = {"on": False}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: capturing["on"])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing["on"])
    fake.fails = lambda q, k, mask, window: capturing["on"]
    q, k, v = _qkv()
    attnforge.attention(q, k, v)
    capturing["on"] = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = attnforge.attention(q, k, v)
    capturing["on"] = False
    assert "the call ran inside a CUDA graph capture" in str(_ours(caught)[0].message)
    torch.testing.assert_close(out.double(), reference(q, k, v), atol=2e-5, rtol=1e-4)
    assert dispatcher.demoted == {} and dispatcher.broken == {}
    before = fake.calls
    attnforge.attention(q, k, v)
    assert fake.calls == before + 1 and attnforge.explain(q, k, v).chosen == "picky"


def test_a_backend_that_raises_on_fake_tensors_stays_chosen_for_real_ones(
        picky: tuple[runtime.Dispatcher, Picky]) -> None:
    """Under ``FakeTensorMode`` (shape propagation, memory estimates) a kernel with no fake implementation raises;
    SDPA serves the fake call with the right shape, and real calls of the same sizes keep the kernel."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    dispatcher, fake = picky
    fake.fails = lambda q, k, mask, window: isinstance(q, FakeTensor)
    q, k, v = _qkv()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with FakeTensorMode() as mode:
            out = attnforge.attention(*(mode.from_tensor(t) for t in (q, k, v)))
    assert isinstance(out, FakeTensor) and out.shape == q.shape
    assert "a Python dispatch mode (FakeTensorMode)" in str(_ours(caught)[0].message)
    assert dispatcher.demoted == {} and dispatcher.broken == {}
    before = fake.calls
    torch.testing.assert_close(attnforge.attention(q, k, v).double(), reference(q, k, v), atol=2e-5, rtol=1e-4)
    assert fake.calls == before + 1


def test_unrecorded_context_names_each_case_and_nothing_outside() -> None:
    q, k, v = _qkv()
    assert unrecorded_context(q, k, v) is None
    assert unrecorded_context(torch.nn.Parameter(q), k, v) is None
    seen: list[str | None] = []
    torch.vmap(lambda a: seen.append(unrecorded_context(a, k, v)) or a)(q)
    torch.func.grad(lambda a: seen.append(unrecorded_context(a, k, v)) or a.sum())(q)
    with forward_ad.dual_level():
        seen.append(unrecorded_context(forward_ad.make_dual(q, q), k, v))
    class Passthrough(TorchDispatchMode):  # a user's mode, as a profiler or a FLOP counter installs one
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    with Passthrough():
        seen.append(unrecorded_context(q, k, v))

    class Sub(torch.Tensor):
        pass

    seen.append(unrecorded_context(q.as_subclass(Sub), k, v))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH, SDPBackend.FLASH_ATTENTION]):
        seen.append(unrecorded_context(q, k, v))
    assert seen == ["a torch.func transform (vmap, grad, jvp)"] * 2 + [
        "forward-mode AD (torch.autograd.forward_ad.dual_level)", "a Python dispatch mode (Passthrough)",
        "a tensor subclass (Sub)", "an sdpa_kernel context (SDPA's kernels restricted)"]


# -- state kept across calls: made under inference_mode, read by a call that records gradients -------------------
@pytest.mark.parametrize("backend", [None, "sdpa", "sdpa-math", "exact"])
@pytest.mark.parametrize(("sq", "sk", "kwargs"), [
    pytest.param(3, 7, {"causal": True}, id="causal-sq<sk"),
    pytest.param(7, 3, {"causal": True}, id="causal-sq>sk"),
    pytest.param(5, 7, {"window": (2, 0)}, id="window"),
    pytest.param(5, 7, {"attn_mask": torch.rand(SQ, SK) > 0.3}, id="bool-mask"),
])
def test_a_call_under_inference_mode_leaves_nothing_that_breaks_a_later_training_call(
        real: runtime.Dispatcher, backend: str | None, sq: int, sk: int, kwargs: dict[str, Any]) -> None:
    """A bottom-right causal mask first made under ``torch.inference_mode`` was kept as an inference tensor; the
    next call of that shape that recorded gradients failed in SDPA ("Inference tensors cannot be saved for
    backward"): SDPA was skipped for it, or the error reached the caller when SDPA was forced. What is kept across
    calls is made outside inference mode now (``_base.made_for_autograd``)."""
    q, k, v = _qkv(sq=sq, sk=sk)
    with torch.inference_mode():
        before = attnforge.attention(q, k, v, backend=backend, **kwargs)
    leaf = q.clone().requires_grad_()
    out = attnforge.attention(leaf, k, v, backend=backend, **kwargs)
    out.sum().backward()
    torch.testing.assert_close(out.detach(), before)
    assert leaf.grad is not None and bool(torch.isfinite(leaf.grad).all())
    assert real.demoted == {} and real.broken == {}


def test_flex_block_masks_made_under_inference_mode_are_normal_tensors() -> None:
    from attnforge.backends import flex

    with torch.inference_mode():
        block = flex._build_block_mask(4, 8, "cpu", offset=4, left=None, right=0)
    assert not block.kv_num_blocks.is_inference() and not block.kv_indices.is_inference()


# -- inputs whose strides repeat elements: expanded (stride 0) tensors on the packed and paged paths -------------
def test_expanded_packed_and_paged_inputs_are_served_and_explained(real: runtime.Dispatcher) -> None:
    """``explain`` and the packed (varlen) and paged paths stood the call in for the decision with ``as_strided``
    views that assumed contiguous rows: an input expanded from fewer elements than a row failed with "setStorage
    ... out of bounds". The stand-ins are views of one real row now."""
    one = torch.randn(1, dtype=torch.float64)
    q, k = one.expand(17, HQ, D), one.expand(17, HKV, D)
    cu = _cu(0, 5, 17)
    out = attnforge.attention(q, k, k, cu_seqlens_q=cu, cu_seqlens_k=cu)
    torch.testing.assert_close(out, one.expand_as(out))  # every value is the one value: so is every average
    assert attnforge.explain(q, k, k, cu_seqlens_q=cu, cu_seqlens_k=cu).chosen is not None
    pool = one.expand(6, 4, HKV, D)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    qd = one.expand(B, HQ, 1, D)
    torch.testing.assert_close(attnforge.attention(qd, pool, pool, block_table=table), one.expand(B, HQ, 1, D))
    assert attnforge.explain(qd, pool, pool, block_table=table).chosen is not None
    assert real.demoted == {} and real.broken == {}


# -- calls with zero elements: explain says what runs ----------------------------------------------------------
@pytest.mark.parametrize("case", [
    pytest.param({"q": (0, HQ, D), "k": (0, HKV, D), "v": (0, HKV, D), "cu_seqlens_q": _cu(0),
                  "cu_seqlens_k": _cu(0)}, id="varlen-no-sequence"),
    pytest.param({"q": (0, HQ, D), "k": (0, HKV, D), "v": (0, HKV, D), "cu_seqlens_q": _cu(0, 0),
                  "cu_seqlens_k": _cu(0, 0)}, id="varlen-empty-sequence"),
    pytest.param({"q": (0, HQ, SQ, D), "k": (0, HKV, SK, D), "v": (0, HKV, SK, D)}, id="dense-no-batch"),
    pytest.param({"v": (B, HKV, SK, 0)}, id="dense-dv-zero"),
    pytest.param({"q": (0, HQ, SQ, D), "k": (0, HKV, SK, D), "v": (0, HKV, SK, D), "backend": "sdpa"},
                 id="dense-forced"),
])
def test_explain_of_a_call_with_zero_elements_names_the_exact_math(real: runtime.Dispatcher,
                                                                  case: dict[str, Any]) -> None:
    """An empty packed call's explain raised IndexError (its stand-ins were the 3-D inputs); an empty dense one
    named SDPA, while the exact math serves every call with zero elements."""
    q, k, v, kwargs = _arguments(case)
    out = attnforge.attention(q, k, v, **kwargs)
    assert out.numel() == 0 or not out.any()
    explanation = attnforge.explain(q, k, v, **kwargs)
    assert explanation.chosen == "exact" and explanation.order == ("exact",) and not explanation.forced
    assert "zero elements" in str(explanation)


# -- a cached signature never admits a value that only compares equal to a valid one -----------------------------
@pytest.mark.parametrize(("valid", "bad", "message"), [
    pytest.param({"scale": 1.0}, {"scale": True}, "scale must be positive", id="scale"),
    pytest.param({"softcap": 1.0}, {"softcap": True}, "softcap must be positive", id="softcap"),
    pytest.param({"window": (1, 0)}, {"window": (True, 0)}, "window must be", id="window"),
    pytest.param({"dropout_p": 0.0}, {"dropout_p": False}, "dropout_p", id="dropout"),
    pytest.param({"dropout_p": 0.0, "attn_mask": _mask(SQ, SK)}, {"dropout_p": False, "attn_mask": _mask(SQ, SK)},
                 "dropout_p", id="dropout-with-mask"),
    pytest.param({"scale": 1.0, "softcap": 2.0}, {"scale": True, "softcap": 2.0}, "scale must be positive",
                 id="scale-with-softcap"),
])
def test_a_bad_value_equal_to_a_valid_one_is_refused_after_the_valid_call(
        real: runtime.Dispatcher, valid: dict[str, Any], bad: dict[str, Any], message: str) -> None:
    """``True == 1.0`` and they hash alike, so the route or plan kept for ``scale=1.0`` served ``scale=True``
    (and ``softcap=True``, ``window=(True, 0)``, ``dropout_p=False``) without validation. The signatures hold each
    value's class now."""
    q, k, v = _qkv()
    for _ in range(2):  # the second call is served from the kept route or plan
        attnforge.attention(q, k, v, **valid)
    with pytest.raises(DispatchError, match=message):
        attnforge.attention(q, k, v, **bad)


def test_the_dynamic_plan_of_a_class_tells_more_queries_than_keys_from_fewer() -> None:
    """A dynamic class's plan (more than DYNAMIC_AFTER shapes) was shared by Sq < Sk and Sq > Sk calls of the same
    buckets; under bottom-right causal alignment the first Sq - Sk rows of the latter see no key, which some
    backends refuse, so a plan decided on Sq < Sk must not serve them."""
    from attnforge.dispatch.features import dynamic_signature, signature

    def key(sq: int, sk: int) -> Any:
        q, k, v = _qkv(sq=sq, sk=sk)
        sig = signature(q, k, v, layout="bhsd", backend=None, precision="exact", scale=None,
                        kwargs={"causal": True, "softcap": 2.0})
        return dynamic_signature(sig, layout="bhsd")

    assert key(6, 7) != key(7, 6)  # one bucket (5..8) for every length here
    assert key(6, 7) == key(5, 7) and key(7, 6) == key(7, 5)


# -- an additive mask wider than q's dtype keeps its finite hiding values finite ---------------------------------
@pytest.mark.parametrize("backend", [None, "sdpa", "sdpa-math", "exact"])
def test_a_float32_mask_of_finfo_min_on_bfloat16_inputs_hides_as_the_exact_math(real: runtime.Dispatcher,
                                                                              backend: str | None) -> None:
    """transformers hides keys with ``torch.finfo(dtype).min``; a float32 mask of it cast to bfloat16 became
    ``-inf``, so a row with every key hidden that way returned zeros through SDPA where the exact math (and the
    float64 reference) return the mean of v."""
    q, k, v = (t.to(torch.bfloat16) for t in _qkv())
    mask = torch.zeros(SQ, SK)
    mask[1] = torch.finfo(torch.float32).min
    out = attnforge.attention(q, k, v, attn_mask=mask, backend=backend).double()
    want = reference(q, k, v, mask=mask)
    torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out[:, :, 1], v.double().repeat_interleave(HQ // HKV, 1).mean(2), atol=2e-2,
                               rtol=2e-2)


# -- torch.autocast: the inputs SDPA's autocast rule would give its kernel --------------------------------------
@pytest.mark.parametrize("kwargs", [{}, {"causal": True}, {"attn_mask": _mask(SQ, SK)}, {"softcap": 2.0}])
def test_under_autocast_mixed_dtypes_are_served_in_the_autocast_dtype_as_sdpa_does(
        real: runtime.Dispatcher, kwargs: dict[str, Any]) -> None:
    """A model under ``torch.autocast`` whose RoPE left q and k in float32 beside a bfloat16 v: SDPA casts all
    three to bfloat16; attention() refused them ("q, k, v dtypes differ"), which took the forward pass down through
    ``attn_implementation="attnforge"``."""
    q, k, v = _qkv()
    v = v.to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = _call(q, k, v, kwargs)
        explanation = attnforge.explain(q, k, v, **kwargs)
        both = _call(q, k, v.float(), kwargs)  # uniform float32 under autocast: bfloat16 too, as SDPA gives
    assert out.dtype == torch.bfloat16 and both.dtype == torch.bfloat16
    assert explanation.call.dtype == "bfloat16"
    features = {("mask" if n == "attn_mask" else n): val for n, val in kwargs.items()}
    want = reference(*(t.to(torch.bfloat16) for t in (q, k, v)), **features)
    torch.testing.assert_close(out.double(), want, atol=3e-2, rtol=3e-2)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # float64 is left alone, as SDPA leaves it
        assert _call(q.double(), k.double(), v.double(), kwargs).dtype == torch.float64
    assert real.demoted == {} and real.broken == {}


def test_meta_tensors_under_autocast_are_served_as_without_it() -> None:
    """Meta tensors (shape propagation, ``torch.device("meta")`` model init) under a CPU autocast: asking whether
    autocast is on for the "meta" device raised torch's "unknown device type for autocast" RuntimeError; SDPA
    returns a meta tensor there, and so does attention() without autocast."""
    q = torch.empty(1, 2, 4, 8, device="meta")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attnforge.attention(q, q, q)
    assert out.device.type == "meta" and out.shape == q.shape
