"""FlashAttention-4's masked decode route (``FlashAttn4Adapter._masked``): a padded batch's decode step as varlen
sequences on the recorded compiled call, anything else on the exact math.

The seam faked is ``flash_attn.cute.interface._flash_attn_fwd``: :class:`_VarlenFa4` lays out its compiled call's
positional arguments as the real one did on an H200 (``tests/fixtures/gpu/fa4_varlen_decode_call.json``, recorded by
``scripts/gpu/decode_probe.py fa4_varlen_decode``), and its "kernel" computes each varlen sequence in float64 with
softcap, so a wrong start, length, view or slot shows as a wrong answer.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnforge.backends import _fa4_direct, _padded_decode, registry
from attnforge.backends._base import Requirement
from attnforge.backends.adapter import AttentionCall
from attnforge.backends.exact import reference_attention
from attnforge.backends.flash import FlashAttn4Adapter
from attnforge.verify.cases import feature_cases
from attnforge.verify.feature_inputs import case_inputs
from tests.dispatch._padded_steps import fa4_only_dispatcher, padded_step

FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures" / "gpu" / "fa4_varlen_decode_call.json").read_text())
#: slot -> the keyword (or q/k/v/out) the recorded call held there
SLOTS = {int(i): name for i, name in FIXTURE["slots"].items()}


class _VarlenFa4:
    """``_flash_attn_fwd`` for varlen calls, its compiled call's arguments laid out as recorded (see the module
    docstring); counts its own calls and the kernel's."""

    def __init__(self) -> None:
        self.compile_cache: dict[Any, Any] = {}
        self.calls = 0
        self.kernel_calls = 0

    def __call__(self, q: Any, k: Any, v: Any, *, cu_seqlens_q: Any, cu_seqlens_k: Any, seqused_k: Any,
                 max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float | None, causal: bool,
                 softcap: float | None) -> Any:
        assert max_seqlen_q == 1 and not causal and max_seqlen_k > 0
        self.calls += 1
        scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
        key = (q.dtype, q.shape[-1], q.shape[1] // k.shape[1], softcap)
        if key not in self.compile_cache:
            self.compile_cache[key] = self._compile(softcap)
        out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype)
        named = {"q": q, "k": k, "v": v, "out": out, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k,
                 "seqused_k": seqused_k}
        args: list[Any] = [None] * len(FIXTURE["args"])
        for slot, name in SLOTS.items():
            args[slot] = named[name]
        args[5] = scale
        args[15] = object()  # AuxData: a static object
        self.compile_cache[key](*args)
        return out, None, None, None, None

    def _compile(self, softcap: float | None) -> Any:
        where = {name: slot for slot, name in SLOTS.items()}

        def kernel(*args: Any) -> None:
            self.kernel_calls += 1
            q, k, v, out = (args[where[n]] for n in ("q", "k", "v", "out"))
            cu_q, cu_k, used = (args[where[n]] for n in ("cu_seqlens_q", "cu_seqlens_k", "seqused_k"))
            for i in range(cu_q.shape[0] - 1):
                start, n = int(cu_k[i]), int(used[i])
                keys, values = k[start:start + n, 0].double(), v[start:start + n, 0].double()
                rows = q[int(cu_q[i]):int(cu_q[i + 1])].double()  # [1, g, D]
                logits = torch.einsum("tgd,kd->tgk", rows, keys) * args[5]
                if softcap:
                    logits = softcap * torch.tanh(logits / softcap)
                out[int(cu_q[i]):int(cu_q[i + 1])] = torch.einsum("tgk,kd->tgd", logits.softmax(-1), values)

        return kernel


@pytest.fixture
def fa4(monkeypatch: pytest.MonkeyPatch) -> tuple[FlashAttn4Adapter, _VarlenFa4]:
    fake = _VarlenFa4()
    interface = types.ModuleType("fake_fa4_varlen.interface")
    interface._flash_attn_fwd = fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_fa4_varlen", types.ModuleType("fake_fa4_varlen"))
    monkeypatch.setitem(sys.modules, "fake_fa4_varlen.interface", interface)
    monkeypatch.setattr(_fa4_direct, "INTERFACE", "fake_fa4_varlen.interface")
    monkeypatch.setattr(_fa4_direct, "VERSIONS", frozenset({pytest.__version__}))  # the distribution read: pytest
    monkeypatch.setattr(_padded_decode, "_RUNS", _padded_decode.KeptPerMask())
    caps = registry.adapters()["flash-attn-4"].caps  # type: ignore[attr-defined]
    caps = dataclasses.replace(caps, devices=("cpu",), support=dataclasses.replace(caps.support, dtypes=("float32",)))
    adapter = FlashAttn4Adapter(name="flash-attn-4", caps=caps,
                                requirement=Requirement(modules=("fake_fa4_varlen",), distributions=("pytest",)))
    return adapter, fake


def _step(*, groups: int, case: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    return padded_step(case, groups=groups, sk=29, d=16, dtype=torch.float32, seed=seed)


@pytest.mark.parametrize("softcap", [None, 5.0], ids=["plain", "softcap"])
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize(("case", "kernel"), [("left", True), ("right", True), ("additive", True),
                                              ("finfo-min", True), ("static-cache", True), ("holes", False),
                                              ("empty-row", False), ("other-values", False)])
def test_a_padded_decode_step_runs_on_the_varlen_kernel_else_the_exact_math(
        fa4: tuple[FlashAttn4Adapter, _VarlenFa4], groups: int, case: str, kernel: bool,
        softcap: float | None) -> None:
    """One call, the first mask of its kind (as a verify case is): on the kernel where every row sees one run of
    keys, else on the exact math."""
    adapter, fake = fa4
    q, k, v, mask = _step(groups=groups, case=case)
    want = reference_attention(q, k, v, causal=False, attn_mask=mask, softcap=softcap)
    out = adapter(q, k, v, causal=False, scale=None, attn_mask=mask, softcap=softcap)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    assert out.shape == q.shape
    assert (fake.calls > 0) is kernel  # a hole or an empty row: the exact math


def test_the_compiled_call_is_replayed_and_the_runs_read_once_per_mask(
        fa4: tuple[FlashAttn4Adapter, _VarlenFa4], monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode loop: each step a new mask object shared by its three layers, the K/V one key longer. The first
    call records the compiled call (and checks its replay once); every later call is the replay alone, its per-call
    tensors in the recorded slots; the runs are read once per mask object."""
    adapter, fake = fa4
    reads: list[int] = []
    real = _padded_decode.padding_runs
    monkeypatch.setattr(_padded_decode, "padding_runs", lambda *a, **kw: reads.append(1) or real(*a, **kw))
    g = torch.Generator().manual_seed(3)
    b, hkv, hq, d = 2, 2, 4, 8
    q = torch.randn(b, hq, 1, d, generator=g)
    cache = torch.randn(2, b, hkv, 40, d, generator=g)
    for step, sk in enumerate(range(20, 24)):
        k, v = cache[0, :, :, :sk].clone(), cache[1, :, :, :sk].clone()
        mask = torch.ones(b, 1, 1, sk, dtype=torch.bool)
        mask[0, ..., :step + 1] = False
        for _layer in range(3):
            out = adapter(q, k, v, causal=False, scale=0.3, attn_mask=mask, softcap=20.0)
            want = reference_attention(q, k, v, causal=False, attn_mask=mask, scale=0.3, softcap=20.0)
            torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    assert len(reads) == 4  # one per mask object
    assert fake.calls == 1  # _flash_attn_fwd ran once: the recording
    assert fake.kernel_calls == 12 + 1  # every call's kernel, and the replay's check
    replay = next(iter(adapter.varlen_replays.values())).replay
    assert replay is not None and dict(replay.named) == {s: n for s, n in SLOTS.items() if s > 3}


@pytest.mark.parametrize(("layers", "kernel_calls"), [(1, 1 + 1), (2, 3 + 4 + 1)],
                         ids=["one-layer-each", "shared"])
def test_masks_that_serve_one_call_each_stay_on_the_exact_math(fa4: tuple[FlashAttn4Adapter, _VarlenFa4],
                                                               layers: int, kernel_calls: int) -> None:
    """Gemma-2's two masks a step (sliding and full), alternating by layer. The first mask of its kind is read;
    after it, with one layer each, reading a mask's runs would cost more than one call saves, so the exact math
    serves every later mask; shared by two layers each, the first step's second mask is read at its second call and
    later steps' masks at their first (+ 1: the replay's one check)."""
    adapter, fake = fa4
    q, k, v, _ = _step(groups=2, case="left")
    for step in range(2):
        masks = []
        for kind in range(2):
            mask = torch.ones(3, 1, 1, k.shape[2], dtype=torch.bool)
            mask[1, ..., : 3 + kind + step] = False
            masks.append(mask)
        for _layer in range(layers):
            for mask in masks:
                out = adapter(q, k, v, causal=False, scale=None, attn_mask=mask, softcap=30.0)
                want = reference_attention(q, k, v, causal=False, attn_mask=mask, softcap=30.0)
                torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    assert fake.kernel_calls == kernel_calls  # step 0: each mask's 2nd call; step 1: all four; + the replay check


def test_an_inference_mode_mask_gets_the_exact_math(fa4: tuple[FlashAttn4Adapter, _VarlenFa4]) -> None:
    """An inference tensor keeps no runs (no version counter), so a read per call would never pay."""
    adapter, fake = fa4
    q, k, v, _ = _step(groups=2, case="left")
    with torch.inference_mode():
        mask = torch.ones(3, 1, 1, k.shape[2], dtype=torch.bool)
        mask[0, ..., :4] = False
    for _ in range(3):
        out = adapter(q, k, v, causal=False, scale=None, attn_mask=mask)
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, attn_mask=mask), atol=1e-5, rtol=1e-5)
    assert fake.calls == 0


def test_the_replay_keeps_no_recorded_tensor_alive(fa4: tuple[FlashAttn4Adapter, _VarlenFa4]) -> None:
    """The kept replay holds none of the recording's tensors: a K/V cache the caller drops is freed."""
    import gc
    import weakref

    adapter, _ = fa4
    q, k, v, mask = _step(groups=2, case="left")
    cache = k.as_strided((k.numel(),), (1,))  # the storage's one owner besides k and v
    gone = weakref.ref(cache)
    adapter(q, k, v, causal=False, scale=None, attn_mask=mask)
    replay = next(iter(adapter.varlen_replays.values())).replay
    assert replay is not None and all(a is None for a in replay.args[:4])
    assert all(replay.args[slot] is None for slot, _ in replay.named)
    del cache, k, v, mask
    gc.collect()
    assert gone() is None


def test_a_call_the_kernel_raises_on_goes_to_the_exact_math_from_then_on(
        fa4: tuple[FlashAttn4Adapter, _VarlenFa4], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    adapter, fake = fa4

    def refuse(*args: Any, **kwargs: Any) -> Any:
        fake.calls += 1
        raise AssertionError("cu_seqlens_k must have shape (batch_size + 1,)")

    monkeypatch.setattr(sys.modules["fake_fa4_varlen.interface"], "_flash_attn_fwd", refuse)
    q, k, v, mask = _step(groups=2, case="left")
    for _ in range(3):
        out = adapter(q, k, v, causal=False, scale=None, attn_mask=mask)
        torch.testing.assert_close(out.double(), reference_attention(q, k, v, attn_mask=mask), atol=1e-5, rtol=1e-5)
    assert fake.calls == 1  # refused once, remembered
    assert "refused a call" in caplog.text and "AssertionError" in caplog.text
    monkeypatch.setattr(sys.modules["fake_fa4_varlen.interface"], "_flash_attn_fwd",
                        lambda *a, **kw: (_ for _ in ()).throw(torch.OutOfMemoryError("CUDA out of memory")))
    fresh = FlashAttn4Adapter(name="flash-attn-4", caps=adapter.caps, requirement=adapter.requirement)
    with pytest.raises(torch.OutOfMemoryError):  # the device's state reaches the caller
        fresh(q, k, v, causal=False, scale=None, attn_mask=mask)
    monkeypatch.setattr(sys.modules["fake_fa4_varlen.interface"], "_flash_attn_fwd",
                        lambda *a, **kw: (_ for _ in ()).throw(RuntimeError("CUDA error: an illegal memory access")))
    fresh = FlashAttn4Adapter(name="flash-attn-4", caps=adapter.caps, requirement=adapter.requirement)
    with pytest.raises(RuntimeError, match="CUDA error"):  # so does a CUDA error, as SDPA's lean paths raise it
        fresh(q, k, v, causal=False, scale=None, attn_mask=mask)
    assert fresh.varlen_replays and False not in fresh.varlen_replays.values()  # nothing turned off


@pytest.mark.parametrize("why", ["grad", "prefill", "other-version", "sinks", "top-left"])
def test_any_other_masked_call_gets_the_exact_math(fa4: tuple[FlashAttn4Adapter, _VarlenFa4], why: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    adapter, fake = fa4
    q, k, v, mask = _step(groups=2, case="left")
    kwargs: dict[str, Any] = {}
    if why == "grad":
        q.requires_grad_(True)
    if why == "prefill":
        q = torch.randn(q.shape[0], q.shape[1], 4, q.shape[3])
        mask = mask.expand(-1, -1, 4, -1)
    if why == "other-version":
        monkeypatch.setattr(_fa4_direct, "VERSIONS", frozenset({"0.0.0"}))
    if why == "sinks":
        kwargs["sinks"] = torch.zeros(q.shape[1])
    if why == "top-left":
        kwargs["causal_alignment"] = "top_left"
    causal = why == "top-left"
    out = adapter(q, k, v, causal=causal, scale=None, attn_mask=mask, **kwargs)
    want = reference_attention(q.detach(), k, v, causal=causal, attn_mask=mask, **kwargs)
    torch.testing.assert_close(out.detach().double(), want, atol=1e-5, rtol=1e-5)
    assert fake.calls == 0


def test_the_capabilities_admit_a_mask_on_a_decode_step_only() -> None:
    caps = registry.adapters()["flash-attn-4"].caps  # type: ignore[attr-defined]
    assert "mask" in caps.features and caps.mask_max_seqlen_q == 1

    def call(sq: int, *also: str) -> AttentionCall:
        return AttentionCall(device_type="cuda", compute_capability=(9, 0), dtype="bfloat16", batch=4, heads_q=16,
                             heads_kv=8, seqlen_q=sq, seqlen_k=1024, head_dim=256, causal=False, needs_grad=False,
                             features=frozenset({"mask", "softcap", *also}))

    assert caps.unsupported_reasons(call(1)) == []
    assert any("a mask only on a decode step" in r for r in caps.unsupported_reasons(call(2)))
    sdpa = registry.fallback().caps  # type: ignore[attr-defined]
    assert not any("decode step" in r for r in sdpa.unsupported_reasons(call(2)))
    # beside a mask only what the route serves on the kernel (mask_with): sinks and lse there would be exact math
    assert caps.unsupported_reasons(call(1, "window")) == []
    for other in ("sinks", "lse"):
        assert caps.unsupported_reasons(call(1, other)) == [
            f"a mask only beside causal_top_left, softcap, window; the call also has {other}"]
        without_mask = dataclasses.replace(call(1, other), features=frozenset({other}))
        assert caps.unsupported_reasons(without_mask) == []  # FA4's own kernel serves it


def test_verify_checks_the_decode_mask_on_a_padding_mask() -> None:
    cases = feature_cases(frozenset({"mask", "softcap"}), dtypes=("bfloat16",), head_dims=(64, 128), max_seqlen=64,
                          mask_max_seqlen_q=1)
    mask_case = next(c for c in cases if c.feature == "mask")
    assert (mask_case.seqlen_q, mask_case.batch) == (1, 3)
    *_, opts = case_inputs(mask_case, "cpu")
    rows = opts["attn_mask"].reshape(3, -1)
    assert rows.shape[1] == mask_case.seqlen_k and bool(rows.any(dim=1).all())
    for row in rows:  # one run of visible keys per row
        seen = row.nonzero().flatten()
        assert int(seen[-1] - seen[0]) + 1 == len(seen)
    plain = feature_cases(frozenset({"mask"}), dtypes=("bfloat16",), head_dims=(64, 128), max_seqlen=64)
    assert plain[0].seqlen_q > 1  # a backend without the restriction keeps the general mask case
    assert math.isfinite(float(case_inputs(plain[0], "cpu")[0].sum()))


@pytest.mark.parametrize(("b", "hkv"), [(1, 1), (3, 2), (4, 8)])
def test_the_runs_read_on_the_host_give_the_starts_and_lengths(b: int, hkv: int) -> None:
    """``padding_runs``: each (batch row, K/V head)'s first visible key in rows of ``k``'s storage and the run's
    length, int32, ``seqused_k`` 16-byte aligned (a kernel may assume it of a tensor argument); a row with a hole
    gives ``()``."""
    sk = 10
    k = torch.zeros(2, b, hkv, sk + 3, 8)[0, :, :, :sk]  # a slice of a longer cache: rows of 8 elements
    mask = torch.ones(b, 1, 1, sk, dtype=torch.bool)
    for row in range(b):
        mask[row, ..., : row % 3] = False
    starts, used = _padded_decode.padding_runs(mask, b=b, hkv=hkv, k=k)
    assert starts.dtype == used.dtype == torch.int32 and used.data_ptr() % 16 == 0
    want_starts = [row * hkv * (sk + 3) + head * (sk + 3) + row % 3 for row in range(b) for head in range(hkv)]
    assert starts.tolist() == [*want_starts, _padded_decode.key_rows(k)]
    assert used.tolist() == [sk - row % 3 for row in range(b) for _ in range(hkv)]
    mask[0, ..., 4] = False
    assert _padded_decode.padding_runs(mask, b=b, hkv=hkv, k=k) == ()


@pytest.fixture
def fa4_dispatcher(fa4: tuple[FlashAttn4Adapter, _VarlenFa4], tmp_path: Path,
                   monkeypatch: pytest.MonkeyPatch) -> tuple[FlashAttn4Adapter, _VarlenFa4, list[int]]:
    """The faked FlashAttention-4 as the process dispatcher's only backend (:func:`fa4_only_dispatcher`): the adapter,
    the fake and the list of the adapter's masked calls."""
    adapter, fake = fa4
    masked = fa4_only_dispatcher(adapter, tmp_path / "afhome", monkeypatch, device="cpu", version="1")
    return adapter, fake, masked


def test_a_steps_later_layers_take_the_fa4_lane(fa4_dispatcher: Any) -> None:
    """Gemma-2's decode through ``attnforge.attention`` (a mask, a scale and a softcap, as the transformers
    integration passes them): each step's first layer goes through the adapter (its mask's runs read, the call
    replayed), the step's later layers take the lane it offered (:class:`attnforge.backends.flash.Fa4DecodeLane`:
    the kept runs, the replay, no signature, plan or adapter checks); every output is the reference's. A call that
    differs (another softcap, the mask changed in place, a gradient) is not the lane's."""
    import attnforge

    _, fake, masked = fa4_dispatcher
    g = torch.Generator().manual_seed(5)
    b, hkv, hq, d = 2, 2, 4, 8
    cache = torch.randn(2, b, hkv, 40, d, generator=g)
    for step, sk in enumerate(range(20, 23)):
        q = torch.randn(b, hq, 1, d, generator=g)
        k, v = cache[0, :, :, :sk], cache[1, :, :, :sk]
        mask = torch.ones(b, 1, 1, sk, dtype=torch.bool)
        mask[1, ..., : step + 3] = False
        want = reference_attention(q, k, v, attn_mask=mask, scale=0.3, softcap=20.0)
        for _layer in range(4):
            out = attnforge.attention(q, k, v, attn_mask=mask, scale=0.3, softcap=20.0)
            torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    assert len(masked) == 3  # one call a step through the adapter; the other three layers took the lane
    assert fake.calls == 1 and fake.kernel_calls == 12 + 1  # one recording; every call on the kernel (+ its check)
    # another softcap on the same mask: the adapter's (and then its own lane)
    out = attnforge.attention(q, k, v, attn_mask=mask, scale=0.3, softcap=10.0)
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, attn_mask=mask, scale=0.3, softcap=10.0),
                               atol=1e-5, rtol=1e-5)
    assert len(masked) == 4
    # the mask changed in place: its version counter moved, so the lane does not serve it with the old runs
    mask[0, ..., :5] = False
    out = attnforge.attention(q, k, v, attn_mask=mask, scale=0.3, softcap=20.0)
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, attn_mask=mask, scale=0.3, softcap=20.0),
                               atol=1e-5, rtol=1e-5)
    assert len(masked) == 5
    # a call autograd records: the lane declines it, the adapter serves it on the exact math
    qg = q.clone().requires_grad_()
    out = attnforge.attention(qg, k, v, attn_mask=mask, scale=0.3, softcap=20.0)
    out.sum().backward()
    assert qg.grad is not None and len(masked) == 6


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=40), st.integers(0, 1))
def test_declines_then_worth_reading_counts_each_call_once(calls: list[int], kinds: int) -> None:
    """A caller that asks :meth:`MaskSharing.would_decline` first, counts a declined call with ``worth_reading`` and
    otherwise lets the route ask ``worth_reading`` (the transformers integration's hand-off) gets the answers, and
    leaves the counts, that ``worth_reading`` alone gives: the rule for the calls that stay is unchanged."""
    masks = [torch.ones(1) for _ in range(6)]
    alone, split = _padded_decode.MaskSharing(), _padded_decode.MaskSharing()
    for i in calls:
        key = ("kind", i % (kinds + 1))
        want = alone.worth_reading(masks[i], key)
        declined = split.would_decline(masks[i], key)
        got = split.worth_reading(masks[i], key)
        assert got == want and declined is not got
    assert {k: [(r(), n) for r, n in v] for k, v in split._recent.items()} == \
        {k: [(r(), n) for r, n in v] for k, v in alone._recent.items()}


def _generate_served(monkeypatch: pytest.MonkeyPatch, model_cls: str, config_cls: str, *, new_tokens: int,
                     **config: Any) -> tuple[list[list[int]], list[list[int]], dict[str, int]]:
    """A tiny transformers model (``config``) generating greedily from a left-padded batch of 2, first with its eager
    attention, then through ``attn_implementation="attnforge"`` (the process dispatcher as the test set it): the two
    token lists and, for the second, how many decode calls (one query row) went to the model's eager function
    (``eager``) and how many to the exact math behind the dispatch under a mask (``exact``)."""
    transformers = pytest.importorskip("transformers")
    from attnforge.backends import exact
    from attnforge.integrations import transformers as tfi

    tfi.register()
    tfi._EXACT_ONLY.clear()
    cfg = getattr(transformers, config_cls)(vocab_size=97, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                            num_key_value_heads=2, head_dim=8, max_position_embeddings=64, **config)
    ids = torch.randint(0, 97, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, :3] = 0
    kw = {"attention_mask": mask, "max_new_tokens": new_tokens, "do_sample": False, "pad_token_id": 0}
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)._from_config(cfg, attn_implementation="eager").eval()
    want = model.generate(ids, **kw)
    counts = {"eager": 0, "exact": 0}
    real_eager, real_exact = tfi._eager, exact.exact_attention

    def eager(*a: Any, **k: Any) -> Any:
        counts["eager"] += a[1].shape[2] == 1
        return real_eager(*a, **k)

    def exact_math(q: Any, *a: Any, **k: Any) -> Any:
        counts["exact"] += q.shape[2] == 1 and k.get("attn_mask") is not None
        return real_exact(q, *a, **k)

    monkeypatch.setattr(tfi, "_eager", eager)
    monkeypatch.setattr(exact, "exact_attention", exact_math)
    model.set_attn_implementation("attnforge")
    got = model.generate(ids, **kw)
    return want.tolist(), got.tolist(), counts


# 5 decode steps, 2 masks each: with 1 layer per mask every call but the first of its kind (read) is handed over;
# with 2, only the first step's second mask at its first call (the route's own rule: read at its second)
@pytest.mark.parametrize(("layers", "handed"), [(2, 9), (4, 1)])
def test_a_gemma2_generate_hands_declined_decode_calls_to_its_eager_function(
        fa4_dispatcher: Any, monkeypatch: pytest.MonkeyPatch, layers: int, handed: int) -> None:
    """A tiny Gemma-2 (a window its keys never reach: each step's two masks, windowed and global, one object each)
    generating from a left-padded batch through ``attn_implementation="attnforge"`` with FlashAttention-4 verified:
    with one layer per mask (2 layers), the decode calls the route would leave to its exact math (their masks are
    not worth reading) go to the model's own eager function; with two layers per mask (4 layers) every mask after
    the first step's is read and its calls run on the kernel or its lane. The tokens are eager's either way, and no
    decode call takes the exact math behind the dispatch."""
    _, fake, _masked = fa4_dispatcher
    want, got, counts = _generate_served(monkeypatch, "Gemma2ForCausalLM", "Gemma2Config", new_tokens=6,
                                         num_hidden_layers=layers, sliding_window=64, attn_logit_softcapping=2.0,
                                         query_pre_attn_scalar=8)
    assert got == want
    assert counts == {"eager": handed, "exact": 0}  # no decode call on the exact math behind the dispatch
    assert fake.kernel_calls > 0


def test_a_gpt_oss_generate_hands_its_masked_decode_calls_with_sinks_to_its_eager_function(
        fa4_dispatcher: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """GPT-OSS's sinks beside a padding mask: FlashAttention-4's route would serve its decode calls on the exact math
    alone (``_masked``), so its capabilities leave such calls out (``mask_with``), attnforge's choice for them is the
    exact math, and the transformers integration hands each to the model's own eager function (the framework's
    default: sinks are its own); the tokens are eager's."""
    want, got, counts = _generate_served(monkeypatch, "GptOssForCausalLM", "GptOssConfig", new_tokens=5,
                                         num_hidden_layers=2, sliding_window=64, num_local_experts=4,
                                         num_experts_per_tok=2,
                                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    assert got == want
    assert counts == {"eager": 8, "exact": 0}  # 4 decode steps, 2 layers: every decode call handed over
