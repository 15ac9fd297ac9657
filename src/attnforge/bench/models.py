"""``--shapes model --model config.json``: the attention shape classes a Hugging Face model really runs.

From the model's ``config.json`` (transformers' ``PretrainedConfig`` field names): ``num_attention_heads`` (Hq),
``num_key_value_heads`` (Hkv, GQA; Hq when absent), ``head_dim`` or ``hidden_size / num_attention_heads`` (D); MLA
models (DeepSeek-V2/V3) ``qk_nope_head_dim + qk_rope_head_dim`` (D) and ``v_head_dim`` (Dv); ``sliding_window``
caps the key length that one query attends; ``attn_logit_softcapping`` (Gemma 2) is the logit softcap. Multimodal
configs nest the language model in ``text_config``. Diffusers transformer configs (``transformer/config.json`` of
Flux, Wan: ``num_attention_heads`` and ``attention_head_dim``, no ``hidden_size``) are read too: full (non-causal)
attention, no key/value heads of their own. Per model: causal prefill at a few lengths, chunked prefill (a
512-token chunk against the cache) and decode (one query against the cache), forward; prefill also forward +
backward (training).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnforge import _serde
from attnforge._system.files import read_user_file
from attnforge.bench.grid import check_positive, shrink_for_cpu
from attnforge.errors import UsageError
from attnforge.types.floats import normal_float32
from attnforge.types.shapes import AttentionShape, Mode

#: prefill lengths timed when ``--seqlen`` is not given (capped by ``max_position_embeddings``)
PREFILL_SEQLENS = (1024, 4096)
CHUNK = 512
DECODE_CONTEXT = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelAttention:
    """The attention geometry of one model config.

    Attributes:
        heads_q, heads_kv, head_dim, head_dim_v: ``Hq, Hkv, D, Dv``.
        sliding_window: the window of sliding-window layers (None: full attention).
        max_positions: ``max_position_embeddings`` (None when absent).
        softcap: ``attn_logit_softcapping`` (None: off).
        causal: decoder self-attention (False for a diffusers transformer: full attention).
        name: ``model_type`` or the file name.
        global_layers: a sliding-window model that also has full-attention layers (Gemma-2/3, Cohere2, GPT-OSS,
            Qwen2 below ``max_window_layers``; :func:`read_model_config`), whose decode steps attend the whole context
            there; False where every layer slides (Mistral) or none does.
    """

    name: str
    heads_q: int
    heads_kv: int
    head_dim: int
    head_dim_v: int
    sliding_window: int | None
    max_positions: int | None
    softcap: float | None = None
    causal: bool = True
    global_layers: bool = False


def read_model_config(path: Path) -> ModelAttention:
    """Read ``config.json``.

    Raises:
        UsageError: the file is missing or not JSON, or its attention sizes are missing or inconsistent.
    """
    raw = read_user_file(path, what="the model config",
                         hint="pass a Hugging Face config.json (e.g. from the model's repository)")
    try:
        doc = _serde.loads(raw)
    except ValueError as exc:
        raise UsageError(f"{path} is not JSON: {exc}", hint="pass a Hugging Face config.json") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path} is not a JSON object", hint="pass a Hugging Face config.json")
    text = doc.get("text_config")
    cfg: dict[str, Any] = text if isinstance(text, dict) else doc
    heads_q = _int(cfg, "num_attention_heads", path)
    if heads_q is None:
        raise UsageError(f"{path} has no num_attention_heads", hint="is this a transformer model's config.json?")
    heads_kv = _int(cfg, "num_key_value_heads", path) or heads_q
    if "qk_nope_head_dim" in cfg and "qk_rope_head_dim" in cfg:
        head_dim = (_int(cfg, "qk_nope_head_dim", path) or 0) + (_int(cfg, "qk_rope_head_dim", path) or 0)
        head_dim_v = _int(cfg, "v_head_dim", path) or head_dim
    else:
        hidden = _int(cfg, "hidden_size", path)
        head_dim = _int(cfg, "head_dim", path) or _int(cfg, "attention_head_dim", path) or 0
        if not head_dim and hidden:
            if hidden % heads_q:
                raise UsageError(f"{path}: inconsistent attention sizes: hidden_size {hidden} is not a multiple of "
                                 f"num_attention_heads {heads_q}, and no head_dim says what each head has",
                                 hint="add the model's head_dim to the config (it is hidden_size / "
                                      "num_attention_heads only when that divides)")
            head_dim = hidden // heads_q
        head_dim_v = head_dim
    if head_dim * heads_q > _MAX_WIDTH:
        raise UsageError(f"{path}: {heads_q} heads of {head_dim} is wider than any model's (at most {_MAX_WIDTH})",
                         hint="is this the model's config.json? its attention sizes are read from it")
    if head_dim <= 0 or heads_q % heads_kv:
        raise UsageError(f"{path}: inconsistent attention sizes (heads {heads_q}, kv heads {heads_kv}, "
                         f"head dim {head_dim})", hint="num_attention_heads must be a multiple of "
                                                       "num_key_value_heads; head_dim or hidden_size is needed")
    window = _int(cfg, "sliding_window", path) if cfg.get("use_sliding_window", True) is not False else None
    if window is not None and not _has_sliding_layers(cfg):
        window = None  # a window no layer uses
    softcap = cfg.get("attn_logit_softcapping")
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
                                or not math.isfinite(softcap) or softcap < 0):  # json reads NaN and Infinity
        raise UsageError(f"{path}: attn_logit_softcapping must be a finite non-negative number, got {softcap!r}",
                         hint="set it to the model's logit softcap (Gemma 2: 50.0), or to null or 0 for none")
    if softcap and not normal_float32(float(softcap)):  # attention()'s rule, here once rather than per class
        raise UsageError(f"{path}: attn_logit_softcapping: softcap must be positive and a normal float32 number "
                         f"(1.2e-38 to 3.4e38; 0 or null: off), got {softcap!r}",
                         hint="set it to the model's logit softcap (Gemma 2: 50.0), or to null or 0 for none")
    diffusers = "_diffusers_version" in doc or ("attention_head_dim" in cfg and "hidden_size" not in cfg)
    model_type = str(cfg.get("model_type") or doc.get("model_type") or "")
    name = cfg.get("model_type") or doc.get("model_type") or doc.get("_class_name") or path.stem
    return ModelAttention(name=str(name), heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim,
                          head_dim_v=head_dim_v, sliding_window=window,
                          max_positions=_int(cfg, "max_position_embeddings", path),
                          softcap=float(softcap) if softcap else None, causal=not diffusers,
                          global_layers=window is not None and _has_global_layers(cfg, model_type))


#: model types whose configs alternate sliding-window and full-attention layers even where config.json lists no
#: ``layer_types`` (transformers' configuration_gemma2.py / configuration_gemma3.py / configuration_cohere2.py /
#: configuration_gpt_oss.py build it: every other layer for Gemma-2 and GPT-OSS, one in ``sliding_window_pattern``
#: for Gemma-3 and Cohere2)
ALTERNATING = frozenset({"gemma2", "gemma3", "gemma3_text", "cohere2", "gpt_oss"})


def _has_sliding_layers(cfg: dict[str, Any]) -> bool:
    """Whether any layer uses the config's sliding window: ``layer_types`` lists one, or Qwen2's
    ``max_window_layers`` leaves layers to slide (transformers' configuration_qwen2.py: layers from
    ``max_window_layers`` on slide, so none where it is at least ``num_hidden_layers``)."""
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        return "sliding_attention" in types
    first, layers = cfg.get("max_window_layers"), cfg.get("num_hidden_layers")
    if isinstance(first, int) and isinstance(layers, int) and not isinstance(first, bool) and layers > 0:
        return first < layers
    return True


def _has_global_layers(cfg: dict[str, Any], model_type: str) -> bool:
    """Whether a sliding-window config also has full-attention layers: ``layer_types`` says so, the model type
    alternates (:data:`ALTERNATING`), or Qwen2's ``max_window_layers`` keeps its first layers full (transformers'
    configuration_qwen2.py: ``sliding_attention`` only from layer ``max_window_layers`` on)."""
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        return "full_attention" in types
    if model_type in ALTERNATING:
        return True
    first_sliding = cfg.get("max_window_layers")
    return isinstance(first_sliding, int) and not isinstance(first_sliding, bool) and first_sliding > 0


def model_config_shapes(model: ModelAttention, *, dtype: str, batch: int, seqlens: tuple[int, ...],
                        modes: tuple[Mode, ...], cpu: bool,
                        causals: tuple[bool, ...] = (False, True)) -> list[AttentionShape]:
    """The model's shape classes (module docstring); shrunk for a CPU like every other set; each class once.

    Prefill lengths are capped by ``max_position_embeddings`` only: a sliding-window layer's prefill of ``S > W``
    tokens is still an ``S x S`` call (its window is a feature of the call, which :func:`attnforge.dispatch.warmup`
    adds on the causal classes longer than the window), and a Gemma-2 global layer attends all ``S``. A sliding
    layer's decode step sees at most ``W`` keys (its cache keeps its last ``W``: transformers'
    ``DynamicSlidingWindowLayer``); a model with full-attention layers too (``global_layers``) is also warmed at the
    whole context.
    ``causals`` keeps the classes whose mask is one of them (``--causal off``: a decoder's decode step only); the
    model decides which mask each class has.

    Raises:
        UsageError: ``batch`` or a length of ``seqlens`` is not positive.
    """
    check_positive([("--batch", batch), *(("--seqlen", s) for s in seqlens)])
    cap = min(x for x in (model.max_positions, 1 << 20) if x)
    lengths = sorted({min(s, cap) for s in (seqlens or PREFILL_SEQLENS)})
    full = min(DECODE_CONTEXT, cap)
    # the decode step's keys: the whole context on full-attention layers, the window on sliding ones (both where a
    # model has both: GPT-OSS's window is 128, its global layers decode over the whole context)
    windowed = {min(full, model.sliding_window)} if model.sliding_window else set()
    contexts = sorted(windowed | ({full} if model.global_layers or not model.sliding_window else set()))

    def shape(sq: int, sk: int, mode: Mode) -> AttentionShape:
        return AttentionShape(batch=batch, heads_q=model.heads_q, heads_kv=model.heads_kv, head_dim=model.head_dim,
                              head_dim_v=model.head_dim_v if model.head_dim_v != model.head_dim else None,
                              seqlen_q=sq, seqlen_k=sk, causal=sq > 1, mode=mode, dtype=dtype)

    out = [shape(s, s, mode) for mode in modes for s in lengths]
    if not model.causal:  # a diffusion transformer: full attention over its token count, no cache
        out = [dataclasses.replace(s, causal=False) for s in out]
    elif Mode.FWD in modes:
        for context in contexts:
            if context > CHUNK:
                out.append(shape(CHUNK, context, Mode.FWD))
            out.append(shape(1, context, Mode.FWD))
    if cpu:
        out = [shrink_for_cpu(s) for s in out]
    # a tiny max_position_embeddings (or the CPU's shrinking) can make two classes one: prefill S1 is decode S1
    return [s for s in dict.fromkeys(out) if s.causal in causals]


#: the largest attention size a config may give (heads, head dims): 2**16, hundreds of times any published model's
#: (Llama-3.1-405B: 128 heads of 128; DeepSeek-V3: 128 heads, head dim 192). Unbounded, ``num_attention_heads`` and
#: ``head_dim`` of 10**9 made ``warmup --model`` allocate until the machine ran out (CLI fuzz, 2026-12-03)
_MAX_SIZE = 1 << 16
#: ``heads * head_dim`` (a query row's width), and ``hidden_size``, at most this (2**20: 64x Llama-3.1-405B's 16384)
_MAX_WIDTH = 1 << 20
_SIZES = frozenset({"num_attention_heads", "num_key_value_heads", "head_dim", "attention_head_dim", "qk_nope_head_dim",
                    "qk_rope_head_dim", "v_head_dim"})


def _int(cfg: dict[str, Any], key: str, path: Path) -> int | None:
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"{path}: {key} must be a positive integer, got {value!r}")
    limit = _MAX_SIZE if key in _SIZES else _MAX_WIDTH if key == "hidden_size" else None
    if limit is not None and value > limit:
        raise UsageError(f"{path}: {key} is {value}, larger than any model's (at most {limit})"[:200],
                         hint="is this the model's config.json? its attention sizes are read from it")
    return value
