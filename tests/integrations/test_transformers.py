"""attn_implementation="attnforge" against each model's own eager attention, in tiny random models built from
configs (no download), fp32 on CPU: logits (with left padding), a training step's gradients, generate."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version

import attnforge
from attnforge.errors import DispatchError

transformers = pytest.importorskip("transformers")
from attnforge.integrations import transformers as tf_integration  # noqa: E402
from tests.integrations._models import MODELS, VOCAB, tiny_model  # noqa: E402

TOL = 1e-4
#: models whose calls only attnforge's exact math serves on this CPU machine (softcap, sinks; FlexAttention not
#: verified in a test's home): unforced, they go to the model's eager function (test_exact_only_calls_go_to_the_...
#: below), so the tests of the features' mapping force the exact math (:func:`_serving`)
EXACT_ONLY = {"gemma2-softcap-sliding-window", "gpt-oss-sinks"}


@pytest.fixture(autouse=True)
def registered() -> None:
    """``attn_implementation="attnforge"`` is known to transformers (registering twice is harmless)."""
    tf_integration.register()


def _serving(name: str) -> Any:
    """The context a model's calls are served by attnforge in: the exact math forced for :data:`EXACT_ONLY` models
    (which would otherwise go to their eager function), nothing for the others."""
    import contextlib

    return attnforge.use_backend("exact") if name in EXACT_ONLY else contextlib.nullcontext()


def _inputs(batch: int = 2, length: int = 11, left_pad: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, :left_pad] = 0
    return ids, mask


def _max_diff(a: torch.Tensor, b: torch.Tensor, where: torch.Tensor | None = None) -> float:
    d = (a - b).abs()
    return float((d[where.bool()] if where is not None else d).max())


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_match_eager_with_and_without_left_padding(name: str, served: list[tuple[int, ...]]) -> None:
    ids, mask = _inputs()
    eager, ours = tiny_model(name, "eager").eval(), tiny_model(name, "attnforge").eval()
    with torch.no_grad(), _serving(name):
        plain = _max_diff(ours(ids).logits, eager(ids).logits)
        # padded positions attend to nothing and are meaningless in both: compare the real tokens
        padded = _max_diff(ours(ids, attention_mask=mask).logits, eager(ids, attention_mask=mask).logits, mask)
    assert plain <= TOL
    assert padded <= TOL
    assert len(served) == 2 * 2  # two layers, two forwards: every call served by attnforge, none by eager


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_under_autocast_match_the_default(name: str) -> None:
    """Under ``torch.autocast("cpu", bfloat16)`` RoPE leaves q and k in float32 beside a bfloat16 v; the forward
    pass raised "q, k, v dtypes differ" through attnforge while SDPA casts all three (review, 2026-12-02)."""
    ids, mask = _inputs()
    default = "eager" if name in EXACT_ONLY else "sdpa"  # Gemma-2 and GPT-OSS have no SDPA path in transformers
    sdpa, ours = tiny_model(name, default).eval(), tiny_model(name, "attnforge").eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), _serving(name):
        want, got = sdpa(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
    assert got.dtype == want.dtype
    assert _max_diff(got.float(), want.float(), mask) <= 0.05


def test_a_compiled_llama_under_autocast_matches_the_default() -> None:
    """The same Llama compiled (``fullgraph=True``, Dynamo's ``aot_eager``) under ``torch.autocast("cpu",
    bfloat16)``: the traced call skipped attention()'s autocast cast and raised "q, k, v dtypes differ" on RoPE's
    float32 q, k beside a bfloat16 v (review, 2026-12-02)."""
    ids, mask = _inputs()
    sdpa, ours = tiny_model("llama", "sdpa").eval(), tiny_model("llama", "attnforge").eval()
    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), _serving("llama"):
        want, got = sdpa(ids, attention_mask=mask).logits, compiled(ids, attention_mask=mask).logits
    assert got.dtype == want.dtype
    assert _max_diff(got.float(), want.float(), mask) <= 0.05


@pytest.mark.parametrize("name", list(MODELS))
def test_training_step_gradients_match_eager(name: str, served: list[tuple[int, ...]]) -> None:
    ids, mask = _inputs()
    # padded positions attend to nothing and their outputs are meaningless: no loss predicted from them (the
    # label of position t is predicted at t - 1)
    labels = ids.masked_fill(torch.nn.functional.pad(mask, (1, 0), value=1)[:, :-1] == 0, -100)
    grads = []
    for impl in ("eager", "attnforge"):
        model = tiny_model(name, impl).train()
        with _serving(name):
            loss = model(ids, attention_mask=mask, labels=labels).loss
            loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    worst = max(_max_diff(grads[0][n], grads[1][n]) for n in grads[0])
    assert worst <= TOL
    assert served


def test_packed_position_ids_match_eager(served: list[tuple[int, ...]]) -> None:
    """Two sequences packed in one row, told apart by position_ids alone (a padding-free training batch)."""
    ids, _ = _inputs(batch=1, length=11)
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5]])
    eager, ours = tiny_model("llama", "eager").eval(), tiny_model("llama", "attnforge").eval()
    with torch.no_grad():
        # packing is detected only without a cache (transformers' masking_utils, a training setup)
        want = eager(ids, position_ids=positions, use_cache=False).logits
        got = ours(ids, position_ids=positions, use_cache=False).logits
        unpacked = eager(ids[:, 5:], position_ids=positions[:, 5:], use_cache=False).logits
    assert _max_diff(got, want) <= TOL
    assert _max_diff(got[:, 5:], unpacked) <= TOL  # the second sequence did not see the first
    assert served


def test_output_attentions_goes_to_the_models_own_eager(served: list[tuple[int, ...]]) -> None:
    ids, mask = _inputs()
    eager, ours = tiny_model("gpt-oss-sinks", "eager").eval(), tiny_model("gpt-oss-sinks", "attnforge").eval()
    with torch.no_grad():
        want = eager(ids, attention_mask=mask, output_attentions=True)
        got = ours(ids, attention_mask=mask, output_attentions=True)
    assert served == []
    assert len(got.attentions) == 2
    for a, b in zip(got.attentions, want.attentions, strict=True):
        assert _max_diff(a, b) <= TOL
    assert _max_diff(got.logits, want.logits, mask) <= TOL


def test_generate_with_cache_matches_eager(served: list[tuple[int, ...]]) -> None:
    ids, mask = _inputs(length=6, left_pad=2)
    kwargs = {"attention_mask": mask, "max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    want = tiny_model("gemma2-softcap-sliding-window", "eager").eval().generate(ids, **kwargs)
    with _serving("gemma2-softcap-sliding-window"):
        got = tiny_model("gemma2-softcap-sliding-window", "attnforge").eval().generate(ids, **kwargs)
    assert got.tolist() == want.tolist()
    assert len(served) == 2 * 5  # two layers, the prompt and four single-token steps


@pytest.mark.parametrize("name", sorted(EXACT_ONLY))
def test_exact_only_calls_go_to_the_models_eager_function(name: str, served: list[tuple[int, ...]],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A call only attnforge's exact math would serve (softcap or sinks, FlexAttention not verified here) goes to
    the model's own eager function, the framework default (on an H200 the exact math ran Gemma-2's padded prefill
    at 0.89x eager): the logits are eager's to the bit, forward and generate; attnforge.explain is asked once per
    kind of call, not per decode step; a kernel that serves the call (explain naming another backend) takes it."""
    ids, mask = _inputs()
    tf_integration._EXACT_ONLY.clear()
    asked: list[str] = []
    real_explain = attnforge.dispatch.runtime.explain

    def explain(*args: Any, **kwargs: Any) -> Any:
        got = real_explain(*args, **kwargs)
        asked.append(got.chosen)
        return got

    monkeypatch.setattr(attnforge.dispatch.runtime, "explain", explain)
    eager, ours = tiny_model(name, "eager").eval(), tiny_model(name, "attnforge").eval()
    with torch.no_grad():
        assert torch.equal(ours(ids, attention_mask=mask).logits, eager(ids, attention_mask=mask).logits)
        kwargs = {"attention_mask": mask, "max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
        assert ours.generate(ids, **kwargs).tolist() == eager.generate(ids, **kwargs).tolist()
    assert served == []
    assert asked and set(asked) == {"exact"}
    assert len(asked) <= 4, asked  # prefill and decode kinds (full and sliding layers), not one per step
    # a kernel for the call (as FlexAttention verified would be): attnforge serves it
    tf_integration._EXACT_ONLY.clear()
    monkeypatch.setattr(attnforge.dispatch.runtime, "explain",
                        lambda *a, **k: type("Explained", (), {"chosen": "flex"})())
    with torch.no_grad():
        ours(ids, attention_mask=mask)
    assert len(served) == 2


def test_exact_only_asks_again_for_a_new_dispatcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hand-off's answer is kept per kind of call for one dispatcher: a new dispatcher (``runtime.refresh``, a
    reloaded home) starts at generation 0 as the old one did, so its calls must be asked of explain again, not read
    from the old one's answer (which could hand a call to eager that a newly verified kernel would serve)."""
    from attnforge.dispatch import runtime

    q = torch.randn(1, 2, 5, 8)
    k = v = torch.randn(1, 2, 5, 8)
    call = {"causal": True, "softcap": 50.0, "scale": None, "dropout_p": 0.0, "sinks": None}
    tf_integration._EXACT_ONLY.clear()
    old = runtime.set_dispatcher(None)
    try:
        first = runtime.get_dispatcher()
        monkeypatch.setattr(runtime, "explain", lambda *a, **kw: type("Explained", (), {"chosen": "exact"})())
        assert tf_integration._exact_only(q, k, v, call)
        runtime.set_dispatcher(None)
        second = runtime.get_dispatcher()
        assert second is not first and second.generation == first.generation
        monkeypatch.setattr(runtime, "explain", lambda *a, **kw: type("Explained", (), {"chosen": "flex"})())
        assert not tf_integration._exact_only(q, k, v, call)
    finally:
        runtime.set_dispatcher(old)
        tf_integration._EXACT_ONLY.clear()


def test_varlen_pays_asks_again_for_a_new_dispatcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """The padded prefill's "is the packed call worth it" answer is kept per kind for one dispatcher too: a new one at
    the same generation is asked again (here the old one's kernel for the packed call is gone: the exact math)."""
    from attnforge.dispatch import runtime

    q = k = v = torch.randn(2, 2, 16, 8)
    mask = torch.ones(2, 1, 16, 16, dtype=torch.bool)
    answers: dict[str, str] = {}
    monkeypatch.setattr(tf_integration, "_chosen",
                        lambda q, k, v, call: answers["dense" if "attn_mask" in call else "packed"])
    monkeypatch.setattr(tf_integration, "_VARLEN_PAYS", {})
    base = {"scale": None, "dropout_p": 0.0, "softcap": None, "sinks": None}
    old = runtime.set_dispatcher(None)
    try:
        first = runtime.get_dispatcher()
        answers.update(packed="flash-attn-4", dense="sdpa")
        assert tf_integration._varlen_pays(q, k, v, mask=mask, features=base, base=base)
        runtime.set_dispatcher(None)
        assert runtime.get_dispatcher() is not first
        answers.update(packed="exact", dense="sdpa")
        assert not tf_integration._varlen_pays(q, k, v, mask=mask, features=base, base=base)
    finally:
        runtime.set_dispatcher(old)


@pytest.fixture
def skip_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The query length of every time transformers reads a padding mask to see whether it may skip building the
    mask (``masking_utils._ignore_causal_mask_sdpa``: a host sync on a GPU), counted from here on."""
    from transformers import masking_utils

    tf_integration._PADDED_DECODE.clear()
    calls: list[int] = []
    asking: list[int] = []
    real, real_all = masking_utils._ignore_causal_mask_sdpa, masking_utils.fast_all

    def spy(padding_mask: Any, q_length: int, *args: Any, **kwargs: Any) -> bool:
        asking.append(q_length)
        try:
            return real(padding_mask, q_length, *args, **kwargs)  # type: ignore[no-any-return]
        finally:
            asking.pop()

    def reads(tensor: Any) -> Any:
        if asking:
            calls.append(asking[-1])
        return real_all(tensor)

    monkeypatch.setattr(masking_utils, "_ignore_causal_mask_sdpa", spy)
    monkeypatch.setattr(masking_utils, "fast_all", reads)
    return calls


# Gemma-2's sliding layers: a window of 4 (MODELS) the keys reach, which sdpa_mask builds without reading; a window
# of 64 they never reach, whose mask is the global layers' (a view of the padding mask, like theirs)
@pytest.mark.parametrize(("name", "window", "kinds", "views"),
                         [("llama", None, 1, 4), ("gemma2-softcap-sliding-window", 4, 1, 4),
                          ("gemma2-softcap-sliding-window", 64, 2, 8)])
def test_a_padded_generate_reads_its_padding_once_for_its_decode_steps(  # noqa: PLR0917 - parametrized
        name: str, window: int | None, kinds: int, views: int, skip_checks: list[int],
        served: list[tuple[int, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A padded batch's decode steps build their masks without reading the padding mask again after the first step
    (transformers' SDPA mask reads it, a host sync, on every step for each kind of mask); the tokens are SDPA's (or
    eager's, for a model SDPA cannot serve), for an unpadded batch of the same size after it too. A sliding
    window the keys do not outgrow hides nothing: its layers' masks are views of the padding mask too."""
    ids, mask = _inputs(length=6, left_pad=2)
    kwargs = {"attention_mask": mask, "max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    default = "eager" if name.startswith("gemma2") else "sdpa"
    over = {} if window is None else {"sliding_window": window}
    want = tiny_model(name, default, **over).eval().generate(ids, **kwargs)
    if name.startswith("gemma2"):  # served by attnforge, as with FlexAttention verified: SDPA's masks, not eager's
        monkeypatch.setattr(tf_integration, "_exact_only", lambda *a, **k: False)
    skip_checks.clear()
    made: list[bool] = []
    real = tf_integration._last_query_mask
    monkeypatch.setattr(tf_integration, "_last_query_mask", lambda kw: made.append(real(kw) is not None) or real(kw))
    got = tiny_model(name, "attnforge", **over).eval().generate(ids, **kwargs)
    assert got.tolist() == want.tolist()
    assert skip_checks.count(1) == kinds, skip_checks  # the first decode step asks, for each kind of mask
    assert made == [True] * views  # decode steps 2-5's masks (global; and windowed, where the window hides nothing)
    # the same batch size, unpadded
    skip_checks.clear()
    full = torch.ones_like(mask)
    want = tiny_model(name, default, **over).eval().generate(ids, **{**kwargs, "attention_mask": full})
    skip_checks.clear()
    got = tiny_model(name, "attnforge", **over).eval().generate(ids, **{**kwargs, "attention_mask": full})
    assert got.tolist() == want.tolist()
    assert skip_checks == []  # transformers drops an all-visible padding mask before any mask function is asked


def test_a_model_served_by_its_eager_function_gets_eager_masks_and_no_skip_check(
        skip_checks: list[int], served: list[tuple[int, ...]]) -> None:
    """Where every attention call of a model went to its own eager function (Gemma-2's softcap with FlexAttention not
    verified: exact-only), its masks are then built as eager's: ``sdpa_mask``'s skip check reads the padding mask on
    the host, two syncs a mask, for a skip eager's function cannot use (on an H200, 2026-12-02,
    ``gemma_padded_probe.py``: the padded forward 0.988x eager with the check, 1.001x without). The first forward
    asks (nothing is known yet); later forwards and decode steps do not; the logits and tokens are eager's; a model
    whose calls attnforge serves (Llama) keeps the check on every forward."""
    name = "gemma2-softcap-sliding-window"
    ids, mask = _inputs(length=6, left_pad=2)
    eager, ours = tiny_model(name, "eager").eval(), tiny_model(name, "attnforge").eval()
    with torch.no_grad():
        want = eager(ids, attention_mask=mask).logits
        assert torch.equal(ours(ids, attention_mask=mask).logits, want)
        first = len(skip_checks)
        assert first > 0 and tf_integration.eager_served(ours.config)
        for _ in range(3):
            assert torch.equal(ours(ids, attention_mask=mask).logits, want)
        assert len(skip_checks) == first  # no further read of the padding mask
        kwargs = {"attention_mask": mask, "max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
        assert ours.generate(ids, **kwargs).tolist() == eager.generate(ids, **kwargs).tolist()
    assert len(skip_checks) == first and served == []
    llama = tiny_model("llama", "attnforge").eval()
    with torch.no_grad():
        for _ in range(2):
            before = len(skip_checks)
            llama(ids, attention_mask=mask)
            assert len(skip_checks) > before  # attnforge serves it: the skip may pay, it is asked
    assert not tf_integration.eager_served(llama.config) and served


def test_one_call_attnforge_serves_takes_a_model_off_eager_masks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager's masks only while every call went to the eager function: the first call served by attnforge (a kernel
    for softcap verified, here ``_exact_only`` answering False) takes the model back to SDPA's masks, as does a new
    dispatcher generation (records or verification changed)."""
    from attnforge.dispatch import runtime

    name = "gemma2-softcap-sliding-window"
    ids, mask = _inputs(length=6, left_pad=2)
    ours = tiny_model(name, "attnforge").eval()
    with torch.no_grad():
        ours(ids, attention_mask=mask)
        assert tf_integration.eager_served(ours.config)
        runtime.set_dispatcher(None)  # a new dispatcher: another generation
        assert not tf_integration.eager_served(ours.config)
        ours(ids, attention_mask=mask)
        assert tf_integration.eager_served(ours.config)
        monkeypatch.setattr(tf_integration, "_exact_only", lambda *a, **k: False)
        ours(ids, attention_mask=mask)
    assert not tf_integration.eager_served(ours.config)


@pytest.mark.parametrize("name", ["llama", "gemma2-softcap-sliding-window"])
def test_a_padded_generate_under_inference_mode_gives_the_defaults_tokens(name: str) -> None:
    """``generate`` under ``torch.inference_mode`` (a common way to serve): the masks the integration's builder makes
    are attnforge's own (``made_here``), so what the layers derive from them is kept though an inference tensor has
    no version counter; the tokens are the default's, for a padded batch and for a second one after it."""
    default = "eager" if name.startswith("gemma2") else "sdpa"
    for left_pad in (2, 3):
        ids, mask = _inputs(length=6, left_pad=left_pad)
        kwargs = {"attention_mask": mask, "max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
        with torch.inference_mode():
            want = tiny_model(name, default).eval().generate(ids, **kwargs)
            got = tiny_model(name, "attnforge").eval().generate(ids, **kwargs)
        assert got.tolist() == want.tolist()


def test_only_a_mask_in_fresh_memory_is_marked_attnforges_own() -> None:
    """The builder marks ``sdpa_mask``'s mask as attnforge's own (kept under ``torch.inference_mode``) only where it
    does not share the caller's padding mask's memory: a view of the padding mask is the caller's to change in place,
    which an inference tensor's missing version counter would hide."""
    from attnforge.backends import _base

    with torch.inference_mode():
        padding = torch.ones(2, 6, dtype=torch.bool)
        view = padding[:, None, None, :]
        fresh = padding[:, None, None, :].clone()
        assert tf_integration._made(view, padding) is view and _base.kept_version(view) is None
        assert tf_integration._made(fresh, padding) is fresh and _base.kept_version(fresh) == -1
        assert tf_integration._made(None, padding) is None


@settings(max_examples=200, deadline=None)
@given(batch=st.integers(1, 3), kv_length=st.integers(1, 12), kv_offset=st.integers(0, 3), extra=st.integers(0, 3),
       q_shift=st.sampled_from([0, 0, 0, -1, 1]), seed=st.integers(0, 2**16), dtype=st.sampled_from(["bool", "long"]))
def test_the_last_query_mask_is_sdpa_masks_own(  # noqa: PLR0917 - hypothesis draws
        batch: int, kv_length: int, kv_offset: int, extra: int, q_shift: int,
        seed: int, dtype: str) -> None:
    """Where :func:`_last_query_mask` answers (a bool padding mask, the query the last key), its mask is the one
    ``sdpa_mask`` builds for the plain causal mask; anywhere else it leaves the call to ``sdpa_mask``."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    padding = torch.rand(batch, kv_offset + kv_length + extra, generator=torch.Generator().manual_seed(seed)) < 0.7
    kw = {"batch_size": batch, "q_length": 1, "kv_length": kv_length, "kv_offset": kv_offset,
          "q_offset": kv_offset + kv_length - 1 + q_shift, "mask_function": causal_mask_function,
          "attention_mask": padding if dtype == "bool" else padding.long(), "allow_is_causal_skip": False}
    got = tf_integration._last_query_mask(kw)
    if dtype == "long" or q_shift:
        assert got is None
        return
    want = sdpa_mask(**kw)
    assert got is not None and got.shape == want.shape and got.dtype == torch.bool
    assert torch.equal(got, want)


@settings(max_examples=300, deadline=None)
@given(batch=st.integers(1, 3), kv_length=st.integers(1, 12), kv_offset=st.integers(0, 3),
       q_shift=st.sampled_from([0, 0, 0, -1, 1]), kind=st.sampled_from(["causal", "sliding", "chunked", "bidi"]),
       size=st.integers(1, 14), seed=st.integers(0, 2**16))
def test_hides_no_key_is_sdpa_masks_answer(  # noqa: PLR0917 - hypothesis draws
        batch: int, kv_length: int, kv_offset: int, q_shift: int, kind: str, size: int, seed: int) -> None:
    """:func:`_hides_no_key` says True exactly where ``sdpa_mask`` builds, from the same mask function and an
    all-visible padding mask, a mask that hides no key (transformers' own mask functions: causal, a sliding window,
    chunks over a per-row left padding, a bidirectional window); where it says True, the padding's view is the mask
    ``sdpa_mask`` builds over any padding."""
    from transformers import masking_utils as mu

    gen = torch.Generator().manual_seed(seed)
    fn = {"causal": lambda: mu.causal_mask_function,
          "sliding": lambda: mu.sliding_window_causal_mask_function(size),
          "chunked": lambda: mu.chunked_causal_mask_function(size, torch.randint(0, 3, (batch,), generator=gen)),
          "bidi": lambda: mu.sliding_window_bidirectional_mask_function(size)}[kind]()
    kw = {"batch_size": batch, "q_length": 1, "kv_length": kv_length, "kv_offset": kv_offset,
          "q_offset": kv_offset + kv_length - 1 + q_shift, "mask_function": fn, "allow_is_causal_skip": False}
    visible = mu.sdpa_mask(**kw, attention_mask=torch.ones(batch, kv_offset + kv_length, dtype=torch.bool))
    assert tf_integration._hides_no_key(kw) == bool(visible.all())
    padding = torch.rand(batch, kv_offset + kv_length, generator=gen) < 0.7
    if tf_integration._hides_no_key(kw) and not q_shift:
        assert torch.equal(tf_integration._last_query_mask({**kw, "attention_mask": padding}),
                           mu.sdpa_mask(**kw, attention_mask=padding))


def test_hides_no_key_declines_what_it_cannot_read() -> None:
    """A mask function that raises, answers on another device or in another dtype, or a vmap call: False (``sdpa_mask``
    builds the mask, and reports the error)."""
    kw = {"batch_size": 2, "q_length": 1, "kv_length": 5, "kv_offset": 0, "q_offset": 4}

    def raises(*_: Any) -> Any:
        raise IndexError("index 7 is out of bounds")

    assert not tf_integration._hides_no_key({**kw, "mask_function": raises})
    assert not tf_integration._hides_no_key({**kw, "mask_function": lambda b, h, q, k: (k >= 0).to("meta")})
    assert not tf_integration._hides_no_key({**kw, "mask_function": lambda b, h, q, k: (k >= 0).long()})
    assert not tf_integration._hides_no_key({**kw, "mask_function": lambda b, h, q, k: k >= 0, "use_vmap": True})
    assert tf_integration._hides_no_key({**kw, "mask_function": lambda b, h, q, k: k >= 0})


def test_the_mask_builder_builds_a_continued_padded_decode_steps_mask_and_passes_the_rest_through() -> None:
    """The registered mask function against ``sdpa_mask`` itself: the same mask wherever it builds one; a decode step
    that continues a padded one (the next K/V length, or the same: a static cache) built; a new length asked again;
    positional calls and calls that forbid the skip passed through."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    tf_integration._PADDED_DECODE.clear()
    build = tf_integration._mask_builder(sdpa_mask, causal_mask_function)
    padded = torch.ones(2, 9, dtype=torch.bool)
    padded[0, :3] = False

    def ask(kv: int, padding: torch.Tensor, **extra: Any) -> Any:
        kw = {"batch_size": 2, "q_length": 1, "kv_length": kv, "q_offset": kv - 1, "kv_offset": 0,
              "mask_function": causal_mask_function, "attention_mask": padding[:, :kv], **extra}
        got, want = build(**kw), sdpa_mask(**kw)
        assert (got is None) == (want is None) or (want is None and bool(got.all()))
        if want is not None:
            assert torch.equal(got, want)
        return got

    assert ask(6, padded) is not None  # asked: padded
    assert tf_integration._PADDED_DECODE[(2, "cpu", None)] == (6, True)
    full = torch.ones(2, 9, dtype=torch.bool)
    assert ask(7, full) is not None  # continues the padded batch: built, all visible, not asked
    assert ask(7, full) is not None  # the same length again (the query still the last key): still built
    # a query that is not the last key (a static cache's step, a prefix longer than the input): sdpa_mask decides
    kw = {"batch_size": 2, "q_length": 1, "kv_length": 8, "q_offset": 0, "kv_offset": 0,
          "mask_function": causal_mask_function, "attention_mask": full[:, :8]}
    assert build(**kw) is None and sdpa_mask(**kw) is None
    assert ask(3, full) is None  # a new length: asked, unpadded, skipped
    assert tf_integration._PADDED_DECODE[(2, "cpu", None)] == (3, False)
    assert ask(4, full) is None  # continues an unpadded batch: asked again (skipped)
    # a window the keys reach: sdpa_mask builds without asking; that answer is not the padding's
    assert ask(5, full, local_size=4) is not None
    assert (2, "cpu", 4) not in tf_integration._PADDED_DECODE
    positional = build(2, 1, 4, 3, 0, causal_mask_function, full[:, :4])
    assert positional is None


def test_a_one_token_forward_after_a_padded_generate_is_sdpas(skip_checks: list[int]) -> None:
    """A padded ``generate`` leaves the mask function expecting more padded steps; a later forward of one token with
    no cache and a padding mask longer than its input (transformers skips that mask: the query is not the last
    key) gets SDPA's logits, not a mask that does not fit its one key."""
    ids, mask = _inputs(length=6, left_pad=2)
    sdpa, ours = tiny_model("llama", "sdpa").eval(), tiny_model("llama", "attnforge").eval()
    for model in (sdpa, ours):
        model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    one, longer = ids[:, :1], torch.ones(2, 11, dtype=torch.long)
    with torch.no_grad():
        want = sdpa(one, attention_mask=longer, use_cache=False).logits
        got = ours(one, attention_mask=longer, use_cache=False).logits
    assert _max_diff(got, want) <= TOL


def test_a_model_without_an_eager_function_gets_a_hint() -> None:
    class Bare(torch.nn.Module):
        pass

    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(DispatchError, match="no eager attention function") as info:
        tf_integration.attention_forward(Bare(), q, q, q, None, output_attentions=True)
    assert info.value.hint is not None
    assert "eager" in info.value.hint


def _mask(length: int, mask_function: Any) -> torch.Tensor:
    """transformers' own bool mask ``[1, 1, S, S]`` for ``mask_function``."""
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(batch_size=1, q_length=length, kv_length=length, mask_function=mask_function,
                     allow_is_causal_skip=False)


def test_sliding_window_without_a_mask_is_transformers_window(served: list[tuple[int, ...]]) -> None:
    """A causal call with no mask and ``sliding_window=W`` sees what transformers' sliding-window mask allows."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    module = torch.nn.Module().eval()
    q, k, v = (torch.randn(1, 2, 9, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    got, _ = tf_integration.attention_forward(module, q, k, v, None, sliding_window=3)
    want, _ = tf_integration.attention_forward(module, q, k, v, _mask(9, sliding_window_causal_mask_function(3)))
    plain, _ = tf_integration.attention_forward(module, q, k, v, None)
    assert _max_diff(got, want) <= 1e-6
    assert _max_diff(got, plain) > 1e-3  # the window mattered
    assert len(served) == 3


def test_flash_style_cu_seq_lens_are_varlen(served: list[tuple[int, ...]]) -> None:
    """``cu_seq_lens_q/k`` (transformers' FlashAttention kwargs) on a packed row: each sequence alone."""
    q, k, v = (torch.randn(1, 2, 7, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    got, _ = tf_integration.attention_forward(torch.nn.Module().eval(), q, k, v, None, cu_seq_lens_q=cu,
                                              cu_seq_lens_k=cu, max_length_q=4, max_length_k=4)
    parts = [attnforge.attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], causal=True).transpose(1, 2)
             for a, b in ((0, 3), (3, 7))]
    assert got.shape == (1, 7, 2, 8)
    assert _max_diff(got, torch.cat(parts, dim=1)) <= 1e-6
    assert served[0] == (7, 2, 8)  # one packed varlen call


@pytest.mark.parametrize("causal", [True, False])
def test_packed_rows_handed_to_eager_keep_their_sequences_apart(causal: bool) -> None:
    """A packed row with ``cu_seq_lens`` and no mask, with ``output_attentions=True`` (the model's eager function
    serves it): eager got a plain causal mask over the whole row, and a token of the second sequence put 0.71 of its
    weight on the first's keys (logits 0.48 off, CPU fuzz 2026-12-03). Its mask now keeps the sequences apart, as the
    varlen call does; a non-causal (encoder) row too."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    class Module(torch.nn.Module):
        is_causal = causal
        num_key_value_groups = 1
    eager_module = Module().eval()
    tf_integration._EAGER_BY_CLASS[Module] = eager_attention_forward
    q, k, v = (torch.randn(1, 2, 7, 8, generator=torch.Generator().manual_seed(i), dtype=torch.float64)
               for i in range(3))
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    got, weights = tf_integration.attention_forward(eager_module, q, k, v, None, scaling=8 ** -0.5, cu_seq_lens_q=cu,
                                                    cu_seq_lens_k=cu, max_length_q=4, max_length_k=4,
                                                    output_attentions=True)
    parts = [attnforge.attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], causal=causal).transpose(1, 2)
             for a, b in ((0, 3), (3, 7))]
    assert weights is not None and float(weights[..., 3:, :3].abs().max()) == 0.0  # nothing across the boundary
    assert _max_diff(got, torch.cat(parts, dim=1)) <= 1e-6  # eager's softmax runs in float32


def test_a_model_on_eager_masks_attends_to_every_key_where_it_passes_no_mask() -> None:
    """BridgeTower runs only eagerly in transformers; its cross-modal layers' self-attention modules say
    ``is_causal=True`` and its image stream passes no mask, which eager reads as every key seen. attnforge read the
    module's flag and served the image tokens causal: image features 0.37 off eager (CPU fuzz, 2026-12-03)."""
    import copy

    text = {"vocab_size": VOCAB, "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1,
            "intermediate_size": 128, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    config = transformers.BridgeTowerConfig(text_config=text, vision_config={"hidden_size": 64, "num_hidden_layers": 1,
                                                                             "image_size": 32, "patch_size": 8},
                                            hidden_size=64, num_attention_heads=4, num_hidden_layers=1)
    ids, pixels = torch.randint(3, VOCAB, (2, 6)), torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    out = {}
    for impl in ("eager", "attnforge"):
        torch.manual_seed(0)
        model = transformers.BridgeTowerModel._from_config(copy.deepcopy(config), attn_implementation=impl).eval()
        with torch.no_grad():
            out[impl] = model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels)
    for name in ("text_features", "image_features", "pooler_output"):
        assert _max_diff(out["attnforge"][name], out["eager"][name]) < 1e-5, name


@pytest.mark.parametrize(("snippet", "edits"), [
    ("attention_mask = torch.cat([attention_mask, block_bias.to(attention_mask.dtype)], dim=-1)", True),
    ("attention_mask = F.pad(attention_mask, (0, 4), value=0.0)", True),
    ("attention_mask = torch.cat((attention_mask, cls_padding), dim=1)", True),
    ("attn_weights = attn_weights + attention_mask", False),
    ("if attention_mask.dtype == torch.bool:", False),
])
def test_a_module_that_edits_its_mask_as_an_additive_one_gets_eagers_masks(snippet: str, edits: bool) -> None:
    """DeepSeek-V4 (transformers 5.25) passes ``s_aux=``, which let it take SDPA's bool masks, yet appends its
    compressor's 0 / -inf bias to the mask it is given as to an additive one: the bool cast flipped which compressed
    slots were seen, logits 0.33 off eager (CPU fuzz, 2026-12-03)."""
    import re

    assert (re.search(tf_integration._EDITS_THE_MASK, snippet) is not None) is edits
    cls = getattr(transformers, "DeepseekV4ForCausalLM", None)
    if cls is not None:
        assert not tf_integration.takes_sdpa_masks(cls)
    assert tf_integration.takes_sdpa_masks(transformers.GptOssForCausalLM)  # sinks, and a mask it only adds
    assert tf_integration.takes_sdpa_masks(transformers.Gemma2ForCausalLM)


@pytest.mark.parametrize("forced", [None, "exact"])
def test_packed_cu_seq_lens_keep_sequences_apart_in_masked_layers(forced: str | None) -> None:
    """A packed row (``DataCollatorWithFlattening``'s ``position_ids`` and ``cu_seq_lens``) through GPT-OSS, whose
    sliding layers' masks are built without ``position_ids``: the mask spans both sequences, the ``cu_seq_lens`` beside
    it say where each ends. Every layer keeps the sequences apart, as its full layers' varlen calls do; until
    2026-12-03 a masked call dropped the ``cu_seq_lens`` and the second sequence's logits were 0.05-0.17 off (a CPU
    fuzz of the integration). Unforced, the sinks' calls go to the model's eager function, with the mask narrowed."""
    import contextlib

    ids, _ = _inputs(batch=1, length=11)
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5]])
    cu = torch.tensor([0, 5, 11], dtype=torch.int32)
    eager, ours = tiny_model("gpt-oss-sinks", "eager").eval(), tiny_model("gpt-oss-sinks", "attnforge").eval()
    assert "sliding_attention" in ours.config.layer_types
    with torch.no_grad():
        separate = torch.cat([eager(ids[:, :5], use_cache=False).logits, eager(ids[:, 5:], use_cache=False).logits],
                             dim=1)
        with attnforge.use_backend(forced) if forced else contextlib.nullcontext():
            got = ours(ids, position_ids=positions, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=6,
                       max_length_k=6, use_cache=False).logits
    assert _max_diff(got, separate) <= TOL


@pytest.mark.parametrize("additive", [False, True])
def test_a_masked_call_with_cu_seq_lens_sees_its_own_sequence_only(additive: bool) -> None:
    """A mask (bool or additive) beside ``cu_seq_lens``: both apply, each sequence alone under the mask's window."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    q, k, v = (torch.randn(1, 2, 7, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    mask = _mask(7, sliding_window_causal_mask_function(3))
    if additive:
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    module = torch.nn.Module().eval()
    got, _ = tf_integration.attention_forward(module, q, k, v, mask, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                                              max_length_q=4, max_length_k=4)
    parts = [tf_integration.attention_forward(module, q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], None,
                                              sliding_window=3)[0] for a, b in ((0, 3), (3, 7))]
    assert _max_diff(got, torch.cat(parts, dim=1)) <= 1e-6


#: model classes that compute attention in their own code in transformers 5.24 (measured 2026-12-01 over every
#: causal LM class built tiny: on a left-padded batch XGLM's logits were 0.03 off eager, MPT crashed on a None mask
#: and Falcon raised KeyError 'attnforge'), with a config small enough to build
_UNROUTED = {
    "xglm": ("XGLMConfig", "XGLMForCausalLM", {"vocab_size": VOCAB, "d_model": 32, "ffn_dim": 64, "num_layers": 2,
                                               "attention_heads": 4}),
    "mpt": ("MptConfig", "MptForCausalLM", {"vocab_size": VOCAB, "d_model": 32, "n_layers": 2, "n_heads": 4}),
}
#: Falcon computed attention in its own code up to transformers 5.24 and routes it through ``AttentionInterface``
#: since 5.25, without the ``_supports_attention_backend`` flag (both checked below, each where it holds)
_FALCON_ROUTES = Version(transformers.__version__) >= Version("5.25")
_FALCON = ("FalconConfig", "FalconForCausalLM", {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2,
                                                 "num_attention_heads": 4})
if not _FALCON_ROUTES:
    _UNROUTED["falcon"] = _FALCON


@pytest.mark.parametrize("name", sorted(_UNROUTED))
def test_a_model_that_does_not_route_its_attention_refuses_attnforge_instead_of_computing_wrong(name: str) -> None:
    """transformers lets any registered name through at load: such a model never called attnforge and got SDPA-style
    masks in its own eager code. Refused at load, with what to use instead; ``set_attn_implementation`` on an eager
    one is transformers' own refusal (it keeps eager)."""
    config_cls, model_cls, kwargs = _UNROUTED[name]
    config = getattr(transformers, config_cls)(**kwargs)
    cls = getattr(transformers, model_cls)
    assert not tf_integration.routes_attention(cls)
    with pytest.raises(ValueError, match="computes attention in its own code") as err:
        cls._from_config(config, attn_implementation="attnforge")
    assert "patch_sdpa" in str(err.value)
    model = cls._from_config(config, attn_implementation="eager")
    model.set_attn_implementation("attnforge")  # transformers itself keeps such a model's implementation (a warning)
    assert model.config._attn_implementation == "eager"


_ROUTED_WITHOUT_FLAG = {
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", {"vocab_size": VOCAB, "hidden_size": 32,
                                                           "intermediate_size": 64, "num_hidden_layers": 2,
                                                           "num_attention_heads": 4, "num_key_value_heads": 2}),
    "falcon": _FALCON,
}


@pytest.mark.parametrize("name", [
    "stablelm",
    pytest.param("falcon", marks=pytest.mark.skipif(not _FALCON_ROUTES, reason="routes since transformers 5.25")),
])
def test_a_model_that_routes_without_the_flag_still_takes_attnforge(name: str) -> None:
    """StableLM's class (and Falcon's since transformers 5.25) lacks ``_supports_attention_backend`` yet calls
    ``ALL_ATTENTION_FUNCTIONS``: it is served, one call a layer, with the default's logits (left padding too)."""
    config_cls, model_cls, kwargs = _ROUTED_WITHOUT_FLAG[name]
    cls = getattr(transformers, model_cls)
    assert not cls.is_backend_compatible() and tf_integration.routes_attention(cls)
    torch.manual_seed(0)
    model = cls._from_config(getattr(transformers, config_cls)(**kwargs), attn_implementation="attnforge").eval()
    # its own config: _from_config sets the implementation on the config object it is given
    default = cls._from_config(getattr(transformers, config_cls)(**kwargs), attn_implementation="sdpa").eval()
    default.load_state_dict(model.state_dict())
    ids, mask = _inputs(length=7)
    seen: list[int] = []
    original = tf_integration.attention_forward
    transformers.AttentionInterface.register("attnforge", lambda *a, **k: seen.append(1) or original(*a, **k))
    try:
        with torch.no_grad():
            got = model(input_ids=ids, attention_mask=mask).logits
            want = default(input_ids=ids, attention_mask=mask).logits
    finally:
        tf_integration.register()
    assert len(seen) == 2  # one call a layer
    assert _max_diff(got, want, mask.bool()) < 1e-4
    assert all(tf_integration.routes_attention(getattr(transformers, MODELS[n][1])) for n in MODELS)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch internals imported by dynamo
@pytest.mark.parametrize("name", ["llama", "qwen2-sliding-window", "gemma2-softcap-sliding-window", "gpt-oss-sinks"])
def test_a_model_compiled_fullgraph_on_its_first_forward_matches_eager(name: str) -> None:
    """``torch.compile(model, fullgraph=True)`` whose first forward in the process is the traced one (nothing
    decided yet): every layer's masked call is one opaque op (``attnforge::attention_features``). It failed on the
    first layer ("Unsupported context manager": the decision's records lock; for Gemma-2 also its exact-only
    check's ContextVar and, for a padded batch, the kept padding's version counter)."""
    ids, mask = _inputs()
    eager, ours = tiny_model(name, "eager").eval(), tiny_model(name, "attnforge").eval()
    torch._dynamo.reset()
    compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        got = compiled(ids, attention_mask=mask).logits
        want = eager(ids, attention_mask=mask).logits
    assert _max_diff(got, want, mask) <= TOL


_DSA = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 4,
        "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "kv_lora_rank": 16,
        "q_lora_rank": 16, "qk_rope_head_dim": 4, "qk_nope_head_dim": 8, "v_head_dim": 8, "head_dim": 4,
        "index_topk": 4, "index_head_dim": 8, "index_n_heads": 2, "first_k_dense_replace": 1,
        "max_position_embeddings": 64, "pad_token_id": 0}


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
def test_a_sparse_attention_model_keeps_its_top_k_keys(model_type: str) -> None:
    """DeepSeek Sparse Attention (its indexer keeps 4 of 12 keys a query): the model folds the top-k into the mask only
    for "eager" and "sdpa" and passes ``indices`` to any other implementation; attnforge folds them in the same way
    (found by an integration fuzz, 2026-12-03: handed to the eager function, which reads no ``indices``, every key
    was attended, logits 0.11 off)."""
    import copy

    from transformers import AutoConfig, AutoModelForCausalLM

    if model_type not in transformers.models.auto.configuration_auto.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type}")
    cfg = AutoConfig.for_model(model_type, **_DSA)
    ids, mask = _inputs(length=12)
    ids = ids % 120 + 3
    logits, tokens = {}, {}
    for impl in ("sdpa", "attnforge"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl).eval()
        with torch.no_grad():
            logits[impl] = model(input_ids=ids, attention_mask=mask).logits
            tokens[impl] = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False,
                                          pad_token_id=0).tolist()
    assert _max_diff(logits["attnforge"], logits["sdpa"], mask) <= TOL
    assert tokens["attnforge"] == tokens["sdpa"]


def test_indices_that_are_not_top_k_keys_are_refused() -> None:
    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    with pytest.raises(DispatchError, match="sparse-attention"):
        tf_integration.attention_forward(torch.nn.Module(), q, k, v, None, indices=torch.zeros(2, 6))


def test_gemma4_kv_shared_layers_keep_their_last_queries_causal() -> None:
    """Gemma 4 slices its KV-shared layers' queries to the last ``logits_to_keep`` positions after its masks were made
    (transformers turns that off for "sdpa" alone when a mask was skipped): those queries are the last of the keys,
    bottom-right causal (found by an integration fuzz, 2026-12-03: taken for an empty static cache's top-left
    alignment, logits 0.31 off)."""
    import copy

    from transformers import AutoConfig, AutoModelForCausalLM

    if "gemma4_text" not in transformers.models.auto.configuration_auto.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no Gemma 4")
    cfg = AutoConfig.for_model(
        "gemma4_text", vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=8, hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=128, sliding_window=64, num_kv_shared_layers=2, max_position_embeddings=128,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])
    ids = torch.randint(3, 120, (2, 12), generator=torch.Generator().manual_seed(0))
    logits = {}
    for impl in ("sdpa", "attnforge"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl).eval()
        with torch.no_grad():
            logits[impl] = model(input_ids=ids, logits_to_keep=3).logits
    assert _max_diff(logits["attnforge"], logits["sdpa"]) <= TOL


def test_no_mask_with_fewer_queries_than_keys_aligns_by_where_the_queries_are() -> None:
    """No mask, Sq < Sk, causal: positions of the queries alone (an empty static cache's prefill: the first Sq keys
    exist, top-left as transformers' SDPA function runs it); positions of every key (queries sliced from the end
    after the masks were made): bottom-right."""
    import torch.nn.functional as F  # noqa: N812

    q, k, v = (torch.randn(1, 2, n, 8, generator=torch.Generator().manual_seed(i)) for i, n in enumerate((3, 8, 8)))
    module = torch.nn.Module().eval()
    top_left, _ = tf_integration.attention_forward(module, q, k, v, None, position_ids=torch.arange(3)[None])
    want = F.scaled_dot_product_attention(q, k[:, :, :3], v[:, :, :3], is_causal=True).transpose(1, 2)
    assert _max_diff(top_left, want) <= 1e-6
    bottom_right, _ = tf_integration.attention_forward(module, q, k, v, None, position_ids=torch.arange(8)[None])
    mask = torch.ones(3, 8, dtype=torch.bool).tril(diagonal=5)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)
    assert _max_diff(bottom_right, want) <= 1e-6
