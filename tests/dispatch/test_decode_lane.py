"""The decode lane: a decode step's later layers (transformers calls every layer with one mask object) served by the
lane the first layer's backend offered (:func:`attnforge.dispatch.features.lane_call`,
:class:`attnforge.backends.sdpa.DecodeLane`), and every call that is not such a repeat served as before.

On CPU the memory-efficient op is the stand-in of ``tests/dispatch/test_sdpa_masks.py`` (the real op's rules), and
the decode path is opened to the CPU at its device seam; outputs are compared with the float64 reference."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import attnforge
from attnforge.backends import sdpa as sdpa_module
from attnforge.backends.exact import reference_attention
from attnforge.dispatch import features, runtime
from attnforge.errors import DispatchError
from tests.dispatch.test_sdpa_masks import _efficient_kernel, _install_efficient_kernel

B, HQ, HKV, D = 2, 8, 2, 8
SCALE = D ** -0.5


@pytest.fixture
def lane_runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """A fresh process dispatcher, the stand-in op, no lane kept; yields what each lane run returned (True: it
    served the call)."""
    previous = runtime.set_dispatcher(None)
    _install_efficient_kernel(monkeypatch, _efficient_kernel)
    runs: list[bool] = []
    real = sdpa_module.DecodeLane.__call__

    def spy(self: sdpa_module.DecodeLane, *args: Any) -> Any:
        out = real(self, *args)
        runs.append(out is not None)
        return out

    monkeypatch.setattr(sdpa_module.DecodeLane, "__call__", spy)
    features._LANES.__dict__.clear()
    yield runs
    features._LANES.__dict__.clear()
    runtime.set_dispatcher(previous)


def _step(sk: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode step's query (a bhsd view of bshd memory, as transformers' projection gives it) and its padding
    mask ``[B, 1, 1, Sk]`` (bool, True = attend; left padding on row 1)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, 1, HQ, D, generator=g, dtype=torch.float64).transpose(1, 2)
    mask = torch.ones(B, 1, 1, sk, dtype=torch.bool)
    mask[1, ..., : sk // 3] = False
    return q, mask


def _kv(sk: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + seed)
    return (torch.randn(B, HKV, sk, D, generator=g, dtype=torch.float64) for _ in range(2))  # type: ignore[return-value]


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, **kw: Any) -> torch.Tensor:
    out = attnforge.attention(q, k, v, attn_mask=mask, **kw)
    torch.testing.assert_close(out, reference_attention(q, k, v, causal=False, attn_mask=mask,
                                                        scale=kw.get("scale")))
    return out


def test_the_next_layers_of_a_decode_step_take_the_lane(lane_runs: list[bool]) -> None:
    """Three decode steps of a 4-layer model (a new length and a new mask object each step, each layer its own
    K/V): layers 2-4 of every step are served by the lane, the first by the plan (which offers the lane), and every
    output is the reference's."""
    for step, sk in enumerate((19, 20, 21)):
        q, mask = _step(sk, seed=step)
        for layer in range(4):
            k, v = _kv(sk, seed=layer)
            _check(q, k, v, mask, scale=SCALE)
        assert lane_runs == [True] * 3 * (step + 1)


@pytest.mark.parametrize("change", ["scale", "kv-layout", "mask-in-place", "decisions-forgotten", "grad",
                                    "kernels-restricted", "forced-backend", "causal", "dtype", "other-mask"])
def test_a_call_that_is_not_a_repeat_is_served_as_before(change: str, lane_runs: list[bool]) -> None:
    """After a layer's call kept a lane, a call that differs in anything the lane was made for (the scale, the K/V
    strides, the mask changed in place, the decisions forgotten, a call autograd records, SDPA's kernels restricted,
    a forced backend, causal, the dtype, another mask) is not served by it, and its output is its reference's (the
    in-place mask change included: a kept bias of the old values would be wrong)."""
    sk = 19
    q, mask = _step(sk)
    k, v = _kv(sk, seed=0)
    _check(q, k, v, mask, scale=SCALE)  # the lane is made for this call
    kw: dict[str, Any] = {"scale": SCALE}
    if change == "scale":
        kw["scale"] = 0.5
    elif change == "kv-layout":
        k, v = (torch.cat([t, t[:, :, :3]], dim=2)[:, :, :sk] for t in (k, v))  # a longer cache's slice
    elif change == "mask-in-place":
        mask[0, ..., 2:5] = False
    elif change == "decisions-forgotten":
        runtime.get_dispatcher().forget_decisions()
    elif change == "grad":
        q = q.detach().clone().requires_grad_()
    elif change == "dtype":
        q, k, v = (t.float() for t in (q, k, v))
    elif change == "other-mask":
        mask = mask.clone()
    if change == "kernels-restricted":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.MATH]):
            _check(q, k, v, mask, **kw)
    elif change == "forced-backend":
        with attnforge.use_backend("exact"):
            _check(q, k, v, mask, **kw)
    elif change == "causal":
        out = attnforge.attention(q, k, v, attn_mask=mask, causal=True, scale=SCALE)
        torch.testing.assert_close(out, reference_attention(q, k, v, causal=True, attn_mask=mask, scale=SCALE))
    elif change == "dtype":
        out = attnforge.attention(q, k, v, attn_mask=mask, **kw)
        torch.testing.assert_close(out, reference_attention(q, k, v, causal=False, attn_mask=mask,
                                                            scale=SCALE).float(), atol=1e-5, rtol=1e-4)
    else:
        out = _check(q, k, v, mask, **kw)
        if change == "grad":
            out.sum().backward()
            assert q.grad is not None and torch.isfinite(q.grad).all()
    assert True not in lane_runs


def test_bad_input_on_the_lanes_mask_gets_the_error_with_its_hint(lane_runs: list[bool]) -> None:
    """A call with the lane's mask object and bad tensors (a numpy array, a 3-D q) gets attention()'s own error,
    not a traceback from the lane's checks."""
    q, mask = _step(19)
    k, v = _kv(19, seed=0)
    _check(q, k, v, mask, scale=SCALE)
    with pytest.raises(DispatchError):
        attnforge.attention(q.detach().numpy(), k, v, attn_mask=mask, scale=SCALE)
    with pytest.raises(DispatchError):
        attnforge.attention(q[0], k, v, attn_mask=mask, scale=SCALE)
    assert True not in lane_runs


def test_a_lane_belongs_to_the_thread_that_made_it(lane_runs: list[bool]) -> None:
    """Another thread's call with the same mask object and geometry is not served by this thread's lane (it makes
    its own), and its output is the reference's."""
    q, mask = _step(19)
    k, v = _kv(19, seed=0)
    _check(q, k, v, mask, scale=SCALE)
    errors: list[BaseException] = []

    def other() -> None:
        try:
            _check(q, k, v, mask, scale=SCALE)
        except BaseException as exc:  # reported to the test's thread
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert not errors and lane_runs == []
    _check(q, k, v, mask, scale=SCALE)
    assert lane_runs == [True]


def test_no_lane_for_an_inference_mask_nor_a_settled_shape(lane_runs: list[bool],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A mask made under ``torch.inference_mode`` (no version counter) gets no lane; a shape met often enough to
    settle on SDPA's own choice is not served by a lane made before it settled, which is then dropped rather than
    asked again on every call (a mask object reused at a fixed shape). Outputs are the reference's."""
    with torch.inference_mode():
        q, mask = _step(19)
        k, v = _kv(19, seed=0)
        for _layer in range(3):
            _check(q, k, v, mask, scale=SCALE)
    assert lane_runs == []
    monkeypatch.setattr(sdpa_module._MetShapes, "SETTLED", 2)
    monkeypatch.setattr(sdpa_module, "_MET", sdpa_module._MetShapes())
    q, mask = _step(23)
    k, v = _kv(23, seed=0)
    for _layer in range(4):  # meetings 1-2 unsettled (the plan, then the lane), 3-4 settled
        _check(q, k, v, mask, scale=SCALE)
    assert lane_runs == [True, False]  # it declined for good at the first settled meeting: not asked again


def test_an_inference_mask_attnforge_made_gets_a_lane(lane_runs: list[bool]) -> None:
    """Under ``torch.inference_mode`` a mask the transformers integration's builder made (``made_here``: only the
    model's layers read it) gets its lane as a versioned one does: the next layers of the step run it; outputs are
    the reference's."""
    from attnforge.backends._base import made_here

    with torch.inference_mode():
        q, mask = _step(19)
        made_here(mask)
        k, v = _kv(19, seed=0)
        for _layer in range(3):
            _check(q, k, v, mask, scale=SCALE)
    assert lane_runs == [True, True]


def test_a_lane_keeps_no_bias_alive_after_its_mask(lane_runs: list[bool]) -> None:
    """The lane a thread keeps after its last decode step holds its bias weakly: once the step's mask is gone, so
    is the bias (a mask per head makes one of ``B x Hq x Sq x Sk`` elements)."""
    import gc

    q, mask = _step(19)
    k, v = _kv(19, seed=0)
    _check(q, k, v, mask, scale=SCALE)
    lane = features._LANES.lanes[0].run
    assert isinstance(lane, sdpa_module.DecodeLane) and lane.bias() is not None
    del mask
    gc.collect()
    assert lane.bias() is None


def test_alternating_masks_and_a_mask_reused_in_place_keep_their_lanes(lane_runs: list[bool]) -> None:
    """Gemma-2's layers alternate two mask objects (sliding and full): each keeps its lane. A mask object that the
    caller updates in place each step (one buffer reused) gets its lane made again at the step's first layer, so
    the later layers of every step take it. Outputs are the reference's."""
    q, full = _step(19)
    sliding = full.clone()
    sliding[..., :4] = False
    for _step_no in range(2):
        for layer in range(6):
            k, v = _kv(19, seed=layer)
            _check(q, k, v, full if layer % 2 else sliding, scale=SCALE)
    assert lane_runs == [True] * 10  # all but each mask's first call
    lane_runs.clear()
    mask = full.clone()
    for step in range(3):
        mask[0, ..., step] = False  # the caller's buffer, changed in place for the next step
        for layer in range(3):
            k, v = _kv(19, seed=layer)
            _check(q, k, v, mask, scale=SCALE)
        assert lane_runs == [True] * 2 * (step + 1)


def test_a_lane_holds_its_dispatcher_weakly(lane_runs: list[bool]) -> None:
    """A dispatcher replaced in the process (``runtime.set_dispatcher``) is not kept alive by the lanes of the
    threads that served calls on it."""
    import gc
    import weakref

    q, mask = _step(19)
    k, v = _kv(19, seed=0)
    _check(q, k, v, mask, scale=SCALE)
    gone = weakref.ref(runtime.get_dispatcher())
    runtime.set_dispatcher(None)
    gc.collect()
    assert gone() is None
    _check(q, k, v, mask, scale=SCALE)  # a new dispatcher: its own plan, the output the reference's


def test_a_lane_whose_kernel_raises_is_dropped_and_the_call_served(monkeypatch: pytest.MonkeyPatch,
                                                                   lane_runs: list[bool]) -> None:
    """An exception from the kernel on a lane's call (any kind: the general path absorbs any, as it does for a
    raising backend) reaches the general path, which serves the call; the lane is dropped. Out of memory reaches
    the caller."""
    q, mask = _step(19)
    k, v = _kv(19, seed=0)
    _check(q, k, v, mask, scale=SCALE)
    raised: list[int] = []

    def flaky(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        if not raised:
            raised.append(1)
            raise ValueError("a kernel's own complaint")
        return _efficient_kernel(*args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_dot_product_efficient_attention", flaky)
    _check(q, k, v, mask, scale=SCALE)  # the lane's call raised; the general path served it
    assert raised and features._LANES.lanes[0].run is None
    _check(q, k, v, mask, scale=SCALE)
    assert lane_runs == []  # the spy saw the raise, not a return; then no lane was asked

    def oom(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        raise torch.OutOfMemoryError("out of memory")

    q2, mask2 = _step(19, seed=1)
    _check(q2, k, v, mask2, scale=SCALE)  # makes a lane for the new mask
    monkeypatch.setattr(torch, "_scaled_dot_product_efficient_attention", oom)
    with pytest.raises(torch.OutOfMemoryError):
        attnforge.attention(q2, k, v, attn_mask=mask2, scale=SCALE)


def test_calls_through_the_sdpa_patch_take_the_lane(monkeypatch: pytest.MonkeyPatch, lane_runs: list[bool]) -> None:
    """``attnforge.patch_sdpa()`` routes ``F.scaled_dot_product_attention`` to attention() with top-left causal
    alignment, which changes nothing without causal or a window: a step's later layers take the lane there too,
    and match the unpatched SDPA."""
    import torch.nn.functional as F  # noqa: N812

    from attnforge.backends.sdpa_original import original_sdpa

    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, *_: Any,
               scale: float | None = None) -> tuple[torch.Tensor, ...]:
        out = reference_attention(q, k, v, causal=False, scale=scale, attn_mask=bias).to(q.dtype)
        return out.transpose(1, 2).contiguous().transpose(1, 2), torch.empty(0), torch.empty(0), torch.empty(0)

    monkeypatch.setattr(torch, "_scaled_dot_product_efficient_attention", kernel)  # no SDPA call inside: patched
    q, mask = _step(19)
    with attnforge.patch_sdpa():
        sdpa = original_sdpa()
        for layer in range(3):
            k, v = _kv(19, seed=layer)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=SCALE, enable_gqa=True)
            torch.testing.assert_close(out, sdpa(q, k, v, attn_mask=mask, scale=SCALE, enable_gqa=True))
    assert lane_runs == [True, True]
