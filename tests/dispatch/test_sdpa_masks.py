"""The SDPA adapter's prepared masks: one pass over a caller's mask object, not one per layer.

On CUDA the adapter opens the rows of a mask that hide every key (so softmax and its gradient stay finite) and
zeroes those rows of the output; transformers passes one mask object to every layer of a forward, so the pass
is kept for that object. On CPU with torch >= 2.5 SDPA zeroes such rows itself and the adapter skips the pass:
these tests make the adapter take the CUDA path on CPU (``_safe_softmax_on_cpu`` -> False).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnforge.backends import _padded_decode as padded_decode
from attnforge.backends import registry
from attnforge.backends import sdpa as sdpa_module
from attnforge.backends.adapter import AttentionCall
from attnforge.backends.exact import reference_attention
from tests.dispatch._padded_steps import padded_step


@pytest.fixture
def preparations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the adapter's mask preparations, with a fresh cache and the CUDA path taken on CPU."""
    monkeypatch.setattr(sdpa_module, "_safe_softmax_on_cpu", lambda: False)
    monkeypatch.setattr(sdpa_module, "_OPENED", sdpa_module.KeptPerMask())
    count: list[int] = []
    real = sdpa_module.SdpaAdapter._sdpa_mask

    def counting(*args: object, **kwargs: object) -> object:
        count.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sdpa_module.SdpaAdapter, "_sdpa_mask", staticmethod(counting))
    return count


def _qkv(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, 16, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, 24, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, 24, 8, generator=g, dtype=torch.float64)
    return q, k, v


def _padding_mask() -> torch.Tensor:
    """[B, 1, Sq, Sk] bool with left padding on batch 1 and one query row that sees no key."""
    mask = torch.ones(2, 1, 16, 24, dtype=torch.bool)
    mask[1, :, :, :5] = False
    mask[1, :, 3, :] = False
    return mask


def _run(mask: torch.Tensor, *, causal: bool = False, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v = _qkv(seed)
    out = registry.fallback()(q, k, v, causal=causal, scale=None, attn_mask=mask)
    return out, reference_attention(q, k, v, causal=causal, scale=None, attn_mask=mask)


def test_one_mask_object_is_prepared_once_for_every_layer(preparations: list[int]) -> None:
    mask = _padding_mask()
    for layer in range(4):
        out, ref = _run(mask, seed=layer)
        torch.testing.assert_close(out, ref)
        assert torch.equal(out[1, :, 3], torch.zeros_like(out[1, :, 3]))  # the row that sees no key
    assert len(preparations) == 1


def test_an_in_place_change_of_the_mask_is_seen(preparations: list[int]) -> None:
    mask = _padding_mask()
    _run(mask)
    mask[0, :, 7, :] = False  # the version counter moves: the kept preparation is stale
    out, ref = _run(mask)
    torch.testing.assert_close(out, ref)
    assert torch.equal(out[0, :, 7], torch.zeros_like(out[0, :, 7]))
    assert len(preparations) == 2


def test_an_equal_new_mask_or_other_parameters_prepare_again(preparations: list[int]) -> None:
    first = _padding_mask()
    _run(first)
    _run(_padding_mask())  # equal content, another object
    out, ref = _run(first, causal=True)  # the same object, now with causal masking folded in
    torch.testing.assert_close(out, ref)
    assert len(preparations) == 3


def test_a_mask_that_requires_grad_is_never_kept(preparations: list[int]) -> None:
    bias = torch.zeros(2, 1, 16, 24, dtype=torch.float64)
    bias[1, :, :, :5] = float("-inf")
    bias.requires_grad_(True)
    q, k, v = _qkv()
    for _ in range(2):
        out = registry.fallback()(q, k, v, causal=False, scale=None, attn_mask=bias)
        (grad,) = torch.autograd.grad(out.sum(), (bias,))
        assert torch.isfinite(grad).all()
    assert len(preparations) == 2


def test_under_inference_mode_only_a_mask_attnforge_made_is_kept(preparations: list[int]) -> None:
    """Under ``torch.inference_mode`` a mask has no version counter: a caller's is prepared again at every call (an
    in-place change could not be seen), one attnforge's mask builder made and marked (``made_here``: only the model's
    layers read it) once for every layer; the mark goes with the tensor."""
    from attnforge.backends import _base

    with torch.inference_mode():
        theirs = _padding_mask()
        ours = _base.made_here(_padding_mask())
        for mask in (theirs, ours):
            for layer in range(3):
                out, ref = _run(mask, seed=layer)
                torch.testing.assert_close(out, ref)
    assert len(preparations) == 3 + 1
    key = id(ours)
    assert _base._MADE_HERE[key]() is ours
    del ours, mask
    gc.collect()
    assert key not in _base._MADE_HERE


def test_what_was_derived_from_a_mask_goes_with_it(preparations: list[int]) -> None:
    mask = _padding_mask()
    _run(mask)
    assert sdpa_module._OPENED._entries
    del mask
    gc.collect()
    assert not sdpa_module._OPENED._entries


def test_two_masks_alternating_by_layer_are_each_prepared_once(preparations: list[int]) -> None:
    """Gemma-2 passes a sliding-window mask and a full one to alternate layers: both stay prepared."""
    full, sliding = _padding_mask(), _padding_mask()
    sliding[:, :, :, :10] = False
    for layer in range(6):
        out, ref = _run(full if layer % 2 else sliding, seed=layer)
        torch.testing.assert_close(out, ref)
    assert len(preparations) == 2


@pytest.fixture
def got(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """The ``attn_mask`` of every call SDPA receives from the adapter."""
    masks: list[torch.Tensor] = []
    real = sdpa_module.original_sdpa()

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        masks.append(kwargs["attn_mask"])  # type: ignore[arg-type]
        return real(*args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(sdpa_module, "original_sdpa", lambda: spy)
    return masks


def test_sdpa_gets_the_bool_mask_as_an_additive_one_in_the_query_dtype(
        preparations: list[int], got: list[torch.Tensor]) -> None:
    """SDPA turns a bool mask into an additive one on every call; the adapter hands it the additive mask it
    prepared once (0 where a key is seen, -inf where hidden, 0 across a row that sees no key)."""
    mask = _padding_mask()
    _run(mask)
    sent = got[-1]
    assert sent.dtype == torch.float64
    expected = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    expected[1, :, 3, :] = 0.0  # the row that sees no key, opened
    assert torch.equal(sent, expected)


def test_a_call_that_needs_grad_keeps_the_output_graph(preparations: list[int]) -> None:
    """The rows that see no key are zeroed out of place when autograd records the output, and their gradients
    are zeros (finite) while the other rows' match the reference."""
    mask = _padding_mask()
    q, k, v = (t.requires_grad_(True) for t in _qkv(2))
    out = registry.fallback()(q, k, v, causal=False, scale=None, attn_mask=mask)
    ref = reference_attention(q, k, v, causal=False, scale=None, attn_mask=mask)
    torch.testing.assert_close(out, ref)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    for got, want in zip(grads, torch.autograd.grad(ref.sum(), (q, k, v)), strict=True):
        torch.testing.assert_close(got, want)
    assert torch.equal(grads[0][1, :, 3], torch.zeros_like(grads[0][1, :, 3]))


@pytest.mark.parametrize(("sq", "sk"), [(5, 9), (9, 5)], ids=["sq<sk", "sq>sk"])
def test_a_bottom_right_causal_call_hands_sdpa_an_additive_mask_kept_per_shape(
        got: list[torch.Tensor], sq: int, sk: int) -> None:
    """Causal with Sq != Sk needs an explicit bottom-right mask; SDPA gets it additive in q's dtype (it would
    convert a bool mask on every call), made once per (Sq, Sk, dtype, device); rows that see no key are zeros."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, sq, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 4, sk, 8, generator=g, dtype=torch.float64) for _ in range(2))
    for _ in range(2):
        out = registry.fallback()(q, k, v, causal=True, scale=None)
        torch.testing.assert_close(out, reference_attention(q, k, v, causal=True, scale=None))
    assert got[0].dtype == torch.float64 and got[0] is got[1]
    assert torch.isinf(got[0]).sum() == sum(max(0, sk - max(0, i + sk - sq + 1)) for i in range(max(0, sq - sk), sq))


def test_an_additive_mask_with_a_row_that_sees_no_key_gives_zeros_there(preparations: list[int]) -> None:
    mask = torch.zeros(2, 1, 16, 24, dtype=torch.float64).masked_fill(~_padding_mask(), float("-inf"))
    q, k, v = _qkv(4)
    out = registry.fallback()(q, k, v, causal=False, scale=None, attn_mask=mask)
    torch.testing.assert_close(out, reference_attention(q, k, v, causal=False, scale=None, attn_mask=mask))
    assert torch.equal(out[1, :, 3], torch.zeros_like(out[1, :, 3]))


def test_a_new_mask_is_prepared_without_negating_its_rows(preparations: list[int]) -> None:
    """A model pays the preparation once per forward (decode: once per step): any, <, where (on CUDA), and the
    rows that see no key zeroed by multiplying the output with the rows that see some, so no ``~seen`` kernel."""
    from torch.profiler import ProfilerActivity, profile

    q, k, v = _qkv(5)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        registry.fallback()(q, k, v, causal=False, scale=None, attn_mask=_padding_mask())
    ops = [e.name for e in prof.events() if e.name.startswith("aten::")]
    assert "aten::any" in ops and "aten::bitwise_not" not in ops and "aten::logical_not" not in ops, ops


def _prefill() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q ``[2, 4, 32, 8]``, k/v ``[2, 2, 40, 8]`` (more query rows than a decode step) and a ``[B, 1, 32, 40]`` bool
    mask: left padding on batch 1 and a query row (3) that sees no key."""
    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 4, 32, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 40, 8, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.ones(2, 1, 32, 40, dtype=torch.bool)
    mask[1, :, :, :5] = False
    mask[1, :, 3, :] = False
    return q, k, v, mask


@pytest.fixture
def mask_kernels(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[..., tuple[torch.Tensor, ...]]], None]:
    """The seam of :func:`sdpa._zeroing_kernels` opened to the CPU: CPU's math op and a memory-efficient op (the one
    given, :func:`_efficient_kernel` by default) as the kernels that take a mask, the probe's answers cleared."""
    monkeypatch.setattr(sdpa_module, "_MASK_KERNELS", {"cpu": ("EFFICIENT_ATTENTION", "MATH")})
    sdpa_module._zeroing_kernels.cache_clear()

    def install(fn: Callable[..., tuple[torch.Tensor, ...]]) -> None:
        _install_efficient_kernel(monkeypatch, fn)
        sdpa_module._zeroing_kernels.cache_clear()

    install(_efficient_kernel)
    yield install  # type: ignore[misc]
    sdpa_module._zeroing_kernels.cache_clear()


def _plain(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` additive in float64: -inf wherever it hides a key, a row that sees no key included (not opened)."""
    return torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))


def test_rows_that_see_no_key_are_left_to_kernels_that_zero_them(
        preparations: list[int], got: list[torch.Tensor], mask_kernels: object) -> None:
    """With no gradient to keep finite and every kernel that takes a mask returning zeros for a row that sees no
    key, SDPA gets the mask additive with that row -inf at every key (nothing opened, so no pass over the output
    zeroes it), prepared once for every layer; the row is zeros and the others match the reference."""
    q, k, v, mask = _prefill()
    for _ in range(3):
        out = registry.fallback()(q, k, v, causal=False, scale=None, attn_mask=mask)
        torch.testing.assert_close(out, reference_attention(q, k, v, causal=False, scale=None, attn_mask=mask))
        assert torch.equal(out[1, :, 3], torch.zeros_like(out[1, :, 3]))
        assert torch.equal(got[-1], _plain(mask))
    assert len(preparations) == 1
    assert sdpa_module._zeroing_kernels.cache_info().misses == 1  # the kernels asked once


def test_a_call_that_records_grad_leaves_the_rows_to_kernels_whose_gradients_are_right(
        preparations: list[int], got: list[torch.Tensor], mask_kernels: object) -> None:
    """A padded training batch's call (autograd records it) where every kernel that takes a mask returns zeros for a
    row that sees no key and the right gradients with an upstream gradient on every row (the probe's ``grad``): the
    row is left to the kernel too, nothing opened; the output and the gradients of Q, K and V match the
    reference's, the hidden row's query gradient zero."""
    q, k, v, mask = _prefill()
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = registry.fallback()(q, k, v, causal=False, scale=None, attn_mask=mask)
    ref = reference_attention(q, k, v, causal=False, scale=None, attn_mask=mask)
    torch.testing.assert_close(out, ref)
    assert torch.equal(got[-1], _plain(mask))
    upstream = torch.randn_like(out)  # on every row, the hidden ones too
    grads = torch.autograd.grad(out, (q, k, v), upstream)
    for g_out, g_ref in zip(grads, torch.autograd.grad(ref, (q, k, v), upstream), strict=True):
        torch.testing.assert_close(g_out, g_ref)
    assert not grads[0][1, :, 3].any()
    assert sdpa_module._zeroing_kernels(q.device, q.dtype, 8, 8, True) == frozenset({"EFFICIENT_ATTENTION", "MATH"})


def test_the_gradient_probe_answers_under_inference_mode(mask_kernels: object) -> None:
    """``attnforge warmup`` may ask the gradient question inside ``torch.inference_mode``: the probe's own tensors
    record gradients there all the same, and its answer is the one asked outside."""
    with torch.inference_mode():
        inside = sdpa_module._zeroing_kernels(torch.device("cpu"), torch.float64, 8, 8, True)
    sdpa_module._zeroing_kernels.cache_clear()
    assert inside == sdpa_module._zeroing_kernels(torch.device("cpu"), torch.float64, 8, 8, True) == frozenset(
        {"EFFICIENT_ATTENTION", "MATH"})


class _NanGradient(torch.autograd.Function):
    """The identity forward; NaN in the gradient of the rows ``hidden`` marks (a kernel whose softmax gradient is
    not finite on a row that sees no key, as ``exp(-inf - -inf)`` gives)."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(hidden)
        return out.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (hidden,) = ctx.saved_tensors
        return grad.masked_fill(hidden, float("nan")), None


def _nan_gradient_kernel(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    """:func:`_efficient_kernel` whose forward zeroes a row its bias hides everywhere and whose gradient there is
    NaN."""
    out, *rest = _efficient_kernel(*args, **kwargs)
    bias = args[3]
    if bias is not None:
        out = _NanGradient.apply(out, torch.isneginf(bias).all(-1, keepdim=True))
    return (out, *rest)


def test_a_kernel_whose_gradient_is_wrong_keeps_a_recorded_calls_rows_opened(
        preparations: list[int], got: list[torch.Tensor], mask_kernels: Callable[[Any], None]) -> None:
    """A kernel that zeroes the row in the forward but whose gradient there is NaN: calls without a gradient still
    leave the row to the kernels, a call autograd records gets it opened and zeroed, its gradients finite and the
    reference's."""
    mask_kernels(_nan_gradient_kernel)
    q, k, v, mask = _prefill()
    with torch.no_grad():
        registry.fallback()(q, k, v, causal=False, scale=None, attn_mask=mask)
    assert torch.equal(got[-1], _plain(mask))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = registry.fallback()(q, k, v, causal=False, scale=None, attn_mask=mask)
    ref = reference_attention(q, k, v, causal=False, scale=None, attn_mask=mask)
    torch.testing.assert_close(out, ref)
    opened = _plain(mask)
    opened[1, :, 3, :] = 0.0
    assert torch.equal(got[-1], opened)
    upstream = torch.randn_like(out)
    for g_out, g_ref in zip(torch.autograd.grad(out, (q, k, v), upstream),
                            torch.autograd.grad(ref, (q, k, v), upstream), strict=True):
        torch.testing.assert_close(g_out, g_ref)
    assert sdpa_module._zeroing_kernels(q.device, q.dtype, 8, 8, True) == frozenset({"MATH"})


def _nan_rows_kernel(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    """:func:`_efficient_kernel` returning NaN for the rows its bias hides everywhere (torch 2.1-2.4's kernel,
    pytorch/pytorch#110213)."""
    out, *rest = _efficient_kernel(*args, **kwargs)
    bias = args[3]
    if bias is not None:
        out = out.masked_fill(torch.isneginf(bias).all(-1, keepdim=True), float("nan"))
    return (out, *rest)


def _refusing_kernel(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    raise RuntimeError("No available kernel. Aborting execution.")


@pytest.mark.parametrize("kernel", [_nan_rows_kernel, _refusing_kernel], ids=["nan-rows", "refuses"])
def test_a_kernel_not_known_to_zero_the_rows_keeps_them_opened(
        preparations: list[int], got: list[torch.Tensor], mask_kernels: Callable[[Any], None],
        kernel: Callable[..., tuple[torch.Tensor, ...]]) -> None:
    """One kernel that returns NaN there, or that the probe could not run (its answer unknown), and SDPA, which
    may choose it, gets the row opened; the adapter zeroes it."""
    mask_kernels(kernel)
    q, k, v, mask = _prefill()
    out = registry.fallback()(q, k, v, causal=False, scale=None, attn_mask=mask)
    torch.testing.assert_close(out, reference_attention(q, k, v, causal=False, scale=None, attn_mask=mask))
    assert torch.equal(out[1, :, 3], torch.zeros_like(out[1, :, 3]))
    assert not torch.isinf(got[-1][1, :, 3]).any()  # opened
    assert sdpa_module._zeroing_kernels(q.device, q.dtype, 8, 8, False) == frozenset({"MATH"})


def test_the_probe_reaches_the_caller_with_the_devices_state(mask_kernels: Callable[[Any], None]) -> None:
    """Out of memory inside the probe is the device's state, not a refusal: it reaches the caller and leaves no
    answer behind, so the next call asks again."""
    def oom(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    mask_kernels(oom)
    with pytest.raises(torch.OutOfMemoryError):
        sdpa_module._zeroing_kernels(torch.device("cpu"), torch.float64, 8, 8, False)
    mask_kernels(_efficient_kernel)
    assert sdpa_module._zeroing_kernels(torch.device("cpu"), torch.float64, 8, 8, False) == frozenset(
        {"EFFICIENT_ATTENTION", "MATH"})


def _efficient_kernel(  # noqa: PLR0917 (the op's own positional signature)
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                      compute_log_sumexp: bool, dropout_p: float = 0.0, is_causal: bool = False, *,
                      scale: float | None = None) -> tuple[torch.Tensor, ...]:
    """A stand-in for ``aten::_scaled_dot_product_efficient_attention`` (CUDA only) that refuses what the real
    kernel refuses, with its message: no GQA; a bias of exactly ``[B, H, Sq, Sk]``, in q's dtype, its last dimension
    contiguous, its start and every stride of a dimension longer than 1 a multiple of 8 elements (torch 2.11,
    aten/src/ATen/native/transformers/cuda/attention.cu ``_efficient_attention_forward`` and
    mem_eff_attention/kernel_forward.h ``check_supported``; an H200 raised "attn_bias is not correctly aligned
    (strideB)" for a ``[4, 1, 1, 1025]`` mask on 2026-11-28). Then SDPA's math on the same inputs, returned in the
    kernel's output layout."""
    import torch.nn.functional as F  # noqa: N812

    assert q.shape[1] == k.shape[1] == v.shape[1], "the kernel has no GQA"
    if bias is not None:
        b, h, m, n = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        if bias.dim() != 4 or tuple(bias.shape) != (b, h, m, n) or bias.dtype != q.dtype:
            raise RuntimeError(f"attn_bias must be [{b}, {h}, {m}, {n}] in {q.dtype}, got {tuple(bias.shape)}")
        if bias.stride(-1) != 1:
            raise RuntimeError("attn_bias is not last-dim contiguous")
        if bias.storage_offset() % 8:
            raise RuntimeError("attn_bias is not correctly aligned (pointer)")
        for name, size, stride in zip("BHM", bias.shape[:3], bias.stride()[:3], strict=True):
            if size > 1 and stride % 8:
                raise RuntimeError(f"attn_bias is not correctly aligned (stride{name})")
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, is_causal=is_causal,
                                         scale=scale)
    # in the kernel's memory layout: it writes [B, Sq, H, Dv] and returns that transposed to [B, H, Sq, Dv]
    return out.transpose(1, 2).contiguous().transpose(1, 2), torch.empty(0), torch.empty(0), torch.empty(0)


def _install_efficient_kernel(monkeypatch: pytest.MonkeyPatch, fn: Callable[..., tuple[torch.Tensor, ...]]) -> None:
    """``fn`` as the memory-efficient op (``torch._scaled_dot_product_efficient_attention``, the binding the adapter
    calls) while a test runs, the decode path's kernel seam opened to the CPU, this process's refusals cleared."""
    monkeypatch.setattr(torch, "_scaled_dot_product_efficient_attention", fn)
    monkeypatch.setattr(sdpa_module, "_EFFICIENT_DEVICES", frozenset({"cuda", "cpu"}))
    monkeypatch.setattr(sdpa_module, "_REFUSED", {})


@pytest.fixture
def efficient_kernel(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The decode path's kernel seam on CPU: :func:`_efficient_kernel` as the op, this process's refusals
    cleared; returns the bias shapes it was called with (``()``: no bias)."""
    calls: list[tuple[int, ...]] = []

    def kernel(*args: object, **kwargs: object) -> tuple[torch.Tensor, ...]:
        calls.append(() if args[3] is None else tuple(args[3].shape))  # type: ignore[attr-defined]
        return _efficient_kernel(*args, **kwargs)  # type: ignore[arg-type]

    _install_efficient_kernel(monkeypatch, kernel)
    return calls


@pytest.mark.parametrize("sq", [1, 3])
@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("mask_shape", ["b1qk", "b11k", "bh1k", "bhqk", "11qk", "qk", "1k"])
@pytest.mark.parametrize("additive", [False, True], ids=["bool", "additive"])
@pytest.mark.parametrize("sk", [19, 24])
@pytest.mark.parametrize("kv_layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("b", [1, 2])
def test_a_masked_decode_call_without_cudnn_equals_sdpa_with_enable_gqa(  # noqa: PLR0917
        sq: int, groups: int, mask_shape: str, additive: bool, sk: int, kv_layout: str, b: int,
        efficient_kernel: list[tuple[int, ...]]) -> None:
    """The decode path that leaves cuDNN out (each batch row and K/V head one kernel batch entry holding its query
    heads' rows, or, where K/V's batch and head strides do not merge (``bshd`` memory), the query heads folded into
    their K/V head's rows; the mask's rows repeated to match) returns what SDPA returns for the unfolded call, for
    every mask shape that broadcasts to ``[B, Hq, Sq, Sk]``; a bool or additive mask reaches the memory-efficient
    kernel in the form it takes, aligned or not (``Sk`` 24 and 19), and the kernel refuses none."""
    import torch.nn.functional as F  # noqa: N812

    g = torch.Generator().manual_seed(sq * 10 + groups)
    hkv, d = 2, 8  # batch 1 with a mask per head: every (batch row, K/V head) entry has its own bias rows
    hq = hkv * groups
    q = torch.randn(b, hq, sq, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, hkv, sk, d, generator=g, dtype=torch.float64) for _ in range(2))
    if kv_layout == "bshd":  # [B, Sk, Hkv, D] memory seen as bhsd: batch stride != Hkv x head stride
        k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))
    dims = {"b": b, "h": hq, "q": sq, "k": sk, "1": 1}
    shape = [dims[c] for c in mask_shape]
    mask = torch.rand(*shape, generator=g) > 0.3
    mask[..., -1] = True  # every row sees a key (the adapter's own pass handles rows that see none)
    if additive:
        mask = torch.zeros(shape, dtype=q.dtype).masked_fill_(~mask, float("-inf"))
    kwargs = {"attn_mask": mask, "dropout_p": 0.0, "scale": None}
    if groups > 1:
        kwargs["enable_gqa"] = True
    want = F.scaled_dot_product_attention(q, k, v, **kwargs)
    got = sdpa_module._decode_without_cudnn(F.scaled_dot_product_attention, q, k, v, dict(kwargs))
    assert got.shape == want.shape
    torch.testing.assert_close(got, want)
    assert sdpa_module._REFUSED == {}
    # bool or additive, the kernel serves it: one entry per (batch row, K/V head), or the heads folded into rows
    batch_folded = kv_layout == "bhsd" or b == 1  # one batch row: its K/V heads merge with it whatever their stride
    assert efficient_kernel == [(b * hkv, 1, groups * sq, sk) if batch_folded else (b, hkv, groups * sq, sk)]


@pytest.mark.parametrize("kv_layout", ["bhsd", "static-cache-slice", "bshd"])
def test_a_decode_call_hands_the_kernel_views_and_returns_its_output_uncopied(kv_layout: str,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama-3-8B's decode call as transformers makes it (``q`` a bhsd view of bshd memory; K/V a cache's bhsd
    tensors, or a static cache's slice): the kernel gets q, K and V as views of their storage (each (batch row, K/V
    head) one kernel batch entry) and attention()'s output is the kernel's own output, with no copy kernel. K/V whose
    batch and head dimensions do not merge (bshd memory) go to the heads-folded form, whose output is copied."""
    seen: list[tuple[torch.Tensor, ...]] = []

    def kernel(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        out = _efficient_kernel(*args, **kwargs)
        seen.append((*args[:3], out[0]))
        return out

    _install_efficient_kernel(monkeypatch, kernel)
    g = torch.Generator().manual_seed(11)
    b, hq, hkv, sk, d = 4, 32, 8, 40, 16
    q = torch.randn(b, 1, hq, d, generator=g, dtype=torch.float64).transpose(1, 2)
    if kv_layout == "bhsd":
        k, v = (torch.randn(b, hkv, sk, d, generator=g, dtype=torch.float64) for _ in range(2))
    elif kv_layout == "static-cache-slice":
        k, v = (torch.randn(b, hkv, 64, d, generator=g, dtype=torch.float64)[:, :, :sk] for _ in range(2))
    else:
        k, v = (torch.randn(b, sk, hkv, d, generator=g, dtype=torch.float64).transpose(1, 2) for _ in range(2))
    mask = torch.ones(b, 1, 1, sk, dtype=torch.bool)
    mask[1, ..., : sk // 5] = False
    got = sdpa_module._efficient_decode(q, k, v, mask, seen=None, scale=None)
    assert got is not None
    torch.testing.assert_close(got, reference_attention(q, k, v, causal=False, attn_mask=mask))
    (kq, kk, kv, kout), = seen
    for handed, ours in ((kq, q), (kk, k), (kv, v)):
        assert handed.untyped_storage().data_ptr() == ours.untyped_storage().data_ptr()  # a view, not a copy
    if kv_layout == "bshd":
        assert tuple(kk.shape) == (b, hkv, sk, d) and got.data_ptr() != kout.data_ptr()
    else:
        assert tuple(kk.shape) == (b * hkv, 1, sk, d) and got.data_ptr() == kout.data_ptr()


@pytest.mark.parametrize("shape", [(4, 1, 1, 1), (1,), ()], ids=["b111", "1", "scalar"])
def test_a_mask_that_broadcasts_over_the_keys_reaches_the_kernel_at_full_length(
        shape: tuple[int, ...], efficient_kernel: list[tuple[int, ...]], caplog: pytest.LogCaptureFixture) -> None:
    """A mask whose last dimension is 1 (it broadcasts over the keys; attention() accepts it) becomes a bias over
    all ``Sk`` keys, as the kernel wants ("bias.size(-1) != n_keys" otherwise): no refusal, which would turn the
    kernel off for every later call of its kind, and the reference's output."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(4, 8, 1, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(4, 2, 19, 8, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.ones(shape, dtype=torch.bool)
    got = sdpa_module._efficient_decode(q, k, v, mask, seen=None, scale=None)
    assert got is not None
    torch.testing.assert_close(got, reference_attention(q, k, v, causal=False, attn_mask=mask))
    assert efficient_kernel == [(8, 1, 4, 19)] and sdpa_module._REFUSED == {} and "refused" not in caplog.text


def test_a_padded_decode_mask_reaches_the_kernel_in_a_form_it_takes(efficient_kernel: list[tuple[int, ...]],
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """As a model's decode step reaches the kernel on CUDA (``q [4, 32, 1, D]``, ``k/v [4, 8, Sk, D]``, a bool
    padding mask ``[4, 1, 1, Sk]`` prepared by the adapter), at lengths the kernel's stride rule cuts differently:
    every call reaches the kernel, none is refused, and the output is the float64 reference's."""
    monkeypatch.setattr(sdpa_module, "_safe_softmax_on_cpu", lambda: False)  # the adapter's CUDA preparation
    g = torch.Generator().manual_seed(3)
    lengths = (1025, 1026, 1032, 1041)
    for sk in lengths:
        q = torch.randn(4, 32, 1, 16, generator=g, dtype=torch.float64)
        k, v = (torch.randn(4, 8, sk, 16, generator=g, dtype=torch.float64) for _ in range(2))
        mask = torch.ones(4, 1, 1, sk, dtype=torch.bool)
        mask[1, ..., : sk // 5] = False
        prepared, _ = sdpa_module.SdpaAdapter._sdpa_mask(mask, q, sq=1, sk=sk, causal=False, top_left=False,
                                                         window=None)
        got = sdpa_module._decode_without_cudnn(torch.nn.functional.scaled_dot_product_attention, q, k, v,
                                                {"attn_mask": prepared, "enable_gqa": True})
        torch.testing.assert_close(got, reference_attention(q, k, v, causal=False, attn_mask=mask))
    assert efficient_kernel == [(32, 1, 4, sk) for sk in lengths]
    assert sdpa_module._REFUSED == {} and "refused" not in caplog.text


@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("sq", [1, 3])
def test_an_unmasked_decode_call_without_cudnn_equals_sdpa(groups: int, sq: int,
                                                           efficient_kernel: list[tuple[int, ...]]) -> None:
    """A decode step with no mask (a batch without padding; cuDNN builds a graph per new length for it too, 36-39 ms
    on an H200, 2026-11-28) goes to the memory-efficient kernel with no bias, the query heads folded, and returns
    what SDPA returns."""
    import torch.nn.functional as F  # noqa: N812

    g = torch.Generator().manual_seed(groups + sq)
    q = torch.randn(2, 2 * groups, sq, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 1025, 8, generator=g, dtype=torch.float64) for _ in range(2))
    kwargs = {"scale": 0.3, **({"enable_gqa": True} if groups > 1 else {})}
    got = sdpa_module._decode_without_cudnn(F.scaled_dot_product_attention, q, k, v, dict(kwargs))
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, **kwargs))
    assert efficient_kernel == [()]  # called, with no bias (the seam records its shape as ())
    assert sdpa_module._REFUSED == {}


def _decode_call(device: str, sq: int, sk: int = 1025, causal: bool = False) -> AttentionCall:
    """Llama-3-8B's decode call's properties (``Hq 32, Hkv 8, D 128``, bf16) on ``device``."""
    return AttentionCall(device_type=device, compute_capability=(9, 0) if device == "cuda" else None,
                         dtype="bfloat16", batch=4, heads_q=32, heads_kv=8, seqlen_q=sq, seqlen_k=sk, head_dim=128,
                         causal=causal, needs_grad=False)


def test_a_decode_class_on_cuda_binds_the_decode_route_not_plain_sdpa() -> None:
    """A route's plain call is SDPA itself (no adapter code per call), except an unmasked decode step on CUDA, which
    binds the decode route (:class:`_DecodeBound`: the adapter's decode path until the shape settles; SDPA would
    build a cuDNN graph at every new length); a causal decode step with Sq == Sk is SDPA's own top-left causal."""
    adapter = registry.fallback()

    assert isinstance(adapter.bind(_decode_call("cuda", 1), scale=None, bshd=False), sdpa_module._DecodeBound)
    assert isinstance(adapter.bind(_decode_call("cuda", 16), scale=None, bshd=False), sdpa_module._DecodeBound)
    assert not isinstance(adapter.bind(_decode_call("cuda", 17), scale=None, bshd=False), sdpa_module._DecodeBound)
    assert not isinstance(adapter.bind(_decode_call("cpu", 1), scale=None, bshd=False), sdpa_module._DecodeBound)
    causal = adapter.bind(_decode_call("cuda", 4, sk=4, causal=True), scale=None, bshd=False)
    assert getattr(causal, "keywords", None) == {"scale": None, "is_causal": True, "enable_gqa": True}
    # bottom-right causal with one query row hides no key: the decode route, as without causal
    assert isinstance(adapter.bind(_decode_call("cuda", 1, causal=True), scale=None, bshd=False),
                      sdpa_module._DecodeBound)
    assert adapter.bind(_decode_call("cuda", 4, causal=True), scale=None, bshd=False) is None  # a masked decode step
    assert adapter.bind(_decode_call("cuda", 1100, causal=True), scale=None, bshd=False) is None  # rows see no key


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
@pytest.mark.parametrize(("sq", "sk"), [(1, 24), (17, 40), (24, 24)], ids=["decode", "chunk", "square"])
def test_a_bottom_right_causal_route_is_bound_without_the_adapter_and_matches_the_reference(
        bshd: bool, sq: int, sk: int) -> None:
    """Bottom-right causal calls that need no per-call decision bind straight to SDPA: one query row at the end of
    the keys (FlashAttention's callers pass ``causal=True`` on decode steps too) as the call without causal; a
    chunked prefill (``DECODE_ROWS < Sq < Sk``) on the kept bottom-right mask; Sq == Sk as SDPA's ``is_causal``.
    Nothing of the adapter runs per call (its ``__call__`` is never reached), and each answer is the float64
    reference's, GQA and both layouts."""
    adapter = registry.fallback()
    call = AttentionCall(device_type="cpu", compute_capability=None, dtype="float64", batch=2, heads_q=4, heads_kv=2,
                         seqlen_q=sq, seqlen_k=sk, head_dim=8, causal=True, needs_grad=False)
    bound = adapter.bind(call, scale=0.5, bshd=bshd)
    assert bound is not None
    g = torch.Generator().manual_seed(sq)
    q = torch.randn(2, 4, sq, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, sk, 8, generator=g, dtype=torch.float64) for _ in range(2))
    want = reference_attention(q, k, v, causal=True, scale=0.5)

    def refused(*_a: object, **_k: object) -> None:
        raise AssertionError("the adapter's __call__ ran for a bound route")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sdpa_module.SdpaAdapter, "__call__", refused)
        if bshd:
            got = bound(*(t.transpose(1, 2).contiguous() for t in (q, k, v))).transpose(1, 2)
        else:
            got = bound(q, k, v)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
def test_the_bound_decode_route_serves_the_decode_path_until_settled_then_sdpa(
        bshd: bool, efficient_kernel: list[tuple[int, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound decode route (``q [2, 4, 1, 8]``, K/V ``[2, 2, 24, 8]``, GQA) takes the adapter's decode path while
    the shape is met fewer than SETTLED times, then SDPA itself with the route's keywords, counting no more, with the
    reference's answers throughout; a call of other strides goes back through the adapter, and a settled shape the
    in-situ check settled (``settle_repeated``) goes to SDPA from the next call. On ``[B, S, H, D]`` tensors
    (``bshd``) the same route runs on their bhsd views and returns a bshd view."""
    monkeypatch.setattr(sdpa_module, "_MET", sdpa_module._MetShapes())
    monkeypatch.setattr(sdpa_module._MetShapes, "SETTLED", 3)
    decoded = _count_decode_path(monkeypatch)
    adapter = registry.fallback()
    call = AttentionCall(device_type="cpu", compute_capability=None, dtype="float64", batch=2, heads_q=4, heads_kv=2,
                         seqlen_q=1, seqlen_k=24, head_dim=8, causal=False, needs_grad=False)
    bound = adapter.bind(call, scale=0.5, bshd=bshd)
    assert isinstance(bound, sdpa_module._DecodeBound) != bshd
    q, k, v = _qkv()
    want = reference_attention(q[:, :, :1], k, v, causal=False, scale=0.5)
    if bshd:  # the caller's tensors [B, S, H, D], contiguous there; the answers compared in [B, H, S, D]
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        step = q[:, :1]
        to_bhsd = lambda t: t.transpose(1, 2)  # noqa: E731
        caller = lambda t: t.transpose(1, 2)  # noqa: E731 - what settle_repeated gets: the route's bhsd views
    else:
        step = q[:, :, :1]
        to_bhsd = caller = lambda t: t
    for _ in range(6):
        torch.testing.assert_close(to_bhsd(bound(step, k, v)), want)
    assert decoded == [1, 1, 1]  # three meetings on the decode path, then SDPA's own choice
    assert sorted(sdpa_module._MET._seen.values()) == [3]  # the settled calls were not counted
    other = step.clone()  # contiguous: other strides than the slice of q
    torch.testing.assert_close(to_bhsd(bound(other, k, v)), want)
    assert decoded == [1, 1, 1, 1]  # not the settled strides: the adapter's path, counted
    assert adapter.settle_repeated(caller(other), caller(k), caller(v), causal=False)
    torch.testing.assert_close(to_bhsd(bound(other, k, v)), want)  # the adapter serves it settled; the route keeps it
    torch.testing.assert_close(to_bhsd(bound(other, k, v)), want)
    assert decoded == [1, 1, 1, 1]


@pytest.mark.parametrize("mask_shape", ["b1qk", "bhqk", "qk", "bh1k"])
@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("grad", [False, True])
def test_rows_that_see_no_key_are_zeros_on_the_decode_path(mask_shape: str, groups: int, grad: bool,
                                                          efficient_kernel: list[tuple[int, ...]],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode call whose mask hides every key of some rows: the adapter opens those rows for the kernel and the
    decode path zeroes them in the copy back to ``[B, Hq, Sq, D]`` (folded query) or in place, as the float64
    reference does, for each shape of the rows-that-see-a-key tensor, with and without a gradient recorded."""
    monkeypatch.setattr(sdpa_module, "_safe_softmax_on_cpu", lambda: False)  # the adapter's CUDA preparation
    g = torch.Generator().manual_seed(groups)
    b, hkv, sq, sk, d = 2, 2, 3, 21, 8
    hq = hkv * groups
    q = torch.randn(b, hq, sq, d, generator=g, dtype=torch.float64, requires_grad=grad)
    k, v = (torch.randn(b, hkv, sk, d, generator=g, dtype=torch.float64) for _ in range(2))
    dims = {"b": b, "h": hq, "q": sq, "k": sk, "1": 1}
    mask = torch.rand(*[dims[c] for c in mask_shape], generator=g) > 0.4
    mask[..., -1] = True
    mask[..., 0, :] = False  # the first row (of every head, batch) sees no key
    prepared, seen = sdpa_module.SdpaAdapter._sdpa_mask(mask, q, sq=sq, sk=sk, causal=False, top_left=False,
                                                        window=None)
    assert seen is not None
    kwargs = {"attn_mask": prepared, **({"enable_gqa": True} if groups > 1 else {})}
    got = sdpa_module._decode_without_cudnn(torch.nn.functional.scaled_dot_product_attention, q, k, v, kwargs,
                                            seen=seen)
    want = reference_attention(q, k, v, causal=False, attn_mask=mask)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want)
    assert (got[:, :, 0] == 0).all()
    if grad:
        got.sum().backward()
        assert q.grad is not None and torch.isfinite(q.grad).all()
    assert efficient_kernel and sdpa_module._REFUSED == {}


def test_explain_says_how_sdpa_serves_a_decode_step_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """``explain()`` notes that SDPA serves a decode step on CUDA without cuDNN until its shape settles: the note
    comes from the chosen adapter (on CUDA only: a CPU call, a longer query, a forced kernel or SDPA's own causal
    get none), and the dispatcher shows it."""
    import attnforge
    sdpa = registry.fallback()
    (note,) = sdpa.serving_notes(_decode_call("cuda", 1))
    assert "memory-efficient" in note and str(sdpa_module._MetShapes.SETTLED) in note
    assert sdpa.serving_notes(_decode_call("cuda", 16, causal=True)) == sdpa.serving_notes(_decode_call("cuda", 1))
    assert sdpa.serving_notes(_decode_call("cuda", 16, sk=16, causal=True)) == ()  # SDPA's own top-left causal
    assert sdpa.serving_notes(_decode_call("cuda", 17)) == sdpa.serving_notes(_decode_call("cpu", 1)) == ()
    assert registry.adapters()["sdpa-cudnn"].serving_notes(_decode_call("cuda", 1)) == ()  # a forced kernel

    q, k, v = _qkv()
    assert not attnforge.explain(q[:, :, :1], k, v).notes  # CPU: SDPA as it is
    monkeypatch.setattr(sdpa_module.SdpaAdapter, "serving_notes", lambda self, c: ("served so",))
    exp = attnforge.explain(q[:, :, :1], k, v)
    assert exp.chosen == "sdpa" and exp.notes == ("served so",) and "note: served so" in str(exp)


def test_a_refusal_turns_the_kernel_path_off_once_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """An input the memory-efficient kernel refuses still gets SDPA's answer, and the refusal is logged once and
    turns the path off: a C++ exception per call cost ~350 µs on an H200 (2026-11-28)."""
    import torch.nn.functional as F  # noqa: N812

    tries: list[int] = []

    def refusing(*args: object, **kwargs: object) -> tuple[torch.Tensor, ...]:
        tries.append(1)
        raise RuntimeError("attn_bias is not correctly aligned (strideB). attn_bias.stride(0) = 1025\nmore")

    _install_efficient_kernel(monkeypatch, refusing)
    q, k, v = _qkv()
    mask = torch.zeros(2, 1, 1, 24, dtype=q.dtype)
    mask[0, ..., :3] = float("-inf")
    for _ in range(3):
        got = sdpa_module._decode_without_cudnn(F.scaled_dot_product_attention, q[:, :, :1], k, v,
                                                {"attn_mask": mask, "enable_gqa": True})
        torch.testing.assert_close(got, F.scaled_dot_product_attention(q[:, :, :1], k, v, attn_mask=mask,
                                                                       enable_gqa=True))
    assert len(tries) == 1
    assert caplog.text.count("refused a decode call") == 1 and "strideB" in caplog.text
    assert list(sdpa_module._REFUSED.values()) == [
        "attn_bias is not correctly aligned (strideB). attn_bias.stride(0) = 1025"]


@pytest.mark.parametrize("shape", [(4, 1, 1, 1025), (1025,), (1, 1025), (4, 8, 1, 17), (2, 1, 3, 7), (3, 1, 8, 16)])
@pytest.mark.parametrize("offset", [0, 3])
def test_the_efficient_bias_is_the_mask_in_the_kernels_form(shape: tuple[int, ...], offset: int) -> None:
    """The mask for the memory-efficient kernel: the same values broadcast to ``[B, H, Sq, Sk]``, in the form
    the kernel takes (checked by the stand-in's rules), a copy only where the mask is not aligned already."""
    n = 1
    for x in shape:
        n *= x
    storage = torch.randn(n + offset, dtype=torch.float32)
    mask = storage[offset:].view(shape)
    full = (1,) * (4 - len(shape)) + shape
    b, h, sq, sk = (full[0] if full[0] > 1 else 4), (full[1] if full[1] > 1 else 8), full[2], full[3]
    q = torch.zeros(b, h, sq, 8)
    k = torch.zeros(b, h, sk, 8)
    bias = sdpa_module._efficient_bias(mask, q, k)
    assert tuple(bias.shape) == (b, h, sq, sk)
    torch.testing.assert_close(bias, mask.expand(b, h, sq, sk), rtol=0, atol=0)
    _efficient_kernel(q, k, k, bias, False)  # raises where the real kernel would
    copied = bias.untyped_storage().data_ptr() != storage.untyped_storage().data_ptr()
    unaligned = any(st % 8 for n, st in zip(mask.shape[:-1], mask.stride()[:-1], strict=True) if n > 1)
    assert copied == (offset != 0 or unaligned)


def test_the_decode_path_switches_no_global_sdpa_flag() -> None:
    """The decode path leaves SDPA's global kernel flags alone (another thread's SDPA call would see them, and two
    threads restoring them in turn could leave cuDNN off for good): it calls the memory-efficient kernel itself on
    CUDA; here, on CPU, SDPA chooses, and an error reaches the caller."""
    q, k, v = _qkv()
    before = [torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled(),
              torch.backends.cuda.mem_efficient_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()]

    def failing(*args: object, **kwargs: object) -> torch.Tensor:
        assert [torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled(),
                torch.backends.cuda.mem_efficient_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()] == before
        raise RuntimeError("kernel failed")

    with pytest.raises(RuntimeError, match="kernel failed"):
        sdpa_module._decode_without_cudnn(failing, q[:, :, :1], k, v,
                                          {"attn_mask": torch.ones(2, 1, 1, 24, dtype=torch.bool),
                                           "enable_gqa": True})


def test_a_decode_shape_settles_after_more_meetings_than_a_step_has_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A masked decode shape goes without cuDNN until it has been met SETTLED times (a model meets one step's shape
    once per layer, so the layers after the first must not settle it); then SDPA's own choice. Another stride, dtype
    or length counts apart; the oldest shapes are forgotten past KEPT and start again."""
    monkeypatch.setattr(sdpa_module._MetShapes, "KEPT", 3)
    monkeypatch.setattr(sdpa_module._MetShapes, "SETTLED", 4)
    met = sdpa_module._MetShapes()
    q, k, v = _qkv()
    mask = torch.ones(2, 1, 16, 24, dtype=torch.bool)
    assert [met.unsettled(q.clone(), k.clone(), v.clone(), mask.clone()) for _ in range(6)] == [True] * 4 + [False] * 2
    assert met.unsettled(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, mask)  # bshd strides
    assert met.unsettled(q.float(), k.float(), v.float(), mask)
    assert met.unsettled(q, k[:, :, :20], v[:, :, :20], mask[..., :20])  # another length
    assert met.unsettled(q, k, v, mask)  # forgotten: three newer shapes since, so counted from 1 again


def test_hides_keys_says_whether_the_mask_hides_any_key() -> None:
    """From the shapes alone, whether causal and window hide a key from any of the rows: exactly when the mask built
    key by key has a False (so a call that hides none gets no mask at all), over every small case."""
    import itertools

    from attnforge.backends.exact import hides_keys, visible_bounds

    sides = (None, -1, 0, 1, 2, 5)
    for sq, sk, causal, top_left, left0, right0 in itertools.product(range(6), range(7), (False, True),
                                                                    (False, True), sides, sides):
        window = None if left0 is None and right0 is None else (left0, right0)
        left, right = visible_bounds(causal=causal, window=window)
        offset = 0 if top_left else sk - sq
        for start, stop in {(0, sq), (min(1, sq), sq), (0, min(1, sq))}:
            hidden = any(not ((right is None or j <= i + offset + right) and (left is None or j >= i + offset - left))
                         for i in range(start, stop) for j in range(sk))
            got = hides_keys(sq, sk, causal=causal, top_left=top_left, window=window, rows=(start, stop))
            assert got == hidden, (sq, sk, causal, top_left, window, start, stop)


def test_a_causal_decode_step_hands_sdpa_no_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bottom-right causal with one query row sees every key: the SDPA adapter passes no mask (with one, SDPA picks
    cuDNN on an H100/H200, which builds a graph per sequence length), with and without features."""
    import torch.nn.functional as F  # noqa: N812

    got: list[dict[str, object]] = []

    def spy(*args: torch.Tensor, **kwargs: object) -> torch.Tensor:
        got.append(kwargs)
        return F.scaled_dot_product_attention(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sdpa_module, "original_sdpa", lambda: spy)
    adapter = registry.fallback()
    q, k, v = _qkv()
    step = q[:, :, -1:]
    plain = adapter(step, k, v, causal=True, scale=None)
    featured = adapter(step, k, v, causal=True, scale=None, window=(30, None))  # a window wider than the keys
    assert [kw.get("attn_mask") for kw in got] == [None, None] and not any(kw.get("is_causal") for kw in got)
    want = reference_attention(step, k, v, causal=True)
    torch.testing.assert_close(plain, want.to(plain.dtype))
    torch.testing.assert_close(featured, want.to(featured.dtype))


def _decode_case(data: st.DataObject, *, sq: int, groups: int, sk: int, dims: tuple[bool, bool, bool],
                 d: int) -> tuple[torch.Generator, torch.Tensor, torch.Tensor, torch.Tensor, tuple[int, ...],
                                  torch.Tensor]:
    """A random decode call for the property tests: its generator, float64 ``q [2, 2 * groups, Sq, d]``, ``k/v
    [2, 2, Sk, d]``, a mask shape with the batch, head and row dimensions present or 1 (``dims``), and a bool mask of
    that shape (about 70 % of keys visible)."""
    b, hkv = 2, 2
    hq = hkv * groups
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    q = torch.randn(b, hq, sq, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, hkv, sk, d, generator=g, dtype=torch.float64) for _ in range(2))
    shape = (b if dims[0] else 1, hq if dims[1] else 1, sq if dims[2] else 1, sk)
    return g, q, k, v, shape, torch.rand(shape, generator=g) > 0.3


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sq=st.integers(1, 16), groups=st.sampled_from([1, 2, 4, 7]), sk=st.integers(1, 70),
       dims=st.tuples(st.booleans(), st.booleans(), st.booleans()), layout=st.sampled_from(["contiguous", "slice",
                                                                                              "expand", "offset"]),
       kind=st.sampled_from(["bool", "additive"]), data=st.data())
def test_any_decode_mask_layout_reaches_the_kernel_in_its_form(  # noqa: PLR0917
        sq: int, groups: int, sk: int, dims: tuple[bool, bool, bool], layout: str, kind: str, data: st.DataObject,
        efficient_kernel: list[tuple[int, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Property: a decode call (``Sq <= 16``) with a mask of any broadcastable shape (batch, head, row dimensions
    present or 1) in any layout a caller may hand (contiguous, a slice of a longer mask, an expanded view, a view at a
    storage offset), bool or additive, through the adapter's CUDA mask preparation and the decode path: the stand-in
    kernel (the real one's rules) takes every bias, and the output is the float64 reference's, rows that see no key
    zeros."""
    monkeypatch.setattr(sdpa_module, "_safe_softmax_on_cpu", lambda: False)
    calls_before = len(efficient_kernel)  # the fixture's list lives across hypothesis's examples
    g, q, k, v, shape, allowed = _decode_case(data, sq=sq, groups=groups, sk=sk, dims=dims, d=4)
    if layout == "slice":
        wide = torch.rand((*shape[:-1], sk + 5), generator=g) > 0.3
        wide[..., :sk] = allowed
        allowed = wide[..., :sk]
    elif layout == "expand":
        allowed = allowed[..., :1, :].expand(*shape[:-2], shape[-2], sk) if shape[-2] > 1 else allowed
    elif layout == "offset":
        flat = torch.zeros(allowed.numel() + 3, dtype=torch.bool)
        flat[3:] = allowed.flatten()
        allowed = flat[3:].view(shape)
    mask = allowed if kind == "bool" else torch.zeros(shape, dtype=q.dtype).masked_fill(~allowed, float("-inf"))
    prepared, seen = sdpa_module.SdpaAdapter._sdpa_mask(mask, q, sq=sq, sk=sk, causal=False, top_left=False,
                                                        window=None)
    kwargs = {"attn_mask": prepared, **({"enable_gqa": True} if groups > 1 else {})}
    got = sdpa_module._decode_without_cudnn(torch.nn.functional.scaled_dot_product_attention, q, k, v, kwargs,
                                            seen=seen)
    torch.testing.assert_close(got, reference_attention(q, k, v, causal=False, attn_mask=allowed))
    assert len(efficient_kernel) == calls_before + 1 and sdpa_module._REFUSED == {}


def _flash_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cum_seq_q: object, cum_seq_k: object,  # noqa: PLR0917
                  max_q: int, max_k: int, dropout_p: float, is_causal: bool, return_debug_mask: bool, *,
                  scale: float | None = None, **_: object) -> tuple[torch.Tensor, ...]:
    """A stand-in for ``aten::_flash_attention_forward`` (CUDA only): dense (``[B, S, H, D]`` in and out) or varlen
    (``[total, H, D]``, sequence ``i`` the query rows ``cum_seq_q[i]:cum_seq_q[i + 1]`` over the keys from
    ``cum_seq_k[i]``, ``seqused_k[i]`` of them when given), GQA native. It refuses what the real op refuses, with
    its messages (torch 2.11, aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp ``mha_fwd``,
    ``mha_varlen_fwd``): fp16/bf16 only, the last dimension contiguous, head dims up to 256 in multiples of 8, query
    heads a multiple of the K/V heads. Then SDPA's math on the same inputs, in the op's output layout (contiguous)."""
    import torch.nn.functional as F  # noqa: N812

    assert not is_causal and dropout_p == 0.0
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        raise RuntimeError("Input tensor must have contiguous last dimension")
    if q.shape[-1] % 8 or q.shape[-1] > 256:
        raise RuntimeError("FlashAttention forward only supports head dimension at most 256")
    if q.shape[-2] % k.shape[-2]:
        raise RuntimeError("Number of heads in key/value must divide number of heads in query")
    if cum_seq_q is not None:  # varlen: q [total_q, H, D], k/v [total_k, Hkv, D]
        used = _.get("seqused_k")
        out = torch.zeros_like(q)
        for i in range(len(cum_seq_q) - 1):  # type: ignore[arg-type]
            q0, q1 = int(cum_seq_q[i]), int(cum_seq_q[i + 1])  # type: ignore[index]
            k0 = int(cum_seq_k[i])  # type: ignore[index]
            k1 = k0 + int(used[i]) if used is not None else int(cum_seq_k[i + 1])  # type: ignore[index]
            assert q1 - q0 <= max_q and k1 - k0 <= max_k and k1 <= k.shape[0]
            o = F.scaled_dot_product_attention(q[q0:q1].transpose(0, 1), k[k0:k1].transpose(0, 1),
                                               v[k0:k1].transpose(0, 1), scale=scale, enable_gqa=True)
            out[q0:q1] = o.transpose(0, 1)
        return out, torch.empty(0), torch.empty(0), torch.empty(0), torch.empty(0)
    assert (max_q, max_k) == (q.shape[1], k.shape[1])
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale,
                                         enable_gqa=True)
    return out.transpose(1, 2).contiguous(), torch.empty(0), torch.empty(0), torch.empty(0), torch.empty(0)


@pytest.fixture
def flash_kernel(monkeypatch: pytest.MonkeyPatch, efficient_kernel: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """:func:`_flash_kernel` as FlashAttention-2's op on CPU (beside the memory-efficient stand-in), one
    multiprocessor (so each thread block's walk is the keys times the blocks); returns the K shapes it served."""
    calls: list[tuple[int, ...]] = []

    def kernel(*args: object, **kwargs: object) -> tuple[torch.Tensor, ...]:
        calls.append(tuple(args[1].shape))  # type: ignore[attr-defined]
        return _flash_kernel(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.ops.aten, "_flash_attention_forward", kernel)
    monkeypatch.setattr(sdpa_module, "_FLASH_DEVICES", frozenset({"cuda", "cpu"}))
    monkeypatch.setattr(sdpa_module, "_multiprocessors", lambda device: 1)
    return calls


@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("sq", [1, 3])
@pytest.mark.parametrize("sk", [40, 400])
def test_an_unmasked_decode_call_with_many_keys_a_block_takes_flash_attention_2(  # noqa: PLR0917
        groups: int, sq: int, sk: int, flash_kernel: list[tuple[int, ...]],
        efficient_kernel: list[tuple[int, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    """An unmasked bf16 decode step goes to FlashAttention-2's split-KV op (bshd views, GQA native, no copy of K/V)
    once the memory-efficient kernel's thread blocks would walk ``_FLASH_FROM_KEYS`` keys or more, else to the
    memory-efficient kernel; both return what SDPA returns, ``[B, Hq, Sq, D]``."""
    import torch.nn.functional as F  # noqa: N812

    monkeypatch.setattr(sdpa_module, "_FLASH_FROM_KEYS", 512)
    g = torch.Generator().manual_seed(groups * sq + sk)
    q = torch.randn(2, 2 * groups, sq, 16, generator=g).bfloat16()
    k, v = (torch.randn(2, 2, sk, 16, generator=g).bfloat16() for _ in range(2))
    kwargs = {"scale": 0.3, **({"enable_gqa": True} if groups > 1 else {})}
    got = sdpa_module._decode_without_cudnn(F.scaled_dot_product_attention, q, k, v, dict(kwargs))
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, **kwargs))
    walk = sk * 2 * 2 * -(-groups * sq // 64)  # one multiprocessor: every block is a wave
    assert (flash_kernel, efficient_kernel) == (([(2, sk, 2, 16)], []) if walk >= 512 else ([], [()]))
    assert sdpa_module._REFUSED == {}


def test_a_refused_flash_decode_goes_to_the_memory_efficient_kernel_once_said(
        flash_kernel: list[tuple[int, ...]], efficient_kernel: list[tuple[int, ...]],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """FlashAttention-2's op refusing an unmasked decode call (an older GPU: "FlashAttention only supports Ampere
    GPUs or newer") sends it, and every later call of its kind, to the memory-efficient kernel: one exception,
    logged once, the same answer."""
    import torch.nn.functional as F  # noqa: N812

    tries: list[int] = []

    def refusing(*args: object, **kwargs: object) -> tuple[torch.Tensor, ...]:
        tries.append(1)
        raise RuntimeError("FlashAttention only supports Ampere GPUs or newer.")

    monkeypatch.setattr(torch.ops.aten, "_flash_attention_forward", refusing)
    monkeypatch.setattr(sdpa_module, "_FLASH_FROM_KEYS", 1)
    q, k, v = (t.bfloat16() for t in _qkv())
    for _ in range(3):
        got = sdpa_module._decode_without_cudnn(F.scaled_dot_product_attention, q[:, :, :1], k, v,
                                                {"enable_gqa": True})
        torch.testing.assert_close(got, F.scaled_dot_product_attention(q[:, :, :1], k, v, enable_gqa=True))
    assert len(tries) == 1 and len(efficient_kernel) == 3
    assert caplog.text.count("FlashAttention-2") == 1 and "Ampere" in caplog.text


def test_a_decode_mask_becomes_the_kernels_bias_once_for_all_layers(efficient_kernel: list[tuple[int, ...]],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's layers share one prepared mask: its bias for the memory-efficient kernel is made at the first
    layer's call and handed as it is to the others (one preparation per mask object, not per layer); a new mask (the
    next step) gets its own; a call that records a gradient takes the general path (rows opened, then zeroed)."""
    import torch.nn.functional as F  # noqa: N812

    monkeypatch.setattr(sdpa_module, "_safe_softmax_on_cpu", lambda: False)
    biases: list[torch.Tensor] = []
    made: list[int] = []
    real_bias = sdpa_module._decode_bias

    def spy_bias(mask: torch.Tensor, seen: torch.Tensor | None, **kw: Any) -> torch.Tensor:
        made.append(1)
        out = real_bias(mask, seen, **kw)
        biases.append(out)
        return out

    monkeypatch.setattr(sdpa_module, "_decode_bias", spy_bias)
    g = torch.Generator().manual_seed(5)
    for step, sk in enumerate((33, 34)):
        q = torch.randn(2, 8, 1, 8, generator=g, dtype=torch.float64)
        k, v = (torch.randn(2, 2, sk, 8, generator=g, dtype=torch.float64) for _ in range(2))
        mask = torch.ones(2, 1, 1, sk, dtype=torch.bool)
        mask[1, ..., :5] = False
        mask[0] = False  # a batch row that sees no key: zeros with no multiply (the kernel's, hidden again)
        prepared, seen = sdpa_module.SdpaAdapter._sdpa_mask(mask, q, sq=1, sk=sk, causal=False, top_left=False,
                                                            window=None)
        for _layer in range(3):
            got = sdpa_module._decode_without_cudnn(F.scaled_dot_product_attention, q, k, v,
                                                    {"attn_mask": prepared, "enable_gqa": True}, seen=seen)
            torch.testing.assert_close(got, reference_attention(q, k, v, causal=False, attn_mask=mask))
            assert (got[0] == 0).all()
        assert len(made) == step + 1
    assert biases[0].untyped_storage().data_ptr() != biases[1].untyped_storage().data_ptr()
    qg = q.clone().requires_grad_()
    got = sdpa_module._decode_without_cudnn(F.scaled_dot_product_attention, qg, k, v,
                                            {"attn_mask": prepared, "enable_gqa": True}, seen=seen)
    got.sum().backward()
    assert len(made) == 2 and qg.grad is not None and torch.isfinite(qg.grad).all()  # not the lean path's bias


@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("case", ["left", "right", "additive", "finfo-min", "static-cache", "holes", "empty-row",
                                  "other-values", "bshd-kv", "per-head"])
def test_a_padded_decode_step_runs_as_varlen_sequences(groups: int, case: str, flash_kernel: list[tuple[int, ...]],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode step under a padding mask (one run of visible keys per batch row, bool or additive 0/-inf, K/V
    contiguous or a slice of a longer cache) goes to FlashAttention-2's varlen op as one sequence per (batch row,
    K/V head) on views (no copy of K/V); anything else (holes, a row that sees no key, other additive values, bshd
    K/V, a mask per head) to the caller's path: the reference's answer either way, the runs read once per mask
    object over a step's layers."""
    monkeypatch.setattr(sdpa_module, "_safe_softmax_on_cpu", lambda: False)
    reads: list[int] = []
    real_runs = padded_decode.padding_runs

    def spy_runs(*args: object, **kwargs: object) -> tuple[torch.Tensor, ...]:
        reads.append(1)
        return real_runs(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(padded_decode, "padding_runs", spy_runs)
    q, k, v, mask = padded_step(case, groups=groups, sk=37, d=16, dtype=torch.bfloat16, seed=groups)
    monkeypatch.setattr(sdpa_module, "_FLASH_FROM_KEYS", 1)  # every walk long (the fixture: one multiprocessor)
    adapter = registry.fallback()
    want = reference_attention(q, k, v, causal=False, attn_mask=mask)
    for _layer in range(3):
        got = adapter(q, k, v, causal=False, scale=None, attn_mask=mask)
        torch.testing.assert_close(got.double(), want, atol=2e-2, rtol=2e-2)
    varlen = case in ("left", "right", "additive", "finfo-min", "static-cache")
    assert len(flash_kernel) == (3 if varlen else 0)
    assert len(reads) == (0 if case in ("bshd-kv", "per-head") else 1)
    assert sdpa_module._REFUSED == {}


def test_a_padded_decode_step_over_few_keys_a_block_stays_on_the_memory_efficient_kernel(
        flash_kernel: list[tuple[int, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading a mask's runs costs a host sync and small kernels per step: below ``_FLASH_FROM_KEYS`` keys a thread
    block the padded step stays on the memory-efficient kernel (H200: 0.84x the default's decode through varlen at
    1025 keys, 0.92x on this kernel), from it on FlashAttention-2's varlen op."""
    monkeypatch.setattr(sdpa_module, "_safe_softmax_on_cpu", lambda: False)
    monkeypatch.setattr(sdpa_module, "_FLASH_FROM_KEYS", 4 * 2 * 100)  # 4 batch rows x 2 K/V heads, one SM
    q = torch.randn(4, 8, 1, 16).bfloat16()
    adapter = registry.fallback()
    for sk, varlen in ((99, False), (100, True)):
        k, v = (torch.randn(4, 2, sk, 16).bfloat16() for _ in range(2))
        mask = torch.ones(4, 1, 1, sk, dtype=torch.bool)
        mask[1, ..., :7] = False
        got = adapter(q, k, v, causal=False, scale=None, attn_mask=mask)
        want = reference_attention(q, k, v, causal=False, attn_mask=mask)
        torch.testing.assert_close(got.double(), want, atol=2e-2, rtol=2e-2)
        assert len(flash_kernel) == (1 if varlen else 0)  # else the caller's path (SDPA itself on CPU)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sq=st.integers(1, 16), groups=st.sampled_from([1, 2, 4]), sk=st.integers(16, 60),
       dims=st.tuples(st.booleans(), st.booleans(), st.booleans()),
       kind=st.sampled_from(["bool", "additive-q-dtype", "additive-float32"]), empty_row=st.booleans(),
       causal=st.booleans(), data=st.data())
def test_the_adapter_serves_a_decode_step_under_the_callers_mask_as_the_reference(  # noqa: PLR0917
        sq: int, groups: int, sk: int, dims: tuple[bool, bool, bool], kind: str, empty_row: bool, causal: bool,
        data: st.DataObject, efficient_kernel: list[tuple[int, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Property: through the adapter (the CUDA decode path on the CPU stand-in kernel), a decode step with the
    caller's mask (any broadcastable shape; bool, additive in q's dtype or in float32; a row that sees no key or
    not; bottom-right causal on top, which hides keys only when ``Sq > 1``) returns the float64 reference's output,
    rows that see no key zeros, over three layers sharing the mask; the kernel serves every call and refuses none."""
    monkeypatch.setattr(sdpa_module, "_safe_softmax_on_cpu", lambda: False)
    calls_before = len(efficient_kernel)
    _, q, k, v, shape, allowed = _decode_case(data, sq=sq, groups=groups, sk=sk, dims=dims, d=8)
    if empty_row:
        allowed[0] = False
    mask: torch.Tensor = allowed
    if kind != "bool":
        dtype = q.dtype if kind == "additive-q-dtype" else torch.float32
        mask = torch.zeros(shape, dtype=dtype).masked_fill(~allowed, float("-inf"))
    adapter = registry.fallback()
    want = reference_attention(q, k, v, causal=causal, attn_mask=allowed)
    for _layer in range(3):
        got = adapter(q, k, v, causal=causal, scale=None, attn_mask=mask)
        torch.testing.assert_close(got, want)
    assert len(efficient_kernel) == calls_before + 3 and sdpa_module._REFUSED == {}


def _count_decode_path(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that gets one entry per call the decode path without cuDNN serves (:func:`_decode_without_cudnn`)."""
    decoded: list[int] = []
    real = sdpa_module._decode_without_cudnn

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        decoded.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sdpa_module, "_decode_without_cudnn", spy)
    return decoded


def test_a_settled_decode_shape_goes_to_sdpa_without_being_counted_again(
        efficient_kernel: list[tuple[int, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter counts a decode step under the caller's mask once: while its shape is met fewer than SETTLED times
    the kernel serves it, from then on SDPA's own choice (the prepared mask is not counted as another shape, which
    would keep it off cuDNN for as many meetings again), and the answers stay the reference's."""
    monkeypatch.setattr(sdpa_module._MetShapes, "SETTLED", 3)
    monkeypatch.setattr(sdpa_module, "_MET", sdpa_module._MetShapes())
    monkeypatch.setattr(sdpa_module, "_safe_softmax_on_cpu", lambda: False)
    decoded = _count_decode_path(monkeypatch)
    q, k, v = _qkv()
    step = q[:, :, :1]
    adapter = registry.fallback()
    for i in range(6):
        mask = torch.ones(2, 1, 1, 24, dtype=torch.bool)
        mask[1, ..., : i + 1] = False
        got = adapter(step, k, v, causal=False, scale=None, attn_mask=mask)
        torch.testing.assert_close(got, reference_attention(step, k, v, causal=False, attn_mask=mask).to(got.dtype))
    assert len(efficient_kernel) == 3 and decoded == []


def test_decode_inputs_the_lean_kernels_do_not_take_still_get_the_reference(
        flash_kernel: list[tuple[int, ...]], efficient_kernel: list[tuple[int, ...]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Inputs outside the lean kernels' forms go elsewhere without an error and without turning a kernel off: K/V
    expanded over the keys (stride 0: the varlen view's row stride), K with a strided last dimension (FlashAttention-2
    refuses it: checked before the call, so no refusal is remembered for the next, ordinary call), and a decode step
    under ``torch.inference_mode`` (an inference tensor has no version counter for the kept masks)."""
    import torch.nn.functional as F  # noqa: N812

    monkeypatch.setattr(sdpa_module, "_safe_softmax_on_cpu", lambda: False)
    monkeypatch.setattr(sdpa_module, "_FLASH_FROM_KEYS", 1)
    adapter = registry.fallback()
    q = torch.randn(3, 4, 1, 16).bfloat16()
    mask = torch.ones(3, 1, 1, 40, dtype=torch.bool)
    mask[1, ..., :5] = False
    expanded = torch.randn(3, 2, 1, 16).bfloat16().expand(-1, -1, 40, -1)
    got = adapter(q, expanded, expanded, causal=False, scale=None, attn_mask=mask)
    torch.testing.assert_close(got.double(), reference_attention(q, expanded, expanded, causal=False,
                                                                 attn_mask=mask), atol=2e-2, rtol=2e-2)
    strided = torch.randn(3, 2, 16, 40).bfloat16().transpose(-1, -2)
    got = sdpa_module._decode_without_cudnn(F.scaled_dot_product_attention, q, strided, strided,
                                            {"enable_gqa": True})
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, strided, strided, enable_gqa=True))
    k = torch.randn(3, 2, 40, 16).bfloat16()
    sdpa_module._decode_without_cudnn(F.scaled_dot_product_attention, q, k, k, {"enable_gqa": True})
    assert sdpa_module._REFUSED == {} and len(flash_kernel) == 1
    with torch.inference_mode():
        qi, ki, mi = q.clone(), k.clone(), mask.clone()
        for _layer in range(2):
            got = adapter(qi, ki, ki, causal=False, scale=None, attn_mask=mi)
            torch.testing.assert_close(got.double(), reference_attention(qi, ki, ki, causal=False, attn_mask=mi),
                                       atol=2e-2, rtol=2e-2)


def test_out_of_memory_in_a_decode_kernel_reaches_the_caller_and_turns_nothing_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of memory (or a CUDA error) in a decode kernel is the device's state, not a refusal of the inputs: it
    reaches the caller, and the kernel serves the next call."""
    import torch.nn.functional as F  # noqa: N812

    state = {"oom": True}

    def kernel(*args: object, **kwargs: object) -> tuple[torch.Tensor, ...]:
        if state["oom"]:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return _efficient_kernel(*args, **kwargs)  # type: ignore[arg-type]

    _install_efficient_kernel(monkeypatch, kernel)
    q, k, v = _qkv()
    mask = torch.zeros(2, 1, 1, 24, dtype=q.dtype)
    with pytest.raises(torch.OutOfMemoryError):
        sdpa_module._decode_without_cudnn(F.scaled_dot_product_attention, q[:, :, :1], k, v,
                                          {"attn_mask": mask, "enable_gqa": True})
    assert sdpa_module._REFUSED == {}
    state["oom"] = False
    got = sdpa_module._decode_without_cudnn(F.scaled_dot_product_attention, q[:, :, :1], k, v,
                                            {"attn_mask": mask, "enable_gqa": True})
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q[:, :, :1], k, v, attn_mask=mask,
                                                                   enable_gqa=True))


def test_a_decode_call_the_kernel_refuses_is_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode step under the caller's mask is counted once towards settling, also when the lean kernel refuses it
    and the general path serves it (counting it again there would settle it after half the meetings)."""
    def refusing(*args: object, **kwargs: object) -> tuple[torch.Tensor, ...]:
        raise RuntimeError("attn_bias is not correctly aligned (strideB)")

    _install_efficient_kernel(monkeypatch, refusing)
    monkeypatch.setattr(sdpa_module, "_MET", sdpa_module._MetShapes())
    monkeypatch.setattr(sdpa_module, "_safe_softmax_on_cpu", lambda: False)
    q, k, v = _qkv()
    mask = torch.zeros(2, 1, 1, 24, dtype=q.dtype)
    adapter = registry.fallback()
    for _ in range(3):
        got = adapter(q[:, :, :1], k, v, causal=False, scale=None, attn_mask=mask)
        torch.testing.assert_close(got, reference_attention(q[:, :, :1], k, v, causal=False,
                                                            attn_mask=mask).to(got.dtype))
    assert sorted(sdpa_module._MET._seen.values()) == [3]


def test_a_repeated_unmasked_decode_shape_settles_at_once(
        efficient_kernel: list[tuple[int, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Told that an unmasked decode shape repeats (the in-situ check saw only it), the adapter serves it as a settled
    shape from the next call (SDPA's own choice, not the decode path) with the same answers; once only, and never
    for a forced kernel, more than DECODE_ROWS query rows, or another shape."""
    monkeypatch.setattr(sdpa_module, "_MET", sdpa_module._MetShapes())
    decoded = _count_decode_path(monkeypatch)
    q, k, v = _qkv()
    step = q[:, :, :1]
    adapter = registry.fallback()
    want = reference_attention(step, k, v, causal=False)
    torch.testing.assert_close(adapter(step, k, v, causal=False, scale=None), want)
    assert decoded == [1]  # a first meeting: the decode path
    assert adapter.settle_repeated(step, k, v, causal=False) and not adapter.settle_repeated(step, k, v, causal=True)
    for _ in range(3):
        torch.testing.assert_close(adapter(step, k, v, causal=False, scale=None), want)
    assert decoded == [1]  # settled: SDPA's own choice
    adapter(step, k[:, :, :20], v[:, :, :20], causal=False, scale=None)
    assert decoded == [1, 1]  # another length was not settled
    forced = sdpa_module.SdpaAdapter(name="sdpa-math", caps=adapter.caps, requirement=adapter.requirement,
                                     kernel="MATH")
    assert not forced.settle_repeated(q[:, :, :1].clone(), k.clone(), v.clone(), causal=False)
    rows = torch.randn(2, 4, sdpa_module.DECODE_ROWS + 1, 8, dtype=torch.float64)
    assert not adapter.settle_repeated(rows, k, v, causal=False)  # more rows than a decode step: SDPA chooses
    assert not adapter.settle_repeated(q[:, :, :4], k, v, causal=True)  # a bottom-right mask: counted with it
