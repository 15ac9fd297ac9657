"""Shapes from a Hugging Face config.json: GQA, MLA's Dv, sliding windows, nested text configs, bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnforge.bench.models import model_config_shapes, read_model_config
from attnforge.errors import UsageError
from attnforge.types.shapes import Mode


def _write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_mistral_sliding_window_caps_the_decode_keys_not_the_prefill_and_nested_text_config_is_read(
        tmp_path: Path) -> None:
    # trimmed from mistralai/Mistral-7B-v0.1 config.json, nested as a multimodal model nests its text model
    cfg = {"model_type": "llava", "text_config": {"model_type": "mistral", "hidden_size": 4096,
                                                  "num_attention_heads": 32, "num_key_value_heads": 8,
                                                  "sliding_window": 2048}}
    model = read_model_config(_write(tmp_path, cfg))
    assert (model.name, model.heads_q, model.heads_kv, model.head_dim, model.sliding_window) == (
        "mistral", 32, 8, 128, 2048)
    shapes = model_config_shapes(model, dtype="bfloat16", batch=1, seqlens=(), modes=(Mode.FWD, Mode.FWD_BWD),
                                 cpu=False)
    # a 4096-token prompt is a 4096 x 4096 call whose window hides keys (warm-up adds that variant), not a
    # 2048-token one; the decode step's sliding cache holds the last 2048 keys
    assert {(s.mode, s.seqlen_q, s.seqlen_k) for s in shapes} == {
        (Mode.FWD, 1024, 1024), (Mode.FWD, 4096, 4096), (Mode.FWD_BWD, 1024, 1024), (Mode.FWD_BWD, 4096, 4096),
        (Mode.FWD, 512, 2048), (Mode.FWD, 1, 2048)}
    assert all(s.heads_q == 32 and s.heads_kv == 8 for s in shapes)


def test_gemma_head_dim_wins_over_hidden_size(tmp_path: Path) -> None:
    # google/gemma-7b: hidden 3072, 16 heads of 256 (not 3072 / 16 = 192)
    model = read_model_config(_write(tmp_path, {"hidden_size": 3072, "num_attention_heads": 16, "head_dim": 256}))
    assert (model.head_dim, model.heads_kv) == (256, 16)


@pytest.mark.parametrize(("doc", "message"), [
    pytest.param([1, 2], "not a JSON object", id="not-an-object"),
    pytest.param({"hidden_size": 4096}, "no num_attention_heads", id="not-a-transformer"),
    pytest.param({"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 5},
                 "inconsistent attention sizes", id="heads-not-a-multiple"),
    pytest.param({"hidden_size": 4096, "num_attention_heads": "32"}, "must be a positive integer", id="string"),
    pytest.param({"num_attention_heads": 32}, "inconsistent attention sizes", id="no-head-dim"),
    # sizes no model has: warmup --model allocated until the machine ran out (CLI fuzz, 2026-12-03)
    pytest.param({"num_attention_heads": 10**9, "head_dim": 10**9}, "larger than any model's", id="huge-heads"),
    pytest.param({"num_attention_heads": 8, "head_dim": 10**9}, "larger than any model's", id="huge-head-dim"),
    pytest.param({"num_attention_heads": 8, "hidden_size": 10**12}, "larger than any model's", id="huge-hidden"),
    pytest.param({"num_attention_heads": 4096, "head_dim": 4096}, "wider than any model's", id="too-wide"),
])
def test_bad_configs_say_what_is_wrong(tmp_path: Path, doc: object, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        read_model_config(_write(tmp_path, doc))


def test_a_file_that_is_not_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{nope", encoding="utf-8")
    with pytest.raises(UsageError, match="is not JSON"):
        read_model_config(path)


def test_diffusers_and_softcap_configs(tmp_path: Path) -> None:
    """A diffusers transformer (Flux: 24 heads of 128, full attention) and Gemma 2's softcap."""
    from attnforge.bench.models import model_config_shapes, read_model_config

    flux = tmp_path / "flux.json"
    flux.write_text('{"_class_name": "FluxTransformer2DModel", "_diffusers_version": "0.30.0", '
                    '"num_attention_heads": 24, "attention_head_dim": 128}', encoding="utf-8")
    model = read_model_config(flux)
    assert (model.heads_q, model.heads_kv, model.head_dim, model.causal) == (24, 24, 128, False)
    shapes = model_config_shapes(model, dtype="bfloat16", batch=1, seqlens=(4608,), modes=(Mode.FWD,), cpu=False)
    assert [(s.seqlen_q, s.seqlen_k, s.causal) for s in shapes] == [(4608, 4608, False)]
    gemma = tmp_path / "gemma.json"
    gemma.write_text('{"model_type": "gemma2", "num_attention_heads": 16, "num_key_value_heads": 8, '
                     '"head_dim": 256, "sliding_window": 4096, "attn_logit_softcapping": 50.0}', encoding="utf-8")
    g = read_model_config(gemma)
    assert (g.softcap, g.sliding_window, g.causal) == (50.0, 4096, True)


@pytest.mark.parametrize(("extra", "global_layers"), [
    pytest.param({"model_type": "gpt_oss"}, True, id="gpt-oss-alternates-without-layer-types"),
    pytest.param({"model_type": "llama", "layer_types": ["sliding_attention", "full_attention"]}, True,
                 id="layer-types-with-a-full-layer"),
    pytest.param({"model_type": "llama", "layer_types": ["sliding_attention"] * 2}, False, id="every-layer-slides"),
    pytest.param({"model_type": "qwen2", "use_sliding_window": True, "max_window_layers": 28}, True,
                 id="qwen2-first-layers-full"),
    pytest.param({"model_type": "mistral"}, False, id="mistral-every-layer-slides"),
    pytest.param({"model_type": "qwen2", "use_sliding_window": True, "max_window_layers": 28, "num_hidden_layers": 28},
                 None, id="qwen2-no-layer-slides"),
    pytest.param({"model_type": "llama", "layer_types": ["full_attention"] * 2}, None, id="layer-types-none-slides"),
])
def test_a_model_with_full_layers_beside_its_window_is_warmed_at_the_whole_context(
        tmp_path: Path, extra: dict[str, object], global_layers: bool | None) -> None:
    """GPT-OSS-20B's window is 128 keys and every other layer attends the whole context: its full layers' decode
    step and chunked prefill at 4096 keys were never warmed, only the window's (2026-12-02)."""
    # trimmed from openai/gpt-oss-20b config.json (64 heads of 64, 8 KV heads, sliding_window 128)
    cfg = {"hidden_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
           "sliding_window": 128, "max_position_embeddings": 131072, **extra}
    model = read_model_config(_write(tmp_path, cfg))
    shapes = model_config_shapes(model, dtype="bfloat16", batch=1, seqlens=(), modes=(Mode.FWD,), cpu=False)
    decode = {(s.seqlen_q, s.seqlen_k) for s in shapes if s.seqlen_q < s.seqlen_k}
    window = {(1, 128)}  # 128 keys: no chunked prefill below 512
    if global_layers is None:  # no layer slides: no window at all (none warmed)
        assert model.sliding_window is None and decode == {(512, 4096), (1, 4096)}
        return
    assert model.global_layers is global_layers
    assert decode == (window | {(512, 4096), (1, 4096)} if global_layers else window)
