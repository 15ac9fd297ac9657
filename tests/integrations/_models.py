"""Tiny random transformers models built from configs (no Hub), shared by the integration tests: the model families
whose attention calls differ (GQA, sliding windows, softcap, sinks, MLA)."""

from __future__ import annotations

from typing import Any

import torch

VOCAB = 97
_COMMON = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
#: (config class, model class, config overrides); sliding windows of 4 tokens so that 11-token inputs use them
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2-sliding-window": ("Qwen2Config", "Qwen2ForCausalLM",
                             {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 0}),
    "gemma2-softcap-sliding-window": ("Gemma2Config", "Gemma2ForCausalLM",
                                      {"head_dim": 8, "sliding_window": 4, "attn_logit_softcapping": 2.0,
                                       "query_pre_attn_scalar": 8}),
    "gpt-oss-sinks": ("GptOssConfig", "GptOssForCausalLM",
                      {"head_dim": 8, "sliding_window": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
                       "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    "deepseek-v3-mla": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                        {"num_key_value_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                         "qk_rope_head_dim": 4, "v_head_dim": 6, "n_routed_experts": 4, "num_experts_per_tok": 2,
                         "first_k_dense_replace": 1, "moe_intermediate_size": 16, "n_group": 1, "topk_group": 1}),
}


def tiny_model(name: str, impl: str, **overrides: Any) -> Any:
    """The :data:`MODELS` entry ``name`` with ``overrides`` on its config, seeded, its attention ``impl``
    (``"eager"``, ``"sdpa"``, ``"attnforge"``; ``set_attn_implementation`` switches it later)."""
    import transformers

    config_cls, model_cls, extra = MODELS[name]
    config = getattr(transformers, config_cls)(**{**_COMMON, **extra, **overrides})
    torch.manual_seed(0)
    return getattr(transformers, model_cls)._from_config(config, attn_implementation=impl)
