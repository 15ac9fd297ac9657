"""The integrations driven as users drive them on CPU (float32 and bfloat16), against each framework's default: a
hunt for wrong results and crashes beyond ``test_transformers.py`` / ``test_diffusers.py`` (2026-12-03).

transformers: ``generate`` with left and right padding, beam search, a static cache, ``use_cache=False``, batch 1
and several, prompts shorter and longer than a sliding window; ``output_attentions``; a training step with gradient
checkpointing (reentrant or not); ``torch.no_grad`` against ``torch.inference_mode``; bfloat16 weights; packed
sequences as ``DataCollatorWithFlattening`` makes them; encoder and encoder-decoder models (BERT, T5, BART,
Whisper); models transformers runs only eagerly (PegasusX, BigBirdPegasus, NLLB-MoE) and models that pick attention
classes by name (GIT, SAM). diffusers: joint attention with masks (QwenImage, Chroma, Flux) through
``set_attention_backend`` and the ``attention_backend`` context manager. ``patch_sdpa`` nested, in threads.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest
import torch

import attnforge

transformers = pytest.importorskip("transformers")
from attnforge.integrations import transformers as tf_integration  # noqa: E402
from tests.integrations._models import MODELS, VOCAB, tiny_model  # noqa: E402

TOL = 1e-4
#: bfloat16 against the default's own bfloat16: both round, at different places
TOL_BF16 = 0.05
#: tiny models beside :data:`MODELS`: Mistral's sliding window (4 tokens) without Qwen2's per-layer switch
EXTRA = {"mistral-sliding-window": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 4})}


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """``"attnforge"`` known to transformers; :data:`EXTRA` models buildable by ``tiny_model``."""
    tf_integration.register()
    for name, entry in EXTRA.items():
        monkeypatch.setitem(MODELS, name, entry)


def _default(name: str) -> str:
    """The implementation transformers runs a model with (Gemma 2 and GPT-OSS refuse SDPA)."""
    return "eager" if name.startswith(("gemma2", "gpt-oss")) else "sdpa"


def _serving(name: str) -> Any:
    """Gemma 2's softcap and GPT-OSS's sinks only attnforge's exact math serves here (unforced, their calls go to the
    model's eager function): forced, so that the comparison is of attnforge's answer (test_transformers.py's
    ``EXACT_ONLY``)."""
    return attnforge.use_backend("exact") if name.startswith(("gemma2", "gpt-oss")) else contextlib.nullcontext()


def _inputs(batch: int = 2, length: int = 6, pad: int = 2, *, right: bool = False) -> tuple[torch.Tensor, ...]:
    """Token ids ``[batch, length]`` and a padding mask hiding ``pad`` tokens of row 0 (left, or right)."""
    ids = torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(batch, length, dtype=torch.long)
    hidden = slice(length - pad, length) if right else slice(0, pad)
    mask[0, hidden] = 0
    return ids, mask


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).abs().max())


# --- transformers: generate ------------------------------------------------------------------------------------------

_GENERATE = [
    pytest.param("llama", {}, {}, id="llama-left-padding"),
    pytest.param("llama", {}, {"right": True}, id="llama-right-padding"),
    pytest.param("llama", {"num_beams": 3}, {}, id="llama-beams"),
    pytest.param("llama", {"cache_implementation": "static"}, {}, id="llama-static-cache"),
    pytest.param("llama", {"use_cache": False}, {}, id="llama-no-cache"),
    pytest.param("llama", {}, {"batch": 1, "pad": 0}, id="llama-batch-1"),
    pytest.param("mistral-sliding-window", {}, {"length": 3}, id="mistral-prompt-inside-window"),
    pytest.param("mistral-sliding-window", {"num_beams": 2}, {"length": 11, "pad": 5}, id="mistral-beams-long"),
    pytest.param("mistral-sliding-window", {"cache_implementation": "static"}, {"length": 11, "pad": 5},
                 id="mistral-static-long"),
    pytest.param("gemma2-softcap-sliding-window", {"cache_implementation": "static"}, {"length": 11, "pad": 5},
                 id="gemma2-static-long"),
    pytest.param("gemma2-softcap-sliding-window", {"num_beams": 2, "use_cache": False}, {"length": 3, "pad": 1},
                 id="gemma2-beams-no-cache"),
    pytest.param("gpt-oss-sinks", {}, {"batch": 3, "length": 9, "pad": 4, "right": True}, id="gpt-oss-right-padding"),
]


@pytest.mark.parametrize(("name", "generation", "shape"), _GENERATE)
def test_generate_gives_the_defaults_tokens_and_logits(name: str, generation: dict[str, Any],
                                                       shape: dict[str, Any], served: list[Any]) -> None:
    ids, mask = _inputs(**shape)
    kwargs = {"attention_mask": mask, "max_new_tokens": 5, "do_sample": False, "pad_token_id": 0,
              "return_dict_in_generate": True, "output_logits": True, **generation}
    want = tiny_model(name, _default(name)).eval().generate(ids, **kwargs)
    with _serving(name):
        got = tiny_model(name, "attnforge").eval().generate(ids, **kwargs)
    assert got.sequences.tolist() == want.sequences.tolist()
    assert max(_max_diff(a, b) for a, b in zip(got.logits, want.logits, strict=True)) <= TOL
    assert served


@pytest.mark.parametrize("name", ["llama", "mistral-sliding-window"])
def test_generate_with_output_attentions_returns_eagers_weights(name: str) -> None:
    """``output_attentions=True`` needs the weights, which no kernel returns: those calls go to the model's eager
    function, and ``generate`` returns its weights, step by step."""
    ids, mask = _inputs(length=7, pad=2)
    kwargs = {"attention_mask": mask, "max_new_tokens": 3, "do_sample": False, "pad_token_id": 0,
              "return_dict_in_generate": True, "output_attentions": True}
    want = tiny_model(name, "eager").eval().generate(ids, **kwargs)
    got = tiny_model(name, "attnforge").eval().generate(ids, **kwargs)
    assert got.sequences.tolist() == want.sequences.tolist()
    pairs = [(a, b) for step_a, step_b in zip(got.attentions, want.attentions, strict=True)
             for a, b in zip(step_a, step_b, strict=True)]
    assert pairs and max(_max_diff(a, b) for a, b in pairs) <= 1e-5


@pytest.mark.parametrize("name", ["llama", "mistral-sliding-window"])
def test_no_grad_and_inference_mode_give_the_same_logits_and_tokens(name: str) -> None:
    """The same model, the same padded inputs under ``torch.no_grad`` and ``torch.inference_mode`` in turn (kept
    derivations of masks are per mask object and version; an inference tensor has none)."""
    ours, default = tiny_model(name, "attnforge").eval(), tiny_model(name, _default(name)).eval()
    kwargs = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    for mode, pad in ((torch.inference_mode, 2), (torch.no_grad, 2), (torch.inference_mode, 0), (torch.no_grad, 3)):
        ids, mask = _inputs(length=8, pad=pad)
        with mode():
            want, got = default(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
            assert _max_diff(got[mask.bool()], want[mask.bool()]) <= TOL
            assert (ours.generate(ids, attention_mask=mask, **kwargs).tolist()
                    == default.generate(ids, attention_mask=mask, **kwargs).tolist())


@pytest.mark.parametrize("name", ["llama", "mistral-sliding-window", "gemma2-softcap-sliding-window"])
def test_bfloat16_weights_give_the_defaults_logits(name: str) -> None:
    ids, mask = _inputs(length=11, pad=5)
    default = tiny_model(name, _default(name)).eval().to(torch.bfloat16)
    ours = tiny_model(name, "attnforge").eval().to(torch.bfloat16)
    with torch.no_grad(), _serving(name):
        want, got = default(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
    assert got.dtype == want.dtype == torch.bfloat16
    assert _max_diff(got[mask.bool()], want[mask.bool()]) <= TOL_BF16


# --- transformers: training ------------------------------------------------------------------------------------------

def _labels(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Causal-LM labels that no padding position predicts (the label of position t is predicted at t - 1): a padding
    query sees no key, and the exact math's zero row and eager's uniform one are both meaningless."""
    return ids.masked_fill(torch.nn.functional.pad(mask, (1, 0), value=1)[:, :-1] == 0, -100)


def _grads(model: Any, **inputs: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss = model(**inputs).loss
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["llama", "gemma2-softcap-sliding-window"])
@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_gradient_checkpointing_gives_the_defaults_gradients(name: str, reentrant: bool,
                                                             served: list[Any]) -> None:
    """A training step with activation (gradient) checkpointing (each layer's forward runs again in backward, its
    attention call with it) against the default without checkpointing. ``activation_checkpointing_enable`` is
    transformers 5.24's name for ``gradient_checkpointing_enable`` (a deprecated alias of it, which warns)."""
    ids, mask = _inputs(length=9, pad=3)
    labels = _labels(ids, mask)
    want_loss, want = _grads(tiny_model(name, _default(name)).train(), input_ids=ids, attention_mask=mask,
                             labels=labels)
    model = tiny_model(name, "attnforge").train()
    model.activation_checkpointing_enable({"use_reentrant": reentrant})
    with _serving(name):
        got_loss, got = _grads(model, input_ids=ids, attention_mask=mask, labels=labels, use_cache=False)
    assert _max_diff(got_loss, want_loss) <= TOL
    assert got.keys() == want.keys()
    assert max(_max_diff(got[n], want[n]) for n in want) <= TOL
    assert len(served) == 2 * 2  # two layers, each forward run twice (once more in backward)


_PACKED = [[5, 17, 33, 8, 90], [41, 7, 7, 62, 13, 3, 88, 29, 50], [71, 24, 9]]


@pytest.mark.parametrize("name", ["llama", "mistral-sliding-window", "gemma2-softcap-sliding-window"])
@pytest.mark.parametrize("flash_kwargs", [False, True], ids=["position-ids", "cu-seq-lens"])
def test_packed_sequences_of_the_flattening_collator_are_each_alone(name: str, flash_kwargs: bool) -> None:
    """``DataCollatorWithFlattening`` packs a batch into one row with ``position_ids`` restarting per sequence (and,
    with ``return_flash_attn_kwargs``, FlashAttention's ``cu_seq_lens_q/k``): each sequence's logits are its own
    forward's, and a training step's gradients those of the default on the same packed row. ``use_cache=False`` as
    a trainer passes it: with a cache transformers does not read packing from ``position_ids`` (its SDPA then mixes
    the sequences, while attnforge's ``cu_seq_lens`` call keeps them apart)."""
    from transformers import DataCollatorWithFlattening

    batch = DataCollatorWithFlattening(return_tensors="pt", return_flash_attn_kwargs=flash_kwargs)(
        [{"input_ids": s} for s in _PACKED])
    ours = tiny_model(name, "attnforge").eval()
    with torch.no_grad(), _serving(name):
        alone = torch.cat([ours(torch.tensor([s]), use_cache=False).logits[0] for s in _PACKED])
        packed = ours(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits[0]
    assert _max_diff(packed, alone) <= TOL
    default = tiny_model(name, _default(name)).train()
    want_loss, want = _grads(default, input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                             labels=batch["labels"], use_cache=False)
    with _serving(name):
        got_loss, got = _grads(tiny_model(name, "attnforge").train(), **batch, use_cache=False)
    assert _max_diff(got_loss, want_loss) <= TOL
    assert max(_max_diff(got[n], want[n]) for n in want) <= TOL


def test_cu_seq_lens_over_several_packed_rows_are_read_as_flash_attention_reads_them(served: list[Any]) -> None:
    """FlashAttention-style ``cu_seq_lens_q/k`` index the batch's rows flattened (``[B * S]`` tokens: transformers'
    FlashAttention path reshapes q, k, v to ``[-1, H, D]``), so padding-free rows may be several. attnforge read row 0
    alone and raised "cu_seqlens do not describe the packed tensors: q has 6 rows ... offsets run 0..12" (2026-12-03);
    each sequence is now its own, as the default gives for the same rows packed by ``position_ids``."""
    ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    offsets = torch.tensor([0, 4, 6, 9, 12], dtype=torch.int32)  # row 0: 4 + 2 tokens, row 1: 3 + 3
    positions = torch.tensor([[0, 1, 2, 3, 0, 1], [0, 1, 2, 0, 1, 2]])
    with torch.no_grad():
        want = tiny_model("llama", "sdpa").eval()(ids, position_ids=positions, use_cache=False).logits
        # no position_ids (so no mask: the offsets alone tell the sequences apart); RoPE sees relative positions
        got = tiny_model("llama", "attnforge").eval()(ids, cu_seq_lens_q=offsets, cu_seq_lens_k=offsets,
                                                      max_length_q=4, max_length_k=4, use_cache=False).logits
    assert _max_diff(got, want) <= TOL
    assert served


# --- transformers: encoders and encoder-decoders ---------------------------------------------------------------------

_ENCODERS = {
    "bert": ("BertConfig", "BertForMaskedLM", "sdpa",
             {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
              "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}),
    "t5": ("T5Config", "T5ForConditionalGeneration", "sdpa",
           {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4, "dropout_rate": 0.0,
            "decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": 1}),
    "bart": ("BartConfig", "BartForConditionalGeneration", "sdpa",
             {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
              "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "dropout": 0.0,
              "max_position_embeddings": 64, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
              "decoder_start_token_id": 2, "forced_eos_token_id": None}),
    "whisper": ("WhisperConfig", "WhisperForConditionalGeneration", "sdpa",
                {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
                 "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "num_mel_bins": 8,
                 "max_source_positions": 16, "max_target_positions": 32, "pad_token_id": 0, "bos_token_id": 1,
                 "eos_token_id": 2, "decoder_start_token_id": 1, "suppress_tokens": None,
                 "begin_suppress_tokens": None}),
}


def _encoder(name: str, impl: str) -> Any:
    config_cls, model_cls, _, kwargs = _ENCODERS[name]
    config = getattr(transformers, config_cls)(vocab_size=VOCAB, **kwargs)
    torch.manual_seed(0)
    return getattr(transformers, model_cls)._from_config(config, attn_implementation=impl)


def test_an_encoders_padded_logits_and_gradients_are_the_defaults(served: list[Any]) -> None:
    """BERT: bidirectional, a ``[B, S]`` padding mask, a training step (masked LM)."""
    ids, mask = _inputs(length=9, pad=3, right=True)
    labels = ids.masked_fill(mask == 0, -100)
    want_loss, want = _grads(_encoder("bert", "sdpa").train(), input_ids=ids, attention_mask=mask, labels=labels)
    got_loss, got = _grads(_encoder("bert", "attnforge").train(), input_ids=ids, attention_mask=mask, labels=labels)
    assert _max_diff(got_loss, want_loss) <= TOL
    assert max(_max_diff(got[n], want[n]) for n in want) <= TOL
    assert served


@pytest.mark.parametrize("name", ["t5", "bart", "whisper"])
@pytest.mark.parametrize("generation", [{}, {"num_beams": 2}, {"cache_implementation": "static"}],
                         ids=["greedy", "beams", "static-cache"])
def test_an_encoder_decoders_generate_is_the_defaults(name: str, generation: dict[str, Any],
                                                      served: list[Any]) -> None:
    """Self-attention with a cache, cross-attention over a padded encoder output; T5's relative position bias
    (``position_bias``, an additive mask)."""
    ids, mask = _inputs(length=9, pad=3, right=True)
    inputs = ({"input_features": torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(3))}
              if name == "whisper" else {"input_ids": ids, "attention_mask": mask})
    kwargs = {"max_new_tokens": 5, "do_sample": False, "return_dict_in_generate": True, "output_scores": True,
              **generation}
    want = _encoder(name, _ENCODERS[name][2]).eval().generate(**inputs, **kwargs)
    got = _encoder(name, "attnforge").eval().generate(**inputs, **kwargs)
    assert got.sequences.tolist() == want.sequences.tolist()
    # suppressed tokens score -inf in both (a difference of NaN): clamped
    assert max(_max_diff(a.clamp(min=-1e4), b.clamp(min=-1e4))
               for a, b in zip(got.scores, want.scores, strict=True)) <= TOL
    assert served


# --- transformers: models transformers runs only eagerly, models that pick attention classes by name ------------------

_SEQ2SEQ = {"vocab_size": VOCAB, "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
            "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
            "max_position_embeddings": 64, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
            "decoder_start_token_id": 1}
#: model classes transformers refuses ``"sdpa"`` for, for reasons other than softcap or sinks (transformers 5.24):
#: their decoders' self-attention modules say ``is_causal=False`` and rely on the causal mask, which transformers'
#: SDPA mask skips (None: "plainly causal"); NLLB-MoE's router also reads the mask as eager's additive one
_EAGER_ONLY = {
    "pegasus-x": ("PegasusXConfig", "PegasusXForConditionalGeneration",
                  {**_SEQ2SEQ, "block_size": 4, "num_global_tokens": 2, "stagger_local_blocks": False}),
    "bigbird-pegasus": ("BigBirdPegasusConfig", "BigBirdPegasusForConditionalGeneration",
                        {**_SEQ2SEQ, "attention_type": "original_full"}),
    "bigbird-pegasus-causal-lm": ("BigBirdPegasusConfig", "BigBirdPegasusForCausalLM",
                                  {**_SEQ2SEQ, "attention_type": "original_full"}),
    "nllb-moe": ("NllbMoeConfig", "NllbMoeForConditionalGeneration",
                 {**_SEQ2SEQ, "num_experts": 2, "expert_capacity": 8, "router_ignore_padding_tokens": False}),
}


@pytest.mark.parametrize("name", sorted(_EAGER_ONLY))
def test_a_model_transformers_runs_only_eagerly_gets_eagers_masks(name: str, served: list[Any]) -> None:
    """transformers refuses ``"sdpa"`` for these: their decoders' self-attention modules say ``is_causal=False`` and
    so SDPA's skipped causal mask made them bidirectional, and NLLB-MoE's router reads the mask as eager's. Through
    ``"attnforge"`` they got SDPA's masks all the same: logits 0.006-0.06 off eager, padded or not (2026-12-03). They
    get eager's masks now: eager's logits, every attention call served by attnforge."""
    config_cls, model_cls, kwargs = _EAGER_ONLY[name]
    config = getattr(transformers, config_cls)(**kwargs)
    ids, mask = _inputs(length=8, pad=2, right=True)
    extra = {} if model_cls.endswith("CausalLM") else {"decoder_input_ids": ids[:, :5]}
    outs = {}
    for impl in ("eager", "attnforge"):
        torch.manual_seed(0)
        model = getattr(transformers, model_cls)._from_config(config, attn_implementation=impl).eval()
        with torch.no_grad():
            outs[impl] = [model(input_ids=ids, attention_mask=m, **extra).logits for m in (mask, None)]
    for got, want in zip(outs["attnforge"], outs["eager"], strict=True):
        assert _max_diff(got, want) <= 1e-5
    assert served


#: encoders transformers runs only eagerly whose attention modules carry no ``is_causal`` (transformers 5.24)
_EAGER_ONLY_ENCODERS = {
    "splinter": ("SplinterConfig", "SplinterModel"),
    "align-text": ("AlignTextConfig", "AlignTextModel"),
    "clap-text": ("ClapTextConfig", "ClapTextModel"),
}


@pytest.mark.parametrize("name", sorted(_EAGER_ONLY_ENCODERS))
def test_an_eager_only_encoder_without_is_causal_stays_bidirectional(name: str, served: list[Any]) -> None:
    """Splinter's, ALIGN's and CLAP's text self-attention modules have no ``is_causal``; for an unpadded batch their
    bidirectional mask is skipped (None), which eager's function reads as "nothing hidden" and
    :func:`attention_forward` read as causal (transformers' SDPA default): hidden states 0.03-0.6 off eager
    (2026-12-03). Eager's masks for these models are built whole, never skipped."""
    config_cls, model_cls = _EAGER_ONLY_ENCODERS[name]
    config = getattr(transformers, config_cls)(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                               num_attention_heads=4, intermediate_size=64,
                                               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ids, mask = _inputs(length=9, pad=3, right=True)
    outs = {}
    for impl in ("eager", "attnforge"):
        torch.manual_seed(0)
        model = getattr(transformers, model_cls)._from_config(config, attn_implementation=impl).eval()
        with torch.no_grad():
            outs[impl] = [model(input_ids=ids, attention_mask=m).last_hidden_state for m in (None, mask)]
    for got, want in zip(outs["attnforge"], outs["eager"], strict=True):
        assert _max_diff(got, want) <= 1e-5
    assert served


def test_a_model_whose_sdpa_refusal_is_softcap_or_sinks_keeps_sdpas_masks() -> None:
    """Gemma 2 (softcap) and GPT-OSS (sinks): transformers refuses ``"sdpa"`` only for a feature ``attention()``
    serves, so they keep SDPA's masks (bool, or none for a plainly causal call), which the fast routes take."""
    seen: list[Any] = []
    real = tf_integration.attention_forward
    transformers.AttentionInterface.register(
        "attnforge", lambda module, q, k, v, mask, **kw: seen.append(mask) or real(module, q, k, v, mask, **kw))
    try:
        ids, mask = _inputs(length=7, pad=2)
        for name in ("gemma2-softcap-sliding-window", "gpt-oss-sinks"):
            with torch.no_grad():
                tiny_model(name, "attnforge").eval()(ids, attention_mask=mask)
                tiny_model(name, "attnforge").eval()(ids[1:, :3])
    finally:
        tf_integration.register()
    assert seen and all(m is None or m.dtype == torch.bool for m in seen)
    assert any(m is None for m in seen)


@pytest.mark.parametrize(("config_cls", "model_cls"), [("GitConfig", "GitForCausalLM"), ("SamConfig", "SamModel")],
                         ids=["git", "sam"])
def test_a_model_that_picks_attention_classes_by_name_is_refused_not_a_key_error(config_cls: str,
                                                                                 model_cls: str) -> None:
    """GIT's text layers and SAM's vision encoder take their attention class from a dict keyed by the implementation
    name (``"eager"``, ``"sdpa"``): loading them with ``"attnforge"`` raised ``KeyError: 'attnforge'`` (2026-12-03),
    as Falcon did before it was refused. Refused the same way, with what to use instead."""
    cls = getattr(transformers, model_cls)
    assert not tf_integration.routes_attention(cls)
    with torch.device("meta"), pytest.raises(ValueError, match="computes attention in its own code") as err:
        cls._from_config(getattr(transformers, config_cls)(), attn_implementation="attnforge")
    assert "patch_sdpa" in str(err.value)


# --- patch_sdpa -------------------------------------------------------------------------------------------------------

def test_patch_sdpa_nested_in_threads_gives_sdpas_logits_and_restores_it(served: list[Any]) -> None:
    import torch.nn.functional as F  # noqa: N812

    original = F.scaled_dot_product_attention
    model = tiny_model("llama", "sdpa").eval()
    ids, mask = _inputs(length=9, pad=3)
    with torch.no_grad():
        want = model(ids, attention_mask=mask).logits
    errors: list[str] = []
    start = threading.Barrier(4)

    def work(i: int) -> None:
        try:
            start.wait()
            for j in range(3):
                inner = attnforge.patch_sdpa() if (i + j) % 2 else contextlib.nullcontext()
                with attnforge.patch_sdpa(), inner, torch.no_grad():
                    got = model(ids, attention_mask=mask).logits
                if _max_diff(got[mask.bool()], want[mask.bool()]) > TOL:
                    errors.append(f"thread {i} round {j}: logits differ")
        except Exception as e:  # a thread's failure is this test's
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert F.scaled_dot_product_attention is original
    assert served


# --- diffusers --------------------------------------------------------------------------------------------------------

def _flux_masked() -> tuple[Any, dict[str, Any]]:
    """Flux with a joint-attention mask (``joint_attention_kwargs={"attention_mask": [B, S_txt + S_img]}``)."""
    import diffusers

    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(4, 4, 8))
    img_ids = torch.zeros(16, 3)
    img_ids[:, 1], img_ids[:, 2] = torch.arange(16) // 4, torch.arange(16) % 4
    joint = torch.ones(2, 21, dtype=torch.bool)
    joint[0, 3:5] = False  # row 0's last two text tokens are padding
    return model, {"hidden_states": torch.randn(2, 16, 4), "encoder_hidden_states": torch.randn(2, 5, 32),
                   "pooled_projections": torch.randn(2, 32), "timestep": torch.tensor([0.5, 0.7]),
                   "img_ids": img_ids, "txt_ids": torch.zeros(5, 3),
                   "joint_attention_kwargs": {"attention_mask": joint}}


def _qwen_image() -> tuple[Any, dict[str, Any]]:
    """QwenImage: joint attention over text and image tokens with the text's padding mask."""
    import diffusers

    torch.manual_seed(0)
    model = diffusers.QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, axes_dims_rope=(4, 6, 6))
    text_mask = torch.ones(2, 7, dtype=torch.long)
    text_mask[0, 4:] = 0
    return model, {"hidden_states": torch.randn(2, 16, 16), "encoder_hidden_states": torch.randn(2, 7, 32),
                   "encoder_hidden_states_mask": text_mask, "timestep": torch.tensor([0.5, 0.7]),
                   "img_shapes": [[(1, 4, 4)]] * 2}


def _chroma() -> tuple[Any, dict[str, Any]]:
    """Chroma: a ``[B, S_txt + S_img]`` attention mask, expanded to ``[B, 1, S, S]`` by the model."""
    import diffusers

    torch.manual_seed(0)
    model = diffusers.ChromaTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, axes_dims_rope=(4, 4, 8), approximator_num_channels=8, approximator_hidden_dim=32,
        approximator_layers=1)
    img_ids = torch.zeros(16, 3)
    img_ids[:, 1], img_ids[:, 2] = torch.arange(16) // 4, torch.arange(16) % 4
    joint = torch.ones(2, 21, dtype=torch.bool)
    joint[0, 3:5] = False
    return model, {"hidden_states": torch.randn(2, 16, 4), "encoder_hidden_states": torch.randn(2, 5, 32),
                   "timestep": torch.tensor([0.5, 0.7]), "img_ids": img_ids, "txt_ids": torch.zeros(5, 3),
                   "attention_mask": joint}


@pytest.fixture
def diffusers_backend() -> Any:
    """The ``"attnforge"`` diffusers backend registered; diffusers' process-wide active backend put back after."""
    pytest.importorskip("diffusers")
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry as registry

    from attnforge.integrations import diffusers as df_integration

    df_integration.register()
    active = registry._active_backend
    yield
    registry._active_backend = active


@pytest.fixture
def masks_served(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The ``attn_mask`` of every call :func:`attnforge.attention` serves (None where it had none)."""
    from attnforge.dispatch import runtime

    masks: list[Any] = []
    real = runtime.attention

    def spy(*args: Any, **kwargs: Any) -> Any:
        masks.append(kwargs.get("attn_mask"))
        return real(*args, **kwargs)

    monkeypatch.setattr(runtime, "attention", spy)
    return masks


@pytest.mark.usefixtures("diffusers_backend")
@pytest.mark.filterwarnings("ignore:`FluxPosEmbed` is deprecated:FutureWarning")  # diffusers' Chroma, its own import
@pytest.mark.parametrize("build", [_flux_masked, _qwen_image, _chroma], ids=["flux-masked", "qwen-image", "chroma"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("how", ["set_attention_backend", "attention_backend"])
def test_joint_attention_with_masks_matches_the_native_backend(build: Any, dtype: torch.dtype, how: str,
                                                               masks_served: list[Any]) -> None:
    """The masks diffusers passes with joint attention (text padding inside the joint sequence), through
    ``set_attention_backend("attnforge")`` and through diffusers' ``attention_backend("attnforge")`` context
    manager, against diffusers' native backend."""
    from diffusers.models.attention_dispatch import attention_backend

    model, inputs = build()
    model = model.eval().to(dtype)
    inputs = {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        want = model(**inputs).sample
        if how == "set_attention_backend":
            model.set_attention_backend("attnforge")
            got = model(**inputs).sample
            model.set_attention_backend("native")
        else:
            with attention_backend("attnforge"):
                got = model(**inputs).sample
    assert got.dtype == want.dtype
    assert _max_diff(got, want) <= (1e-5 if dtype == torch.float32 else 2e-2)
    assert masks_served and all(m is not None for m in masks_served)  # every joint call carried the padding
