"""The direct kernel entries of FlashAttention 2, 3 and 4 against their public functions, on CPU.

Fakes only at the kernel seam: FA3's ``fwd``/``bwd`` are real ``torch.library`` ops registered here with the
schemas :mod:`attnforge.backends._fa3_direct` mirrors (in a test namespace, a CPU kernel computing the float64
reference and recording its positional arguments); the public ``flash_attn_func`` of each version is a
transcription of upstream's Python path onto the same seam (FA3: ``FlashAttnFunc`` -> ``_flash_attn_forward`` ->
the op, hopper/flash_attn_interface.py @0251105a; FA4: ``FlashAttnFunc`` -> ``_flash_attn_fwd``,
flash_attn/cute/interface.py @4.0.0b36; FA2: ``FlashAttnFunc`` -> ``flash_attn_2_cuda.fwd``/``bwd`` over a fake
native module, flash_attn_interface.py @v2.8.3, without the padding of head dims that are not a multiple of 8,
which the direct entry leaves to the public function). Each direct entry must hand the kernel exactly what the
public path hands it, and return the same output and gradients.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
from typing import Any

import pytest
import torch

import attnforge
from attnforge.backends import _fa2_direct, _fa3_direct, _fa4_direct, registry
from attnforge.backends._base import Requirement
from attnforge.backends.adapter import AttentionCall
from attnforge.backends.bound import bound_call
from attnforge.backends.exact import reference_attention
from attnforge.backends.flash import FlashAttn3Adapter, FlashAttn4Adapter, FlashAttnAdapter

NS = "attnforge_fa3_direct_test"
OTHER_NS = "attnforge_fa3_other_test"
#: every positional argument each op received, defaults filled in (a Python kernel drops trailing defaults)
SEEN: dict[str, list[tuple[Any, ...]]] = {"fwd": [], "bwd": []}


def _filled(name: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    schema = getattr(torch.ops, NS).__getattr__(name).default._schema
    return (*args, *(a.default_value for a in schema.arguments[len(args):]))


def _bshd_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, causal: bool,
                    left: int, right: int, softcap: float) -> torch.Tensor:
    window = None if left < 0 and right < 0 else (None if left < 0 else left, None if right < 0 else right)
    out = reference_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal,
                              scale=scale, window=window, softcap=softcap or None)
    return out.transpose(1, 2).to(q.dtype)


def _fwd_kernel(*args: Any) -> tuple[torch.Tensor, ...]:
    full = _filled("fwd", args)
    SEEN["fwd"].append(full)
    q, k, v = full[:3]
    scale, causal, left, right, _chunk, softcap = full[23:29]
    out = _bshd_reference(q, k, v, scale=scale, causal=causal, left=left, right=right, softcap=softcap)
    lse = torch.zeros(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)
    return out, lse, q.new_empty(0), q.new_empty(0)


def _bwd_kernel(*args: Any) -> tuple[torch.Tensor, ...]:
    full = _filled("bwd", args)
    SEEN["bwd"].append(full)
    dout, q, k, v, _out, _lse, dq, dk, dv = full[:9]
    scale, causal, left, right, softcap = full[15:20]
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with torch.enable_grad():
        out = _bshd_reference(*leaves, scale=scale, causal=causal, left=left, right=right, softcap=softcap)
        grads = torch.autograd.grad(out, leaves, dout)
    for into, grad in zip((dq, dk, dv), grads, strict=True):
        into.copy_(grad)
    return q.new_zeros(1), dq.clone(), dk.clone(), dv.clone(), q.new_empty(0)


_LIB = torch.library.Library(NS, "DEF")  # held for the process: the ops stay registered
_LIB.define(_fa3_direct.FWD_SCHEMA)
_LIB.define(_fa3_direct.BWD_SCHEMA)
_LIB.impl("fwd", _fwd_kernel, "CPU")
_LIB.impl("bwd", _bwd_kernel, "CPU")
_OTHER = torch.library.Library(OTHER_NS, "DEF")  # another FA3 version: fwd without sm_margin
_OTHER.define(_fa3_direct.FWD_SCHEMA.replace(", int sm_margin = 0)", ")"))
_OTHER.define(_fa3_direct.BWD_SCHEMA)


# -- FA3's public path, transcribed from hopper/flash_attn_interface.py @0251105a onto the test op ----------
def _maybe_contiguous(x: Any) -> Any:
    return x.contiguous() if x is not None and x.stride(-1) != 1 else x


def _flash_attn_forward(q: Any, k: Any, v: Any, k_new: Any = None, v_new: Any = None,  # noqa: PLR0917 - upstream signature
                        qv: Any = None, out_: Any = None, cu_seqlens_q: Any = None, cu_seqlens_k: Any = None,
                        cu_seqlens_k_new: Any = None, seqused_q: Any = None, seqused_k: Any = None,
                        max_seqlen_q: Any = None, max_seqlen_k: Any = None, page_table: Any = None,
                        kv_batch_idx: Any = None, leftpad_k: Any = None, rotary_cos: Any = None,
                        rotary_sin: Any = None, seqlens_rotary: Any = None, q_descale: Any = None,
                        k_descale: Any = None, v_descale: Any = None, softmax_scale: Any = None,
                        causal: bool = False, window_size_left: int = -1, window_size_right: int = -1,
                        attention_chunk: int = 0, softcap: float = 0.0, rotary_interleaved: bool = True,
                        scheduler_metadata: Any = None, num_splits: int = 1, pack_gqa: Any = None,
                        sm_margin: int = 0) -> Any:
    q, k = _maybe_contiguous(q), _maybe_contiguous(k)
    v = v.contiguous() if v.stride(-1) != 1 and v.stride(-3) != 1 else v
    out, lse, *_ = getattr(torch.ops, NS).fwd(
        q, k, v, k_new, v_new, qv, out_, cu_seqlens_q, cu_seqlens_k, cu_seqlens_k_new, seqused_q, seqused_k,
        max_seqlen_q, max_seqlen_k, page_table, kv_batch_idx, leftpad_k, rotary_cos, rotary_sin, seqlens_rotary,
        q_descale, k_descale, v_descale, softmax_scale, causal, window_size_left, window_size_right,
        attention_chunk, softcap, rotary_interleaved, scheduler_metadata, num_splits, pack_gqa, sm_margin)
    return out, lse, torch.tensor([]), torch.tensor([])


class _Fa3Public(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, v: Any, softmax_scale: Any, causal: bool,  # noqa: PLR0917 - upstream signature
                window_size: tuple[int, int], softcap: float, num_splits: int) -> Any:
        if softmax_scale is None:
            softmax_scale = q.shape[-1] ** (-0.5)
        out, lse, *_ = _flash_attn_forward(q, k, v, None, None, None, None, None, None, None, None, None, None,
                                           None, None, None, None, None, None, None, None, None, None,
                                           softmax_scale, causal=causal, window_size_left=window_size[0],
                                           window_size_right=window_size[1], attention_chunk=0,
                                           softcap=softcap, num_splits=num_splits, pack_gqa=None, sm_margin=0)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (softmax_scale, causal, window_size, softcap)
        return out

    @staticmethod
    def backward(ctx: Any, dout: Any) -> Any:
        q, k, v, out, lse = ctx.saved_tensors
        scale, causal, window, softcap = ctx.args
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dout, q, k, v, out = (_maybe_contiguous(x) for x in (dout, q, k, v, out))
        getattr(torch.ops, NS).bwd(dout, q, k, v, out, lse, dq, dk, dv, None, None, None, None, None, None, scale,
                                   causal, window[0], window[1], softcap, False, 0)
        return dq, dk, dv, None, None, None, None, None


def _fa3_public(q: Any, k: Any, v: Any, softmax_scale: Any = None, causal: bool = False,  # noqa: PLR0917 - upstream
                window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, num_splits: int = 1) -> Any:
    PUBLIC.append("fa3")
    return _Fa3Public.apply(q, k, v, softmax_scale, causal, window_size, softcap, num_splits)


PUBLIC: list[str] = []


def _caps(bid: str) -> Any:
    caps = registry.adapters()[bid].caps  # type: ignore[attr-defined]
    return dataclasses.replace(caps, devices=("cpu",),
                               support=dataclasses.replace(caps.support, dtypes=("float32",)))


#: the lean entry's calls (``attnforge_fwd`` / ``attnforge_bwd`` of :func:`_lean_module`)
LEAN: list[str] = []


def _lean_fwd(q: Any, k: Any, v: Any, scale: float, causal: bool, left: int, right: int,  # noqa: PLR0917 - the entry's
              softcap: float, num_splits: int) -> tuple[Any, Any]:
    """``attnforge_fwd`` of a ``--abi torch`` build, transcribed from the catalog's C++
    (``[[recipes.flash-attn-3.per_torch.also]]``) onto the test op: ``mha_fwd`` with 20 absent tensors, then the
    scale, causal, the window, attention_chunk 0, the softcap, rotary interleaved, no scheduler metadata, the
    splits asked (entry 1: always 1), pack_gqa unset, no SM margin; (out, lse).
    :func:`test_the_catalogs_lean_entry_compiles_and_maps_as_the_ops` compiles the C++ itself."""
    LEAN.append("fwd")
    out, lse, *_ = getattr(torch.ops, NS).fwd.default(q, k, v, *([None] * 20), scale, causal, left, right, 0,
                                                      softcap, True, None, num_splits, None, 0)
    return out, lse


def _lean_fwd_v1(q: Any, k: Any, v: Any, scale: float, causal: bool, left: int, right: int,  # noqa: PLR0917 - the entry's
                 softcap: float) -> tuple[Any, Any]:
    """``attnforge_fwd`` of entry 1: no ``num_splits`` (one split)."""
    return _lean_fwd(q, k, v, scale, causal, left, right, softcap, 1)


def _lean_bwd(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, dq: Any, dk: Any, dv: Any,  # noqa: PLR0917 - the entry's
              scale: float, causal: bool, left: int, right: int, softcap: float) -> None:
    """``attnforge_bwd``, as :func:`_lean_fwd`: ``mha_bwd`` with 6 absent arguments, then the scale, causal, the
    window, the softcap, not deterministic, no SM margin; dq, dk and dv filled in place."""
    LEAN.append("bwd")
    getattr(torch.ops, NS).bwd.default(dout, q, k, v, out, lse, dq, dk, dv, *([None] * 6), scale, causal, left,
                                       right, softcap, False, 0)


class _LeanAttn(torch.autograd.Function):
    """``attnforge_entry::Attn`` (the C++ node of ``attnforge_attn``), transcribed from the catalog's C++."""

    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, v: Any, *args: Any) -> Any:
        *tail, bhsd = args
        if bhsd:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = _maybe_contiguous(q), _maybe_contiguous(k)
        v = v.contiguous() if v.stride(-1) != 1 and v.stride(-3) != 1 else v
        out, lse = _lean_fwd(q, k, v, *tail, 1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = args
        return out

    @staticmethod
    def backward(ctx: Any, dout: Any) -> Any:
        q, k, v, out, lse = ctx.saved_tensors
        *tail, bhsd = ctx.args
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        _lean_bwd(_maybe_contiguous(dout), *(_maybe_contiguous(t) for t in (q, k, v, out)), lse, dq, dk, dv, *tail)
        if bhsd:
            dq, dk, dv = dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
        return dq, dk, dv, *([None] * len(ctx.args))


def _lean_attn(q: Any, k: Any, v: Any, *args: Any) -> Any:
    """``attnforge_attn(q, k, v, scale, causal, left, right, softcap, bhsd)`` (entry 2): the node, then the output's
    transpose outside it for bhsd."""
    LEAN.append("attn")
    out = _LeanAttn.apply(q, k, v, *args)
    return out.transpose(1, 2) if args[-1] else out


def _lean_module(version: int = _fa3_direct.ENTRY_VERSION) -> types.ModuleType:
    module = types.ModuleType("fake_fa3_lean_C")
    module.attnforge_entry = version  # type: ignore[attr-defined]
    module.attnforge_fwd = _lean_fwd if version >= 2 else _lean_fwd_v1  # type: ignore[attr-defined]
    module.attnforge_bwd = _lean_bwd  # type: ignore[attr-defined]
    if version >= 2:
        module.attnforge_attn = _lean_attn  # type: ignore[attr-defined]
    return module


def _train_calls(fa3: FlashAttn3Adapter) -> list[str]:
    """What a train route's forward and backward call of the lean entry (:data:`LEAN`), per ``fa3``'s variant."""
    if not fa3.entry_module:
        return []
    return ["attn", "fwd", "bwd"] if fa3.entry_module == "fake_fa3_lean_C" else ["fwd", "bwd"]


def _forward_splits(fa3: FlashAttn3Adapter) -> int:
    """``num_splits`` of a call that needs no gradient, per ``fa3``'s variant: 0 (FA3's split heuristic, as
    ``flash_attn_func(..., num_splits=0)``), but 1 through entry 1, whose ``attnforge_fwd`` takes none."""
    return 1 if fa3.entry_module == "fake_fa3_lean1_C" else 0


def _train_node(fa3: FlashAttn3Adapter) -> str:
    """The autograd node a train route records, per ``fa3``'s variant (entry 2: the C++ node's transcription)."""
    return "_LeanAttnBackward" if fa3.entry_module == "fake_fa3_lean_C" else "_DirectFunctionBackward"


@pytest.fixture(params=["ops", "lean", "lean-v1"])
def fa3(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> FlashAttn3Adapter:
    """FA3 over the test ops, called directly (``ops``) or through a ``--abi torch`` build's lean entry
    (``lean``; ``lean-v1``: a build's entry before its C++ train node, whose train route is the Python node): each
    must hand the kernel what the public path hands it."""
    module = types.ModuleType("fake_fa3_public")
    module.flash_attn_func = _fa3_public  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_fa3_public", module)
    monkeypatch.setitem(sys.modules, "fake_fa3_lean_C", _lean_module())
    monkeypatch.setitem(sys.modules, "fake_fa3_lean1_C", _lean_module(1))
    for seen in SEEN.values():
        seen.clear()
    PUBLIC.clear()
    LEAN.clear()
    return FlashAttn3Adapter(name="flash-attn-3", caps=_caps("flash-attn-3"), op_namespace=NS,
                             entry_module={"lean": "fake_fa3_lean_C", "lean-v1": "fake_fa3_lean1_C"}.get(request.param),
                             requirement=Requirement(modules=("fake_fa3_public",)))


def _call(q: torch.Tensor, k: torch.Tensor, *, causal: bool, grad: bool) -> AttentionCall:
    return AttentionCall(device_type="cpu", compute_capability=None, dtype="float32", batch=q.shape[0],
                         heads_q=q.shape[1], heads_kv=k.shape[1], seqlen_q=q.shape[2], seqlen_k=k.shape[2],
                         head_dim=q.shape[3], causal=causal, needs_grad=grad)


def _qkv(*, hq: int = 4, hkv: int = 2, sq: int = 5, sk: int = 7, d: int = 8,
         grad: bool = False) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(11)
    return tuple(torch.randn(2, h, s, d, generator=g).requires_grad_(grad) for h, s in ((hq, sq), (hkv, sk), (hkv, sk)))


def _same_args(got: tuple[Any, ...], want: tuple[Any, ...]) -> None:
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor), i
            assert a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b), i
        else:
            assert type(a) is type(b) and a == b, (i, a, b)


CASES = [
    pytest.param({}, False, None, id="plain"),
    pytest.param({}, True, None, id="causal"),
    pytest.param({"hq": 4, "hkv": 4}, True, 0.3, id="mha-scale"),
    pytest.param({"hq": 6, "hkv": 2, "sq": 9, "sk": 4}, True, None, id="gqa-sq-gt-sk"),
    pytest.param({"d": 16}, False, 0.5, id="d16"),
]


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
@pytest.mark.parametrize(("dims", "causal", "scale"), CASES)
def test_fa3_direct_forward_passes_what_the_public_entry_passes(fa3: FlashAttn3Adapter, dims: dict[str, int],
                                                               causal: bool, scale: float | None,
                                                               bshd: bool) -> None:
    q, k, v = _qkv(**dims)
    call = _call(q, k, causal=causal, grad=False)
    direct = bound_call(fa3, call, causal=causal, scale=scale, bshd=bshd)
    args = tuple(t.transpose(1, 2) for t in (q, k, v)) if bshd else (q, k, v)
    out = direct(*args)
    assert PUBLIC == []  # the public function was not called
    bshd_args = args if bshd else tuple(t.transpose(1, 2) for t in args)
    want = _fa3_public(*bshd_args, softmax_scale=scale, causal=causal, num_splits=_forward_splits(fa3))
    (got_args,), (want_args,) = SEEN["fwd"][:1], SEEN["fwd"][1:]
    _same_args(got_args, want_args)
    assert got_args[23] == (scale if scale is not None else q.shape[-1] ** -0.5)
    assert got_args[24:36] == (causal, -1, -1, 0, 0.0, True, None, _forward_splits(fa3), None, 0)
    torch.testing.assert_close(out, want if bshd else want.transpose(1, 2))
    assert (["fwd"] if fa3.entry_module else []) == LEAN


@pytest.mark.parametrize(("window", "softcap"), [((3, -1), 0.0), ((2, 1), 0.0), ((-1, -1), 5.0), ((4, 0), 2.5)],
                         ids=["left", "both", "softcap", "window+softcap"])
def test_fa3_direct_maps_window_and_softcap_as_the_public_entry(fa3: FlashAttn3Adapter, window: tuple[int, int],
                                                                softcap: float) -> None:
    q, k, v = (t.transpose(1, 2) for t in _qkv(sq=7))
    ops = fa3.direct_entry()
    out = _fa3_direct.bind(ops, scale=0.4, causal=False, bshd=True, needs_grad=False, window=window,
                           softcap=softcap)(q, k, v)
    want = _fa3_public(q, k, v, softmax_scale=0.4, causal=False, window_size=window, softcap=softcap,
                       num_splits=_forward_splits(fa3))
    _same_args(SEEN["fwd"][0], SEEN["fwd"][1])
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
def test_fa3_direct_backward_matches_the_public_entry(fa3: FlashAttn3Adapter, bshd: bool) -> None:
    q, k, v = _qkv(grad=True)
    call = _call(q, k, causal=True, grad=True)
    direct = bound_call(fa3, call, causal=True, scale=None, bshd=bshd)
    args = tuple(t.transpose(1, 2) for t in (q, k, v)) if bshd else (q, k, v)
    out = direct(*args)
    got = torch.autograd.grad(out.square().sum(), (q, k, v))
    assert PUBLIC == []
    bshd_args = args if bshd else tuple(t.transpose(1, 2) for t in args)
    want_out = _fa3_public(*bshd_args, causal=True)
    want = torch.autograd.grad(want_out.square().sum(), (q, k, v))
    _same_args(SEEN["fwd"][0], SEEN["fwd"][1])
    _same_args(SEEN["bwd"][0], SEEN["bwd"][1])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    assert _train_calls(fa3) == LEAN
    ref = reference_attention(q, k, v, causal=True)
    torch.testing.assert_close(got[0], torch.autograd.grad(ref.square().sum(), q)[0], atol=1e-5, rtol=1e-4)


def test_fa3_forward_only_when_no_gradient_is_needed(fa3: FlashAttn3Adapter) -> None:
    q, k, v = _qkv()
    out = bound_call(fa3, _call(q, k, causal=False, grad=False), causal=False, scale=None)(q, k, v)
    assert out.grad_fn is None  # no autograd node at all (a view of the op's output)
    q, k, v = _qkv(grad=True)
    out = bound_call(fa3, _call(q, k, causal=False, grad=True), causal=False, scale=None)(q, k, v)
    assert type(out.grad_fn.next_functions[0][0]).__name__ == _train_node(fa3)  # one node under the view


def test_the_bhsd_train_route_is_one_node_over_the_callers_leaves_and_a_plain_view(fa3: FlashAttn3Adapter) -> None:
    """The bhsd train route transposes its inputs inside its autograd node: the node's inputs are the caller's
    leaves themselves (no transpose node each, ~7 us of host time a fwd+bwd on a CPU), and its output is a view made
    outside it (autograd treats a view returned by a custom Function's forward apart); the gradients are the exact
    math's."""
    q, k, v = _qkv(grad=True)
    route = bound_call(fa3, _call(q, k, causal=True, grad=True), causal=True, scale=None)
    out = route(q, k, v)
    node = out.grad_fn.next_functions[0][0]
    assert type(node).__name__ == _train_node(fa3)
    assert [type(f).__name__ for f, _ in node.next_functions[:3]] == ["AccumulateGrad"] * 3
    assert type(out.grad_fn).__name__ == "TransposeBackward0"
    got = torch.autograd.grad(out.square().sum(), (q, k, v))
    want = torch.autograd.grad(reference_attention(q, k, v, causal=True).square().sum(), (q, k, v))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w.to(g.dtype), atol=1e-5, rtol=1e-4)


# Dynamo's handling of any autograd.Function instantiates it (torch 2.13: "should not be instantiated")
@pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")
def test_the_train_node_skips_functions_python_apply_and_keeps_its_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The direct entries' autograd node is entered through torch's C++ ``apply``, not ``Function.apply``'s Python
    layer (~1 us of host time a call on a CPU, more on a slow GPU host: FA4's train route measured SDPA + 8-11.5 us,
    H200, 2026-12-01). Same output and gradients; under a ``torch.func`` transform ``Function.apply`` still serves
    (and raises: the node has no ``setup_context``, and the dispatcher then serves the call elsewhere), and while
    ``torch.compile`` traces it is ``Function.apply`` that Dynamo follows, without a graph break."""
    import torch._functorch.utils as functorch_utils

    from attnforge.backends import bound

    class Node(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
            ctx.save_for_backward(k)
            ctx.scale = scale
            return q * k.sum() * scale + v

        @staticmethod
        def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
            (k,) = ctx.saved_tensors
            return dout * k.sum() * ctx.scale, None, dout, None

    python_layer: list[int] = []
    unwrap = functorch_utils.unwrap_dead_wrappers
    monkeypatch.setattr(functorch_utils, "unwrap_dead_wrappers",
                        lambda args: python_layer.append(1) or unwrap(args))  # Function.apply's own step
    apply = bound._lean_apply(Node)
    q, k, v = (torch.randn(2, 3, requires_grad=True) for _ in range(3))
    out = apply(q, k, v, 0.5)
    assert python_layer == []  # torch's C++ apply, not the Python layer
    assert type(out.grad_fn).__name__ == "NodeBackward"
    want = Node.apply(q, k, v, 0.5)
    assert python_layer == [1]  # the seam sees Function.apply's layer
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), (q, v)), torch.autograd.grad(want.sum(), (q, v)))
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda x: apply(x, k.detach(), v.detach(), 0.5).sum())(q.detach())
    monkeypatch.undo()
    compiled = torch.compile(lambda a, b, c: apply(a, b, c, 0.5), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), want)


def test_fa3_another_schema_keeps_the_public_function(fa3: FlashAttn3Adapter) -> None:
    assert _fa3_direct.find_ops(NS) is not None
    assert _fa3_direct.find_ops(OTHER_NS) is None
    assert _fa3_direct.find_ops("attnforge_no_such_namespace") is None
    other = dataclasses.replace(fa3, op_namespace=OTHER_NS, _direct=[])
    q, k, v = _qkv()
    out = bound_call(other, _call(q, k, causal=True, grad=False), causal=True, scale=None)(q, k, v)
    assert PUBLIC == ["fa3"]
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, causal=True), atol=1e-5, rtol=1e-4)


def test_explain_names_how_fa3_is_reached_once_looked_up(fa3: FlashAttn3Adapter) -> None:
    """``serving_notes`` (explain()'s notes for the chosen backend) says nothing before the process looked for the
    entry (it imports nothing), then which one a route calls: the lean entry, or the ops with the hint that
    ``--abi torch`` adds it, or the public function for another build."""
    q, k, _ = _qkv()
    call = _call(q, k, causal=True, grad=False)
    assert fa3.serving_notes(call) == ()
    fa3.direct_entry()
    (note,) = fa3.serving_notes(call)
    if fa3.entry_module:
        assert "lean entry (flash_attn_3._C.attnforge_fwd" in note
        assert ("C++ autograd node" in note) is (fa3.entry_module == "fake_fa3_lean_C")
        assert ("rebuilding it" in note) is (fa3.entry_module == "fake_fa3_lean1_C")
    else:
        assert "torch.ops.flash_attn_3.fwd" in note and "--abi torch" in note
    other = dataclasses.replace(fa3, op_namespace=OTHER_NS, _direct=[])
    other.direct_entry()
    assert "public flash_attn_func" in other.serving_notes(call)[0]


def test_a_lean_entry_of_another_version_or_over_other_ops_is_not_called(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lean entry serves only where its module says the version :func:`_fa3_direct.bind` calls and the ops'
    schemas are the mirrored ones (it wraps the same ``mha_fwd``): another version keeps the ops."""
    monkeypatch.setitem(sys.modules, "fake_fa3_lean_C", _lean_module())
    ops = _fa3_direct.find_ops(NS, "fake_fa3_lean_C")
    assert ops is not None and ops.entry is sys.modules["fake_fa3_lean_C"]
    assert _fa3_direct.find_ops(OTHER_NS, "fake_fa3_lean_C") is None
    assert _fa3_direct.find_ops(NS, "attnforge_no_such_module").entry is None  # type: ignore[union-attr]
    assert ops.train is _lean_attn
    without_node = _lean_module()
    del without_node.attnforge_attn  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_fa3_lean_C", without_node)  # says 2, lacks the node: the Python node
    ops = _fa3_direct.find_ops(NS, "fake_fa3_lean_C")
    assert ops is not None and ops.entry is without_node and ops.train is None
    monkeypatch.setitem(sys.modules, "fake_fa3_lean_C", _lean_module(1))  # before the C++ train node
    ops = _fa3_direct.find_ops(NS, "fake_fa3_lean_C")
    assert ops is not None and ops.entry is sys.modules["fake_fa3_lean_C"] and ops.train is None
    monkeypatch.setitem(sys.modules, "fake_fa3_lean_C", _lean_module(_fa3_direct.ENTRY_VERSION + 1))
    ops = _fa3_direct.find_ops(NS, "fake_fa3_lean_C")
    assert ops is not None and ops.entry is None
    LEAN.clear()
    q, k, v = (t.transpose(1, 2) for t in _qkv())
    _fa3_direct.bind(ops, scale=0.5, causal=True, bshd=True, needs_grad=False)(q, k, v)
    assert LEAN == []


_SINK_STUB = r"""
#include <torch/extension.h>
// mha_fwd / mha_bwd as flash_api.cpp declares them (lines 672-706, 1267-1290 @0251105a), each handing every argument
// to the Python module attnforge_fa3_entry_sink (the test op behind it), so the catalog's C++ runs unchanged
using OT = std::optional<at::Tensor>;
using OI = std::optional<int64_t>;
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> mha_fwd(
    at::Tensor q, at::Tensor k, at::Tensor v, OT a3, OT a4, OT a5, OT a6, OT a7, OT a8, OT a9, OT a10, OT a11, OI a12,
    OI a13, OT a14, OT a15, OT a16, OT a17, OT a18, OT a19, OT a20, OT a21, OT a22, std::optional<double> a23,
    bool a24, int64_t a25, int64_t a26, int64_t a27, double a28, bool a29, OT a30, int64_t a31,
    std::optional<bool> a32, int64_t a33) {
    pybind11::gil_scoped_acquire gil;
    pybind11::tuple r = pybind11::module_::import("attnforge_fa3_entry_sink").attr("fwd")(
        q, k, v, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23,
        a24, a25, a26, a27, a28, a29, a30, a31, a32, a33);
    return {r[0].cast<at::Tensor>(), r[1].cast<at::Tensor>(), r[2].cast<at::Tensor>(), r[3].cast<at::Tensor>()};
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> mha_bwd(
    at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out, at::Tensor lse, OT dq, OT dk, OT dv,
    OT a9, OT a10, OT a11, OT a12, OI a13, OI a14, std::optional<double> a15, bool a16, int64_t a17, int64_t a18,
    double a19, bool a20, int64_t a21) {
    pybind11::gil_scoped_acquire gil;
    pybind11::tuple r = pybind11::module_::import("attnforge_fa3_entry_sink").attr("bwd")(
        dout, q, k, v, out, lse, dq, dk, dv, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21);
    return {r[0].cast<at::Tensor>(), r[1].cast<at::Tensor>(), r[2].cast<at::Tensor>(), r[3].cast<at::Tensor>(),
            r[4].cast<at::Tensor>()};
}
"""


@functools.cache
def _compiled_entry(build_directory: str) -> Any:
    """The catalog's lean-entry C++ over :data:`_SINK_STUB`, compiled once per process (``_C``, the build's name:
    torch names a second load of one name apart)."""
    from torch.utils.cpp_extension import load_inline

    from attnforge.catalog import load_catalog

    recipe = load_catalog().recipe("flash-attn-3")
    assert recipe is not None
    anchor = "TORCH_LIBRARY(flash_attn_3, m) {"
    (block,) = [e.replace.removesuffix(anchor) for e in recipe.per_torch_also if e.find == anchor]
    return load_inline("_C", cpp_sources=[_SINK_STUB + block], build_directory=build_directory, verbose=False)


@pytest.mark.slow
def test_the_catalogs_lean_entry_compiles_and_maps_as_the_ops(fa3: FlashAttn3Adapter,
                                                              tmp_path_factory: pytest.TempPathFactory,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The C++ the catalog's ``--abi torch`` edits add to flash_api.cpp, compiled for real (a pybind11 module named
    ``_C``, as in the build) over stand-ins of ``mha_fwd`` / ``mha_bwd`` that pass every argument on to the test
    ops: the forward and backward (the C++ train node on either layout) hand the kernel exactly what the public path
    hands it (every argument, defaults included), with the GIL released around the call as the edit asks."""
    sink = types.ModuleType("attnforge_fa3_entry_sink")
    sink.fwd = getattr(torch.ops, NS).fwd.default  # type: ignore[attr-defined]
    sink.bwd = getattr(torch.ops, NS).bwd.default  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "attnforge_fa3_entry_sink", sink)
    build = tmp_path_factory.getbasetemp() / "fa3_entry"  # one for the session: the module is compiled once
    build.mkdir(exist_ok=True)
    module = _compiled_entry(str(build))
    assert module.attnforge_entry == _fa3_direct.ENTRY_VERSION
    monkeypatch.setitem(sys.modules, "fake_fa3_compiled_C", module)
    adapter = dataclasses.replace(fa3, entry_module="fake_fa3_compiled_C", _direct=[])
    for bshd, dims in ((False, {}), (True, {"hq": 6, "hkv": 2, "sq": 9, "sk": 4})):
        for seen in SEEN.values():
            seen.clear()
        q, k, v = _qkv(grad=True, **dims)
        route = bound_call(adapter, _call(q, k, causal=True, grad=True), causal=True, scale=None, bshd=bshd)
        args = tuple(t.transpose(1, 2) for t in (q, k, v)) if bshd else (q, k, v)
        out = route(*args)
        node = out.grad_fn if bshd else out.grad_fn.next_functions[0][0]  # bhsd: the output's view outside it
        assert "attnforge_entry::Attn" in node.name()  # the C++ train node, one over the caller's tensors
        assert [type(f).__name__ for f, _ in node.next_functions[:3]] == (
            ["TransposeBackward0"] * 3 if bshd else ["AccumulateGrad"] * 3)
        got = torch.autograd.grad(out.square().sum(), (q, k, v))
        assert PUBLIC == [] and LEAN == []  # the compiled entry served, not the Python transcription
        want_out = _fa3_public(*(args if bshd else (t.transpose(1, 2) for t in args)), causal=True)
        want = torch.autograd.grad(want_out.square().sum(), (q, k, v))
        _same_args(SEEN["fwd"][0], SEEN["fwd"][1])
        _same_args(SEEN["bwd"][0], SEEN["bwd"][1])
        torch.testing.assert_close(out, want_out if bshd else want_out.transpose(1, 2))
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
        PUBLIC.clear()
    SEEN["fwd"].clear()
    x = (t.detach().transpose(1, 2) for t in _qkv(sq=7))
    windowed = _fa3_direct.bind(adapter.direct_entry(), scale=0.4, causal=False, bshd=True, needs_grad=False,
                                window=(4, 0), softcap=2.5)
    qb, kb, vb = x
    torch.testing.assert_close(windowed(qb, kb, vb), _fa3_public(qb, kb, vb, softmax_scale=0.4, window_size=(4, 0),
                                                               softcap=2.5, num_splits=0))
    _same_args(SEEN["fwd"][0], SEEN["fwd"][1])


def test_the_mirrored_schemas_are_the_registered_text() -> None:
    """What find_ops compares is torch's canonical form of upstream's text (so formatting cannot matter)."""
    registered = str(getattr(torch.ops, NS).fwd.default._schema)
    assert registered == str(torch._C.parse_schema(f"{NS}::{_fa3_direct.FWD_SCHEMA}"))
    assert "int sm_margin=0) -> (Tensor(out!), Tensor, Tensor, Tensor)" in registered
    assert len(getattr(torch.ops, NS).fwd.default._schema.arguments) == 34


# -- FA4 ------------------------------------------------------------------------------------------------------
def _fa4_modules(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    """A fake ``flash_attn.cute`` whose ``flash_attn_func`` runs upstream's ``FlashAttnFunc.forward`` call of
    ``_flash_attn_fwd`` (interface.py:3780-3837 @4.0.0b36), and the interface module holding the latter."""
    seen: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def _flash_attn_fwd(q: Any, k: Any, v: Any, **kw: Any) -> Any:
        seen.append(("fwd", (q, k, v), kw))
        out, lse = reference_attention(q.transpose(1, 2).detach(), k.transpose(1, 2).detach(),
                                       v.transpose(1, 2).detach(), causal=kw["causal"], scale=kw["softmax_scale"],
                                       return_lse=True)
        # interface.py:886-891: the lse [B, H, Sq] fp32 exists when an input requires grad or return_lse asks
        wants_lse = kw["return_lse"] or any(t.requires_grad for t in (q, k, v))
        return (out.transpose(1, 2).to(q.dtype), lse.float() if wants_lse else None, None, None, None)

    def _flash_attn_bwd(q: Any, k: Any, v: Any, out: Any, dout: Any, lse: Any, softmax_scale: Any = None,  # noqa: PLR0917 - upstream signature
                        causal: bool = False, softcap: float = 0.0, **kw: Any) -> Any:
        seen.append(("bwd", (q, k, v, out, dout, lse), {"softmax_scale": softmax_scale, "causal": causal,
                                                         "softcap": softcap, **kw}))
        return _reference_bwd(q, k, v, out, dout, lse, softmax_scale=softmax_scale, causal=causal)

    class FlashAttnFunc(torch.autograd.Function):
        """Upstream's FlashAttnFunc for a plain call (interface.py:3780-3915 @4.0.0b36)."""

        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, softmax_scale: Any, causal: bool,  # noqa: PLR0917 - autograd
                    fwd_kw: dict[str, Any]) -> Any:
            out, lse, *_ = _flash_attn_fwd(q, k, v, softmax_scale=softmax_scale, causal=causal, **fwd_kw)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.softmax_scale, ctx.causal = softmax_scale, causal
            return out, lse

        @staticmethod
        def backward(ctx: Any, dout: Any, dlse: Any) -> Any:
            q, k, v, out, lse = ctx.saved_tensors
            dq, dk, dv = _flash_attn_bwd(q, k, v, out, dout, lse, ctx.softmax_scale, ctx.causal, 0.0,
                                         window_size_left=None, window_size_right=None, deterministic=False,
                                         score_mod=None, score_mod_bwd=None, mask_mod=None, aux_tensors=None,
                                         aux_scalars=None, block_sparse_tensors=None, dlse=None,
                                         learnable_sink=None)
            return dq, dk, dv, None, None, None

    def flash_attn_func(q: Any, k: Any, v: Any, qv: Any = None, gather_kv_indices: Any = None,  # noqa: PLR0917 - upstream signature
                        softmax_scale: Any = None, causal: bool = False, window_size: Any = (None, None),
                        learnable_sink: Any = None, softcap: float = 0.0, num_splits: int = 1,
                        pack_gqa: Any = None, deterministic: bool = False, score_mod: Any = None,
                        score_mod_bwd: Any = None, mask_mod: Any = None, aux_tensors: Any = None,
                        aux_scalars: Any = None, block_sparse_tensors: Any = None,
                        block_sparse_tensors_bwd: Any = None, return_lse: bool = False,
                        gather_bwd_recompute_p: bool = False, gather_bwd_token_chunk: Any = None) -> Any:
        seen.append(("public", (), {}))
        aux_scalars = tuple(aux_scalars) if aux_scalars else None
        fwd_kw = {"qv": qv, "window_size_left": window_size[0], "window_size_right": window_size[1],
                  "learnable_sink": learnable_sink, "softcap": softcap, "num_splits": num_splits,
                  "pack_gqa": pack_gqa, "score_mod": score_mod, "mask_mod": mask_mod, "aux_tensors": aux_tensors,
                  "aux_scalars": aux_scalars, "block_sparse_tensors": block_sparse_tensors,
                  "return_lse": return_lse, "gather_kv_indices": gather_kv_indices,
                  "gather_bwd_recompute_p": gather_bwd_recompute_p}
        return FlashAttnFunc.apply(q, k, v, softmax_scale, causal, fwd_kw)

    cute = types.ModuleType("fake_fa4_cute")
    cute.flash_attn_func = flash_attn_func  # type: ignore[attr-defined]
    interface = types.ModuleType("fake_fa4_cute.interface")
    interface._flash_attn_fwd = _flash_attn_fwd  # type: ignore[attr-defined]
    interface._flash_attn_bwd = _flash_attn_bwd  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_fa4_cute", cute)
    monkeypatch.setitem(sys.modules, "fake_fa4_cute.interface", interface)
    monkeypatch.setattr(_fa4_direct, "INTERFACE", "fake_fa4_cute.interface")
    return seen


def _fa4(monkeypatch: pytest.MonkeyPatch, *, version_matches: bool) -> FlashAttn4Adapter:
    # the installed distribution read is pytest's own; the pin is set to its version, or not
    monkeypatch.setattr(_fa4_direct, "VERSIONS", frozenset({pytest.__version__ if version_matches else "0.0.0"}))
    return FlashAttn4Adapter(name="flash-attn-4", caps=_caps("flash-attn-4"),
                             requirement=Requirement(modules=("fake_fa4_cute",), distributions=("pytest",)))


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
@pytest.mark.parametrize(("causal", "scale"), [(False, None), (True, 0.3)], ids=["plain", "causal-scale"])
def test_fa4_direct_forward_passes_what_flash_attn_func_passes(monkeypatch: pytest.MonkeyPatch, bshd: bool,
                                                              causal: bool, scale: float | None) -> None:
    seen = _fa4_modules(monkeypatch)
    fa4 = _fa4(monkeypatch, version_matches=True)
    q, k, v = _qkv()
    args = tuple(t.transpose(1, 2) for t in (q, k, v)) if bshd else (q, k, v)
    out = bound_call(fa4, _call(q, k, causal=causal, grad=False), causal=causal, scale=scale, bshd=bshd)(*args)
    assert [s[0] for s in seen] == ["fwd"]  # flash_attn_func skipped
    bshd_args = args if bshd else tuple(t.transpose(1, 2) for t in args)
    want, _ = sys.modules["fake_fa4_cute"].flash_attn_func(*bshd_args, softmax_scale=scale, causal=causal)
    (_, got_t, got_kw), (_, _, _), (_, want_t, want_kw) = seen
    assert got_kw == want_kw
    for a, b in zip(got_t, want_t, strict=True):
        assert a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)
    torch.testing.assert_close(out, want if bshd else want.transpose(1, 2))


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
@pytest.mark.parametrize(("causal", "scale"), [(False, None), (True, 0.3)], ids=["plain", "causal-scale"])
def test_fa4_train_route_passes_what_flash_attn_funcs_forward_and_backward_pass(
        monkeypatch: pytest.MonkeyPatch, bshd: bool, causal: bool, scale: float | None) -> None:
    """A call that needs a gradient: the lean autograd.Function calls _flash_attn_fwd with FlashAttnFunc.forward's
    keywords and _flash_attn_bwd with FlashAttnFunc.backward's arguments; output and gradients are the public
    function's (upstream's FlashAttnFunc mirrored in the fake)."""
    seen = _fa4_modules(monkeypatch)
    fa4 = _fa4(monkeypatch, version_matches=True)
    q, k, v = _qkv(grad=True)
    args = tuple(t.detach().transpose(1, 2).contiguous().requires_grad_(True) for t in (q, k, v)) if bshd else (q, k, v)
    run = bound_call(fa4, _call(q, k, causal=causal, grad=True), causal=causal, scale=scale, bshd=bshd)
    out = run(*args)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    got = torch.autograd.grad(out, args, dout)
    assert [s[0] for s in seen] == ["fwd", "bwd"]  # flash_attn_func skipped, both directions
    mine = list(seen)
    seen.clear()
    pub = tuple(t.detach().clone().requires_grad_(True) for t in args)
    pub_bshd = pub if bshd else tuple(t.transpose(1, 2) for t in pub)
    want_out, _ = sys.modules["fake_fa4_cute"].flash_attn_func(*pub_bshd, softmax_scale=scale, causal=causal)
    want_out = want_out if bshd else want_out.transpose(1, 2)
    want = torch.autograd.grad(want_out, pub, dout)
    assert [s[0] for s in seen] == ["public", "fwd", "bwd"]
    for (kind, got_t, got_kw), (_, want_t, want_kw) in zip(mine, seen[1:], strict=True):
        assert got_kw == want_kw, kind
        for a, b in zip(got_t, want_t, strict=True):
            if isinstance(b, torch.Tensor):
                assert a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b), kind
            else:
                assert a is b, kind
    torch.testing.assert_close(out, want_out)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.stride() == w.stride()
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize(("grad", "version_matches", "has_bwd"),
                         [(True, False, True), (False, False, True), (True, True, False)],
                         ids=["needs-grad-other-version", "other-version", "needs-grad-no-bwd"])
def test_fa4_keeps_flash_attn_func_for_another_version_or_without_its_backward(
        monkeypatch: pytest.MonkeyPatch, grad: bool, version_matches: bool, has_bwd: bool) -> None:
    seen = _fa4_modules(monkeypatch)
    if not has_bwd:
        monkeypatch.delattr(sys.modules["fake_fa4_cute.interface"], "_flash_attn_bwd")
    fa4 = _fa4(monkeypatch, version_matches=version_matches)
    q, k, v = _qkv(grad=grad)
    bound_call(fa4, _call(q, k, causal=True, grad=grad), causal=True, scale=None)(q, k, v)
    assert [s[0] for s in seen] == ["public", "fwd"]


# -- verify runs the route the dispatcher serves ----------------------------------------------------------------
def test_verify_runs_the_direct_entry_so_a_wrong_mapping_fails(fa3: FlashAttn3Adapter,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from attnforge.catalog.tolerances import load_tolerances
    from attnforge.verify.cases import generate_cases
    from attnforge.verify.check import verify_backend
    from attnforge.verify.device import current_device

    cases = generate_cases(dtypes=("float32",), head_dims=(32,), max_seqlen=24, seed=5)[:4]
    assert {c.causal for c in cases} == {False, True}
    good = verify_backend(fa3, device=current_device("cpu"), cases=cases, tolerances=load_tolerances())
    assert good.ok, good.summary
    assert len(SEEN["fwd"]) == len(cases) and PUBLIC == []  # every case ran the op directly

    if fa3.entry_module:  # the lean entry's mapping dropped causal
        lean_fwd = sys.modules[fa3.entry_module].attnforge_fwd

        def lean_causal_dropped(q: Any, k: Any, v: Any, scale: float, _causal: bool, *rest: Any) -> Any:
            return lean_fwd(q, k, v, scale, False, *rest)

        monkeypatch.setattr(sys.modules[fa3.entry_module], "attnforge_fwd", lean_causal_dropped)
    else:  # the ops' argument tail dropped causal
        right = _fa3_direct.forward_tail

        def causal_dropped(**kw: Any) -> tuple[Any, ...]:
            return right(**{**kw, "causal": False})

        monkeypatch.setattr(_fa3_direct, "forward_tail", causal_dropped)
    bad = verify_backend(dataclasses.replace(fa3, _direct=[]), device=current_device("cpu"), cases=cases,
                         tolerances=load_tolerances())
    assert not bad.ok
    assert any(r.case.causal and r.status.value == "failed" for r in bad.cases)


# -- FA2 ------------------------------------------------------------------------------------------------------
def _fa2_modules(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...]]]:
    """A fake ``flash_attn_2_cuda`` (``fwd``/``bwd`` record their positional arguments and compute the
    reference) and a fake ``flash_attn`` whose ``flash_attn_func`` is upstream's ``FlashAttnFunc`` ->
    ``_flash_attn_forward`` path (flash_attn_interface.py @v2.8.3 lines 76-106, 237-286, 807-890, 1135)."""
    seen: list[tuple[str, tuple[Any, ...]]] = []
    native = types.ModuleType("fake_fa2_cuda")

    def fwd(*args: Any) -> Any:
        seen.append(("fwd", args))
        q, k, v, _out, _alibi, _dropout, scale, causal, left, right, softcap = args[:11]
        out = _bshd_reference(q, k, v, scale=scale, causal=causal, left=left, right=right, softcap=softcap)
        return out, torch.zeros(q.shape[0], q.shape[2], q.shape[1]), q.new_empty(0), torch.zeros(2)

    def bwd(*args: Any) -> Any:
        seen.append(("bwd", args))
        dout, q, k, v, _out, _lse, dq, dk, dv, _alibi, _dropout, scale, causal, left, right, softcap = args[:16]
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        with torch.enable_grad():
            out = _bshd_reference(*leaves, scale=scale, causal=causal, left=left, right=right, softcap=softcap)
            grads = torch.autograd.grad(out, leaves, dout)
        for into, grad in zip((dq, dk, dv), grads, strict=True):
            into.copy_(grad)
        return dq, dk, dv, q.new_zeros(1)

    native.fwd, native.bwd = fwd, bwd  # type: ignore[attr-defined]

    class FlashAttnFunc(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, dropout_p: float, softmax_scale: Any,  # noqa: PLR0917 - upstream signature
                    causal: bool, window_size: Any, softcap: float, alibi_slopes: Any, deterministic: bool,
                    return_softmax: bool, is_grad_enabled: bool) -> Any:
            if softmax_scale is None:
                softmax_scale = q.shape[-1] ** (-0.5)
            q, k, v = (_maybe_contiguous(x) for x in (q, k, v))
            out, lse, _, rng_state = native.fwd(q, k, v, None, alibi_slopes, dropout_p, softmax_scale, causal,
                                                window_size[0], window_size[1], softcap,
                                                return_softmax and dropout_p > 0, None)
            ctx.save_for_backward(q, k, v, out, lse, rng_state)
            ctx.args = (dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic)
            return out

        @staticmethod
        def backward(ctx: Any, dout: Any) -> Any:
            q, k, v, out, lse, rng_state = ctx.saved_tensors
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            dropout_p, scale, causal, window, softcap, alibi, deterministic = ctx.args
            dout, q, k, v, out = (_maybe_contiguous(x) for x in (dout, q, k, v, out))
            native.bwd(dout, q, k, v, out, lse, dq, dk, dv, alibi, dropout_p, scale, causal, window[0], window[1],
                       softcap, deterministic, None, rng_state)
            return dq, dk, dv, *(None,) * 9

    def flash_attn_func(q: Any, k: Any, v: Any, dropout_p: float = 0.0, softmax_scale: Any = None,  # noqa: PLR0917 - upstream signature
                        causal: bool = False, window_size: Any = (-1, -1), softcap: float = 0.0,
                        alibi_slopes: Any = None, deterministic: bool = False, return_attn_probs: bool = False) -> Any:
        seen.append(("public", ()))
        return FlashAttnFunc.apply(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                   deterministic, return_attn_probs, torch.is_grad_enabled())

    public = types.ModuleType("fake_fa2")
    public.flash_attn_func = flash_attn_func  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_fa2", public)
    monkeypatch.setitem(sys.modules, "fake_fa2_cuda", native)
    monkeypatch.setattr(_fa2_direct, "NATIVE", "fake_fa2_cuda")
    return seen


def _fa2(monkeypatch: pytest.MonkeyPatch, *, version_matches: bool) -> Any:
    monkeypatch.setattr(_fa2_direct, "VERSIONS", frozenset({pytest.__version__ if version_matches else "0.0.0"}))
    return FlashAttnAdapter(name="flash-attn", caps=_caps("flash-attn"),
                            requirement=Requirement(modules=("fake_fa2",), distributions=("pytest",)))


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
@pytest.mark.parametrize(("dims", "causal", "scale"), CASES[:4])
def test_fa2_direct_passes_what_the_public_entry_passes(monkeypatch: pytest.MonkeyPatch,  # noqa: PLR0917 - parametrized
                                                        dims: dict[str, int], causal: bool, scale: float | None,
                                                        bshd: bool, grad: bool) -> None:
    seen = _fa2_modules(monkeypatch)
    fa2 = _fa2(monkeypatch, version_matches=True)
    q, k, v = _qkv(**dims, grad=grad)
    args = tuple(t.transpose(1, 2) for t in (q, k, v)) if bshd else (q, k, v)
    out = bound_call(fa2, _call(q, k, causal=causal, grad=grad), causal=causal, scale=scale, bshd=bshd)(*args)
    bshd_args = args if bshd else tuple(t.transpose(1, 2) for t in args)
    want = sys.modules["fake_fa2"].flash_attn_func(*bshd_args, softmax_scale=scale, causal=causal)
    want = want if bshd else want.transpose(1, 2)
    torch.testing.assert_close(out, want)
    if grad:
        got_grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        want_grads = torch.autograd.grad(want.square().sum(), (q, k, v))
        for g, w in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, w)
    kinds = [s[0] for s in seen]
    assert kinds == (["fwd", "public", "fwd", "bwd", "bwd"] if grad else ["fwd", "public", "fwd"])
    pairs = [(seen[0][1], seen[2][1])] + ([(seen[3][1], seen[4][1])] if grad else [])
    for got_args, want_args in pairs:
        _same_args(got_args, want_args)


@pytest.mark.parametrize(("d", "version_matches"), [(12, True), (8, False)], ids=["d12-padded", "other-version"])
def test_fa2_keeps_the_public_function_for_padded_head_dims_or_another_version(
        monkeypatch: pytest.MonkeyPatch, d: int, version_matches: bool) -> None:
    seen = _fa2_modules(monkeypatch)
    fa2 = _fa2(monkeypatch, version_matches=version_matches)
    q, k, v = _qkv(d=d)
    bound_call(fa2, _call(q, k, causal=True, grad=False), causal=True, scale=None)(q, k, v)
    assert seen[0][0] == "public"


# -- SageAttention ----------------------------------------------------------------------------------------------
def _sage_module(monkeypatch: pytest.MonkeyPatch, arch: tuple[int, int]) -> list[tuple[str, dict[str, Any]]]:
    """A fake ``sageattention`` whose ``sageattn`` picks the kernel per arch as upstream's does
    (sageattention/core.py:143-157 @d1a57a5; the arch comes from ``arch`` here, not the GPU)."""
    seen: list[tuple[str, dict[str, Any]]] = []
    module = types.ModuleType("fake_sage")

    def kernel(name: str) -> Any:
        def run(q: Any, k: Any, v: Any, **kw: Any) -> Any:
            seen.append((name, kw))
            layout = kw["tensor_layout"]
            qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v)) if layout == "NHD" else (q, k, v)
            out = reference_attention(qh, kh, vh, causal=kw["is_causal"], scale=kw["sm_scale"]).to(q.dtype)
            return out.transpose(1, 2) if layout == "NHD" else out
        return run

    for name in ("sageattn_qk_int8_pv_fp16_cuda", "sageattn_qk_int8_pv_fp16_triton", "sageattn_qk_int8_pv_fp8_cuda",
                 "sageattn_qk_int8_pv_fp8_cuda_sm90"):
        setattr(module, name, kernel(name))
    m: Any = module

    def sageattn(q: Any, k: Any, v: Any, tensor_layout: str = "HND", is_causal: bool = False,  # noqa: PLR0917 - upstream signature
                 sm_scale: Any = None, return_lse: bool = False, **kwargs: Any) -> Any:
        seen.append(("public", {}))
        common = {"tensor_layout": tensor_layout, "is_causal": is_causal, "sm_scale": sm_scale,
                  "return_lse": return_lse}
        name = f"sm{arch[0]}{arch[1]}"
        if name == "sm80":
            return m.sageattn_qk_int8_pv_fp16_cuda(q, k, v, **common, pv_accum_dtype="fp32")
        if name == "sm86":
            return m.sageattn_qk_int8_pv_fp16_triton(q, k, v, **common)
        if name == "sm89":
            return m.sageattn_qk_int8_pv_fp8_cuda(q, k, v, **common, pv_accum_dtype="fp32+fp16")
        if name == "sm90":
            return m.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, **common, pv_accum_dtype="fp32+fp32")
        if name in {"sm120", "sm121"}:
            return m.sageattn_qk_int8_pv_fp8_cuda(q, k, v, **common, qk_quant_gran="per_warp",
                                                  pv_accum_dtype="fp32+fp16")
        raise ValueError(f"Unsupported CUDA architecture: {name}")

    module.sageattn = sageattn  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_sage", module)
    return seen


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
@pytest.mark.parametrize("arch", [(8, 0), (8, 6), (8, 9), (9, 0), (12, 0), (12, 1)], ids=str)
def test_sage_direct_calls_the_kernel_sageattn_picks_with_its_keywords(monkeypatch: pytest.MonkeyPatch,
                                                                       arch: tuple[int, int], bshd: bool) -> None:
    from attnforge.backends import external

    seen = _sage_module(monkeypatch, arch)
    monkeypatch.setattr(external, "SAGE_DIRECT_VERSIONS", frozenset({pytest.__version__}))
    sage = external.SageAdapter(name="sageattention-2", caps=_caps("sageattention-2"),
                                requirement=Requirement(modules=("fake_sage",), distributions=("pytest",)))
    q, k, v = _qkv(hkv=4, sk=5)
    call = dataclasses.replace(_call(q, k, causal=True, grad=False), compute_capability=arch)
    args = tuple(t.transpose(1, 2) for t in (q, k, v)) if bshd else (q, k, v)
    out = bound_call(sage, call, causal=True, scale=0.3, bshd=bshd)(*args)
    want = sys.modules["fake_sage"].sageattn(*args, tensor_layout="NHD" if bshd else "HND", is_causal=True,
                                             sm_scale=0.3)
    assert [s[0] for s in seen][1] == "public"
    assert seen[0] == seen[2]  # the same kernel function with the same keywords
    torch.testing.assert_close(out, want)


def test_sage_another_version_or_arch_keeps_sageattn(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnforge.backends import external

    sage = external.SageAdapter(name="sageattention-2", caps=_caps("sageattention-2"),
                                requirement=Requirement(modules=("fake_sage",), distributions=("pytest",)))
    q, k, _ = _qkv()
    call = dataclasses.replace(_call(q, k, causal=False, grad=False), compute_capability=(9, 0))
    assert sage.bind(call, scale=None, bshd=False) is None  # pytest's version is not a SageAttention one
    monkeypatch.setattr(external, "SAGE_DIRECT_VERSIONS", frozenset({pytest.__version__}))
    other = dataclasses.replace(call, compute_capability=(7, 5))
    assert sage.bind(other, scale=None, bshd=False) is None


# -- torch.compile and the direct entry -------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch internals imported by dynamo
def test_fullgraph_compile_serves_the_direct_entry_without_a_graph_break(fa3: FlashAttn3Adapter,
                                                                         tmp_path: Any) -> None:
    from attnforge.dispatch import runtime
    from attnforge.records import RecordStore

    previous = runtime.set_dispatcher(runtime.Dispatcher({"flash-attn-3": fa3}, records=RecordStore(tmp_path)))
    try:
        torch._dynamo.reset()
        q, k, v = (t.transpose(1, 2) for t in _qkv())

        def block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return attnforge.attention(q, k, v, causal=True, layout="bshd", backend="flash-attn-3") * 2

        explained = torch._dynamo.explain(block)(q, k, v)
        assert explained.graph_break_count == 0
        out = torch.compile(block, fullgraph=True, backend="aot_eager")(q, k, v)
    finally:
        runtime.set_dispatcher(previous)
    assert SEEN["fwd"] and PUBLIC == []  # the op ran, the public function did not
    ref = reference_attention(*(t.transpose(1, 2) for t in (q, k, v)), causal=True).transpose(1, 2) * 2
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-4)


# -- FA4 replay of the recorded compiled call -------------------------------------------------------------------
class _Aux:
    """Stands in for FA4's ``AuxData``: a static object among the compiled call's arguments."""


class _FakeFa4:
    """``_flash_attn_fwd`` as 4.0.0b36 runs a plain call (interface.py:873 allocates out, 1887-1936 call
    ``compile_cache[key](q, k, v, out, lse, scale, cu_seqlens_q/k, seqused_q/k, page_table, window, sink,
    block_sparse, aux)``), with a compiled function that writes the reference into ``out``."""

    def __init__(self, *, extra_tensor: bool = False, drift: bool = False) -> None:
        self.compile_cache: dict[Any, Any] = {}
        self.calls = 0
        self.kernel_calls = 0
        self.extra_tensor, self.drift = extra_tensor, drift
        self.aux = _Aux()

    def compile(self, causal: bool) -> Any:
        def kernel(*args: Any) -> None:  # causal is compiled in, as in the real kernels
            self.kernel_calls += 1
            q, k, v, out, lse, scale = args[:6]
            ref, ref_lse = reference_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               causal=causal, scale=scale, return_lse=True)
            out.copy_(ref.transpose(1, 2) + (self.kernel_calls if self.drift else 0))
            if lse is not None and lse.dim() == 3:
                lse.copy_(ref_lse)

        return kernel

    def __call__(self, q: Any, k: Any, v: Any, **kw: Any) -> Any:
        self.calls += 1
        wants_lse = any(t.requires_grad for t in (q, k, v))  # interface.py:886-891
        key = (q.dtype, q.shape[-1], kw["causal"], q.stride(), k.stride(), v.stride(), wants_lse)
        if key not in self.compile_cache:
            self.compile_cache[key] = self.compile(kw["causal"])
        out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
        lse = (torch.empty(q.shape[0], q.shape[2], q.shape[1]) if wants_lse  # [B, H, Sq] fp32
               else torch.empty(1) if self.extra_tensor else None)
        self.compile_cache[key](q.detach(), k.detach(), v.detach(), out.detach(), lse, kw["softmax_scale"] or
                                q.shape[-1] ** -0.5, None, None, None, None, None, None, None, None, None, self.aux)
        return out, lse if wants_lse else None, None, None, None


def _bshd(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2).contiguous()


def test_fa4_replays_the_recorded_compiled_call_checked_once() -> None:
    fake = _FakeFa4()
    run = _fa4_direct.bind(fake, scale=None, causal=True, bshd=True)
    q, k, v = (_bshd(t) for t in _qkv())
    run(q, k, v)
    assert (fake.calls, fake.kernel_calls) == (1, 1)  # a binding's first call: _flash_attn_fwd only, no recording
    first = run(q, k, v)
    assert (fake.calls, fake.kernel_calls) == (2, 3)  # the second: _flash_attn_fwd recording, the replay checked once
    q2, k2, v2 = (_bshd(t) for t in _qkv(sq=5, sk=7, d=8, hq=4, hkv=2))
    q2 = q2 * 2
    for _ in range(3):
        out = run(q2, k2, v2)
    assert (fake.calls, fake.kernel_calls) == (2, 6)  # replayed: _flash_attn_fwd not called again
    ref = reference_attention(*(t.transpose(1, 2) for t in (q2, k2, v2)), causal=True).transpose(1, 2)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-4)
    assert not torch.equal(first, out)
    replay = run.replay  # type: ignore[attr-defined]
    assert replay.args[15] is fake.aux  # the static arguments are the recorded objects


def _reference_bwd(q: Any, k: Any, v: Any, out: Any, dout: Any, lse: Any, *, softmax_scale: Any = None,  # noqa: PLR0917 - upstream signature
                   causal: bool = False, **_kw: Any) -> Any:
    """``_flash_attn_bwd`` on ``[B, S, H, D]`` tensors, by float64 autograd of the reference."""
    with torch.enable_grad():
        leaves = [t.detach().double().transpose(1, 2).requires_grad_(True) for t in (q, k, v)]
        ref = reference_attention(*leaves, causal=causal, scale=softmax_scale)
        grads = torch.autograd.grad(ref, leaves, dout.double().transpose(1, 2))
    return tuple(g.transpose(1, 2).to(t.dtype) for g, t in zip(grads, (q, k, v), strict=True))


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
def test_fa4_train_route_replays_the_forward_with_a_fresh_lse_each_call(bshd: bool) -> None:
    """A call that needs a gradient: its second call records the compiled call with the lse the forward returns,
    checks out and lse against _flash_attn_fwd's, and later calls replay it, each with a fresh lse (the backward's
    input), and gradients stay the reference's."""
    fake = _FakeFa4()
    run = _fa4_direct.bind(fake, scale=None, causal=True, bshd=bshd, bwd=_reference_bwd)

    def inputs(**shape: int) -> tuple[torch.Tensor, ...]:
        qkv = _qkv(**shape)
        return tuple((_bshd(t) if bshd else t).requires_grad_(True) for t in qkv)

    for _ in range(2):
        run(*inputs())
    assert (fake.calls, fake.kernel_calls) == (2, 3)  # the first call plain, the second recorded and checked
    replay = run.replayer.replay  # type: ignore[attr-defined]
    assert replay is not None and replay.lse_slot == 4 and replay.args[4] is None
    lses = []
    for _ in range(2):
        q, k, v = inputs(sq=5, sk=7, d=8, hq=4, hkv=2)
        out = run(q, k, v)
        node = out.grad_fn if bshd else out.grad_fn.next_functions[0][0]  # bhsd: the output is a transposed view
        lses.append(node.saved_tensors[4])
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert (fake.calls, fake.kernel_calls) == (2, 5)  # replayed: _flash_attn_fwd not called again
    assert lses[0].data_ptr() != lses[1].data_ptr()  # a fresh lse per call, both alive
    as_bhsd = (lambda t: t.transpose(1, 2)) if bshd else (lambda t: t)
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    want, want_lse = reference_attention(*(as_bhsd(t) for t in leaves), causal=True, return_lse=True)
    torch.testing.assert_close(lses[1].double(), want_lse.double(), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out.double(), as_bhsd(want), atol=1e-5, rtol=1e-4)
    wants = torch.autograd.grad(as_bhsd(want), leaves, torch.ones_like(out, dtype=torch.float64))
    for g, w in zip((dq, dk, dv), wants, strict=True):
        assert g.shape == w.shape
        torch.testing.assert_close(g.double(), w, atol=1e-5, rtol=1e-4)


def test_fa4_train_replay_is_not_kept_when_its_lse_differs() -> None:
    """The check compares the lse too: a compiled call whose replayed lse would differ is never replayed."""
    fake = _FakeFa4()
    run = _fa4_direct.Replayer(fake, _fa4_direct.forward_keywords(scale=None, causal=False), lse=True)
    q, k, v = (_bshd(t).requires_grad_(True) for t in _qkv())
    original = fake.compile

    def shifted(causal: bool) -> Any:
        kernel = original(causal)

        def run_shifted(*args: Any) -> None:
            kernel(*args)
            if fake.kernel_calls > 1:
                args[4].add_(1.0)  # the replay's lse is off, its out right

        return run_shifted

    fake.compile = shifted  # type: ignore[method-assign]
    out, lse = run(q, k, v)
    assert run.tried and run.replay is None
    want, want_lse = reference_attention(*(t.detach().transpose(1, 2) for t in (q, k, v)), return_lse=True)
    torch.testing.assert_close(lse.double(), want_lse.double(), atol=1e-5, rtol=1e-4)  # _flash_attn_fwd's, served
    torch.testing.assert_close(out.double(), want.transpose(1, 2), atol=1e-5, rtol=1e-4)
    run(q, k, v)
    assert fake.calls == 2


def test_fa4_other_strides_go_through_flash_attn_fwd() -> None:
    fake = _FakeFa4()
    run = _fa4_direct.bind(fake, scale=0.5, causal=False, bshd=False)  # bhsd: views of [B, H, S, D] tensors
    q, k, v = _qkv()
    run(q, k, v)
    wide = torch.zeros(2, 2, 7, 16)
    wide[..., :8] = k  # the same shape, other strides
    out = run(q, wide[..., :8], v)
    assert fake.calls == 2
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, scale=0.5), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("fake", [pytest.param(_FakeFa4(extra_tensor=True), id="per-call-tensor"),
                                  pytest.param(_FakeFa4(drift=True), id="replay-differs")])
def test_fa4_a_call_that_cannot_be_replayed_faithfully_never_is(fake: _FakeFa4) -> None:
    run = _fa4_direct.bind(fake, scale=None, causal=False, bshd=True)
    q, k, v = (_bshd(t) for t in _qkv())
    for _ in range(3):
        run(q, k, v)
    assert fake.calls == 3
    assert run.replay is None  # type: ignore[attr-defined]


def test_fa4_records_nothing_while_a_cuda_graph_captures(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeFa4()
    run = _fa4_direct.bind(fake, scale=None, causal=False, bshd=True)
    q, k, v = (_bshd(t) for t in _qkv())
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # a capture needs CUDA initialized
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    run(q, k, v)
    assert (fake.calls, fake.kernel_calls, run.tried) == (1, 1, False)  # type: ignore[attr-defined]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    run(q, k, v)
    run(q, k, v)
    assert (fake.calls, fake.kernel_calls) == (2, 4)  # recorded and checked after the capture, then replayed
