"""Calls with features remember their decided backends per exact signature (``Dispatcher.feature_plans``).

A model sends the same masked (or softcapped, windowed) call from every layer of a forward with a new mask each
forward; checking and deciding it once per signature takes that cost off every layer but the first. What is
remembered is never a tensor: each test here changes something the checks or the decision look at, or the
tensors' values, and checks the next call sees it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnforge
from attnforge.backends.exact import reference_attention
from attnforge.dispatch import features, runtime
from attnforge.errors import DispatchError
from attnforge.records import RecordStore
from tests._fakes import count_calls


@pytest.fixture
def prepared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """A fresh process-wide dispatcher (SDPA and the exact math) and a count of the calls that were checked."""
    d = runtime.Dispatcher({}, records=RecordStore(tmp_path / "home"))
    previous = runtime.set_dispatcher(d)
    yield count_calls(monkeypatch, features, "prepare")
    runtime.set_dispatcher(previous)


def _qkv(seed: int, *, hq: int = 4, hkv: int = 2, sq: int = 6, sk: int = 9) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, h, s, 8, generator=g, dtype=torch.float64) for h, s in ((hq, sq), (hkv, sk), (hkv, sk)))


def _mask(seed: int, shape: tuple[int, ...] = (2, 1, 6, 9)) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.4


def _check(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> None:
    torch.testing.assert_close(out, reference_attention(q, k, v, **kw))


def test_layers_sharing_a_signature_are_checked_once_and_each_gets_its_own_mask(prepared: list[int]) -> None:
    for layer in range(5):
        q, k, v = _qkv(layer)
        mask = _mask(layer)  # new values every call: nothing of the first call's mask may be reused
        _check(attnforge.attention(q, k, v, attn_mask=mask), q, k, v, attn_mask=mask)
    assert len(prepared) == 1


def test_an_in_place_change_of_the_mask_is_seen(prepared: list[int]) -> None:
    q, k, v = _qkv(0)
    mask = _mask(0)
    attnforge.attention(q, k, v, attn_mask=mask)
    mask[0, :, 2, :] = False
    mask[1] = True
    _check(attnforge.attention(q, k, v, attn_mask=mask), q, k, v, attn_mask=mask)


@pytest.mark.parametrize("change", [
    {"softcap": 5.0}, {"window": (2, 1)}, {"scale": 0.3}, {"causal": True}, {"mask_shape": (2, 4, 6, 9)},
    {"mask_dtype": torch.float64}, {"sk": 11}, {"layout": "bshd"}, {"grad": True},
], ids=lambda c: next(iter(c)))
def test_another_signature_is_checked_on_its_own(prepared: list[int], change: dict[str, Any]) -> None:
    q, k, v = _qkv(1)
    mask = _mask(1)
    attnforge.attention(q, k, v, attn_mask=mask)
    kw: dict[str, Any] = {}
    if "sk" in change:
        q, k, v = _qkv(2, sk=change["sk"])
        mask = _mask(2, (2, 1, 6, change["sk"]))
    if "mask_shape" in change:
        mask = _mask(3, change["mask_shape"])
    if "mask_dtype" in change:
        mask = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    for name in ("softcap", "window", "scale", "causal"):
        if name in change:
            kw[name] = change[name]
    if change.get("grad"):
        q = q.clone().requires_grad_(True)
    if change.get("layout") == "bshd":
        out = attnforge.attention(*(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask, layout="bshd")
        out = out.transpose(1, 2)
    else:
        out = attnforge.attention(q, k, v, attn_mask=mask, **kw)
    _check(out, q, k, v, attn_mask=mask, **kw)
    assert len(prepared) == 2


def test_a_bad_mask_after_a_good_call_is_still_refused(prepared: list[int]) -> None:
    q, k, v = _qkv(0)
    attnforge.attention(q, k, v, attn_mask=_mask(0))
    with pytest.raises(DispatchError, match="does not broadcast"):
        attnforge.attention(q, k, v, attn_mask=_mask(1, (2, 1, 6, 8)))
    with pytest.raises(DispatchError, match="bool or floating-point"):
        attnforge.attention(q, k, v, attn_mask=_mask(1).int())


def test_a_one_dimensional_mask_is_viewed_as_the_checks_did(prepared: list[int]) -> None:
    q, k, v = _qkv(4)
    for seed in range(3):
        keys = _mask(seed, (9,))
        _check(attnforge.attention(q, k, v, attn_mask=keys), q, k, v, attn_mask=keys)
    assert len(prepared) == 1


def test_bshd_calls_of_one_signature_stay_exact(prepared: list[int]) -> None:
    for seed in range(3):
        q, k, v = _qkv(seed)
        mask = _mask(seed)
        out = attnforge.attention(*(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask, layout="bshd",
                                  softcap=4.0)
        _check(out.transpose(1, 2), q, k, v, attn_mask=mask, softcap=4.0)
    assert len(prepared) == 1


def test_forgetting_decisions_forgets_the_plans(prepared: list[int]) -> None:
    q, k, v = _qkv(0)
    attnforge.attention(q, k, v, attn_mask=_mask(0))
    d = runtime.get_dispatcher()
    assert d.feature_plans
    d.forget_decisions()
    assert not d.feature_plans
    attnforge.attention(q, k, v, attn_mask=_mask(0))
    d.refresh()
    assert not d.feature_plans
    assert len(prepared) == 2


def test_tensor_features_other_than_the_mask_are_not_remembered(prepared: list[int]) -> None:
    q, k, v = _qkv(5)
    sinks = torch.zeros(4, dtype=torch.float64)
    for _ in range(2):
        _check(attnforge.attention(q, k, v, sinks=sinks), q, k, v, sinks=sinks)
    assert len(prepared) == 2
    assert not runtime.get_dispatcher().feature_plans


def test_a_remembered_plan_keeps_no_tensor_of_the_call_alive(prepared: list[int]) -> None:
    """A decode loop makes a new signature every step (Sk grows): a plan that held the call's K/V or mask would
    keep every step's cache alive."""
    import gc
    import weakref

    q, k, v = _qkv(6)
    mask = _mask(6)
    refs = [weakref.ref(t) for t in (q, k, v, mask)]
    attnforge.attention(q, k, v, attn_mask=mask, softcap=3.0)
    assert runtime.get_dispatcher().feature_plans
    del q, k, v, mask
    gc.collect()
    assert [r() for r in refs] == [None] * 4


# -- a dynamic shape class (a decode loop: a new Sk every step) keeps one plan for every length ------------------


def _decode_step(step: int, *, sk0: int = 20, b: int = 2, **kw: Any) -> tuple[torch.Tensor, ...]:
    q, k, v = _qkv(100 + step, sq=1, sk=sk0 + step)
    mask = torch.ones(b, 1, 1, sk0 + step, dtype=torch.bool)
    mask[0, ..., : 3 + step % 4] = False  # left padding of the first sequence, a new mask object every step
    return q, k, v, mask


def test_a_decode_loop_is_checked_once_per_length_only_until_its_class_turns_dynamic(prepared: list[int]) -> None:
    for step in range(12):
        q, k, v, mask = _decode_step(step)
        _check(attnforge.attention(q, k, v, attn_mask=mask, softcap=4.0), q, k, v, attn_mask=mask, softcap=4.0)
    # one check per length until the class has shown more than DYNAMIC_AFTER lengths, then its class-level plan
    assert len(prepared) == features.DYNAMIC_AFTER + 1


def test_a_window_that_starts_to_bind_as_the_cache_grows_is_served_exactly(prepared: list[int]) -> None:
    """Sk 9..16 is one bucket; the window (12, 0) hides no key while Sk <= 12 and binds past it: the class-level
    plan decided at Sk 12 (the class's fourth length: dynamic) without the window must not serve Sk 13..16."""
    for step in range(8):
        q, k, v, mask = _decode_step(step, sk0=9)
        out = attnforge.attention(q, k, v, attn_mask=mask, window=(12, 0))
        _check(out, q, k, v, attn_mask=mask, window=(12, 0))
    assert len(prepared) == 5  # Sk 9, 10, 11, 12, then 13 where the window starts to bind (and its plan serves on)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_prefill_lengths_of_one_bucket_share_the_class_plan_and_stay_exact(prepared: list[int], layout: str) -> None:
    for i, s in enumerate((33, 40, 47, 50, 55, 60, 64)):  # one bucket (64), Sq == Sk, causal
        q, k, v = _qkv(200 + i, sq=s, sk=s)
        mask = _mask(200 + i, (2, 1, s, s))
        if layout == "bshd":
            out = attnforge.attention(*(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask, causal=True,
                                      layout="bshd").transpose(1, 2)
        else:
            out = attnforge.attention(q, k, v, attn_mask=mask, causal=True)
        _check(out, q, k, v, attn_mask=mask, causal=True)
    assert len(prepared) == features.DYNAMIC_AFTER + 1


def test_the_class_plan_is_not_taken_across_buckets_squareness_or_mask_layout(prepared: list[int]) -> None:
    for step in range(features.DYNAMIC_AFTER + 2):  # the decode class turns dynamic
        q, k, v, mask = _decode_step(step, sk0=40)
        attnforge.attention(q, k, v, attn_mask=mask)
    checked = len(prepared)
    cases = [
        _decode_step(0, sk0=70),  # another Sk bucket (128): another class
        (*_qkv(300, sq=1, sk=45)[:3], _mask(300, (2, 1, 1, 1)).expand(2, 1, 1, 1).clone()),  # a mask of one key
        (*_qkv(301, sq=1, sk=46)[:3], _mask(301, (46,))),  # a [Sk] mask: another mask layout
    ]
    for q, k, v, mask in cases:
        _check(attnforge.attention(q, k, v, attn_mask=mask), q, k, v, attn_mask=mask)
    assert len(prepared) == checked + len(cases)
    # a bad mask at a new length of the dynamic class is still refused (its layout differs, so it is checked)
    q, k, v, _ = _decode_step(9, sk0=40)
    with pytest.raises(DispatchError, match="does not broadcast"):
        attnforge.attention(q, k, v, attn_mask=torch.ones(2, 1, 1, 7, dtype=torch.bool))


def test_the_dynamic_signature_names_the_lengths_and_keeps_the_rest() -> None:
    q, k, v, mask = _decode_step(0, sk0=40)
    key = features.signature(q, k, v, layout="bhsd", backend=None, precision="exact", scale=None,
                             kwargs={"attn_mask": mask, "softcap": 4.0})
    assert key is not None
    dyn = features.dynamic_signature(key, layout="bhsd")
    assert dyn is not None
    assert dyn[1] == (2, 4, ("S", 1), 8) and dyn[2] == (2, 2, ("S", 64), 8)
    assert dyn[10] == ((2, 1, "Sq", "Sk"), torch.bool, mask.device)
    q2, k2, v2, mask2 = _decode_step(5, sk0=40)
    key2 = features.signature(q2, k2, v2, layout="bhsd", backend=None, precision="exact", scale=None,
                              kwargs={"attn_mask": mask2, "softcap": 4.0})
    assert key2 != key and features.dynamic_signature(key2, layout="bhsd") == dyn
    empty = features.signature(q[:, :, :0], k, v, layout="bhsd", backend=None, precision="exact", scale=None,
                               kwargs={"attn_mask": None, "softcap": 4.0})
    assert empty is not None and features.dynamic_signature(empty, layout="bhsd") is None


def test_a_mask_whose_head_dimension_matched_Sq_by_chance_is_still_checked(prepared: list[int]) -> None:
    """Hq = 8 and Sq = 8 when the class turns dynamic: a later mask with 6 heads at Sq 6 must not pass for the same
    layout (it does not broadcast to 8 heads)."""
    for sq in (5, 6, 7, 8):  # one bucket (8), Sk 20: the fourth length makes the class dynamic
        q, k, v = _qkv(400 + sq, hq=8, hkv=2, sq=sq, sk=20)
        mask = _mask(400 + sq, (2, 8, sq, 20))
        _check(attnforge.attention(q, k, v, attn_mask=mask), q, k, v, attn_mask=mask)
    q, k, v = _qkv(410, hq=8, hkv=2, sq=6, sk=20)
    with pytest.raises(DispatchError, match="does not broadcast"):
        attnforge.attention(q, k, v, attn_mask=_mask(410, (2, 6, 6, 20)))


def test_values_of_another_length_than_the_keys_are_still_refused_in_a_dynamic_class(prepared: list[int]) -> None:
    for step in range(features.DYNAMIC_AFTER + 2):
        q, k, v, mask = _decode_step(step, sk0=40)
        attnforge.attention(q, k, v, attn_mask=mask, softcap=4.0)
    q, k, v, mask = _decode_step(9, sk0=40)
    with pytest.raises(DispatchError):
        attnforge.attention(q, k, v[:, :, :-1], attn_mask=mask, softcap=4.0)



_MODEL = st.fixed_dictionaries({
    "decode": st.booleans(), "heads": st.sampled_from([(4, 2), (4, 4)]),
    "mask": st.sampled_from(["none", "keys", "full", "heads", "additive"]), "causal": st.booleans(),
    "window": st.sampled_from([None, (12, 0), (3, 2)]), "softcap": st.sampled_from([None, 4.0]),
    "layout": st.sampled_from(["bhsd", "bshd"]),
})
_STEP = st.tuples(st.integers(5, 8), st.integers(9, 16), st.integers(0, 9))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=_MODEL, steps=st.lists(_STEP, min_size=6, max_size=14))
def test_any_sequence_of_calls_through_remembered_plans_stays_exact(
        prepared: list[int], model: dict[str, Any], steps: list[tuple[int, int, int]]) -> None:
    """One model's calls at many lengths of one bucket (Sq 1 or 5-8, Sk 9-16), so its class turns dynamic and the
    class-level plan serves the lengths that follow: every output equals the reference, and a mask one key short
    (one call in ten) is refused."""
    runtime.get_dispatcher().forget_decisions()
    (hq, hkv), c = model["heads"], model
    for i, (rows, sk, bad) in enumerate(steps):
        sq = 1 if c["decode"] else rows
        q, k, v = _qkv(i, hq=hq, hkv=hkv, sq=sq, sk=sk)
        shape = {"none": None, "keys": (2, 1, 1, sk), "full": (2, 1, sq, sk), "heads": (2, hq, sq, sk),
                 "additive": (2, 1, sq, sk)}[c["mask"]]
        mask = None if shape is None else _mask(i, shape)
        if mask is not None and c["mask"] == "additive":
            mask = torch.zeros(shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))
        kw: dict[str, Any] = {"causal": c["causal"], "window": c["window"], "softcap": c["softcap"]}
        if mask is not None and bad == 0:
            with pytest.raises(DispatchError):
                attnforge.attention(q, k, v, attn_mask=mask[..., :-1], **kw)
        if c["layout"] == "bshd":
            out = attnforge.attention(*(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask, layout="bshd",
                                      **kw).transpose(1, 2)
        else:
            out = attnforge.attention(q, k, v, attn_mask=mask, **kw)
        _check(out, q, k, v, attn_mask=mask, **kw)


def test_a_remembered_sdpa_plan_that_starts_raising_falls_back_with_the_one_rule(
        prepared: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """A remembered signature whose first backend is SDPA calls it directly (no route is bound); when it raises,
    the whole route serves the call: SDPA is skipped for the signature with one warning, the exact math answers."""
    from attnforge.backends import sdpa as sdpa_module

    q, k, v = _qkv(7)
    mask = _mask(7)
    attnforge.attention(q, k, v, attn_mask=mask, softcap=None)
    assert runtime.get_dispatcher().feature_plans
    real = sdpa_module.SdpaAdapter.__call__

    def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(sdpa_module.SdpaAdapter, "__call__", broken)
    with pytest.warns(RuntimeWarning, match="'sdpa' raised"):
        out = attnforge.attention(q, k, v, attn_mask=mask)
    _check(out, q, k, v, attn_mask=mask)
    again = attnforge.attention(q, k, v, attn_mask=mask)  # skipped for the signature now: no second warning
    _check(again, q, k, v, attn_mask=mask)
    monkeypatch.setattr(sdpa_module.SdpaAdapter, "__call__", real)


def test_only_an_unforced_plan_led_by_sdpa_or_the_exact_math_is_called_directly(prepared: list[int]) -> None:
    q, k, v = _qkv(8)
    attnforge.attention(q, k, v, attn_mask=_mask(8))
    attnforge.attention(q, k, v, attn_mask=_mask(8), backend="sdpa")
    plans = list(runtime.get_dispatcher().feature_plans.values())
    assert {(p.forced, p.direct.name if p.direct else None) for p in plans} == {(None, "sdpa"), ("sdpa", None)}
