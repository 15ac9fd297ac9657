"""``bench --shapes model``: every option the user gives is honoured or refused, never rewritten or ignored
(``--causal`` with ``--model``, a size of 0), and a config that cannot say its head dim is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnforge.bench import ShapeSet
from attnforge.bench.grid import model_shapes
from attnforge.bench.models import model_config_shapes, read_model_config
from attnforge.bench.select import choose_shapes
from attnforge.errors import UsageError
from attnforge.types.shapes import AttentionShape, Mode
from attnforge.verify.device import current_device

DECODER = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
FLUX = {"_class_name": "FluxTransformer2DModel", "_diffusers_version": "0.30.0", "num_attention_heads": 24,
        "attention_head_dim": 128}


def _config(tmp_path: Path, doc: object, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def _shapes(config: Path | None, **options: object) -> list[AttentionShape]:
    base: dict[str, object] = {"device": current_device("cpu"), "dtype": "float32", "causal": "both",
                               "mode": "fwd", "batch": None, "heads_q": None, "heads_kv": None, "head_dims": (),
                               "seqlens": (), "seqlen_k": None, "model_config": config}
    return choose_shapes(ShapeSet.MODEL, **{**base, **options})  # type: ignore[arg-type]


@pytest.mark.parametrize(("causal", "masks"), [
    pytest.param("both", {True, False}, id="both"),
    pytest.param("off", {False}, id="off"),
    pytest.param("on", {True}, id="on"),
])
def test_causal_is_honoured_with_a_model(tmp_path: Path, causal: str, masks: set[bool]) -> None:
    shapes = _shapes(_config(tmp_path, DECODER), causal=causal)
    assert shapes
    assert {s.causal for s in shapes} == masks


def test_a_causal_filter_that_leaves_nothing_of_the_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--causal on leaves no shape class") as info:
        _shapes(_config(tmp_path, FLUX), causal="on")
    assert info.value.hint is not None and "drop --causal" in info.value.hint


@pytest.mark.parametrize(("options", "message"), [
    pytest.param({"batch": 0}, "sizes must be positive: --batch 0", id="batch-0"),
    pytest.param({"batch": -5}, "sizes must be positive: --batch -5", id="batch-negative"),
    pytest.param({"seqlens": (128, 0)}, "sizes must be positive: --seqlen 0", id="seqlen-0"),
])
def test_zero_sizes_with_a_model_are_usage_errors(tmp_path: Path, options: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:
        _shapes(_config(tmp_path, DECODER), **options)
    assert info.value.exit_code == 2 and info.value.hint


@pytest.mark.parametrize(("seqlen_k", "message"), [
    pytest.param(0, "--seqlen-k 0", id="zero"),
    pytest.param(-5, "--seqlen-k -5", id="negative"),
])
def test_seqlen_k_0_is_refused_like_a_negative_one(seqlen_k: int, message: str) -> None:
    with pytest.raises(UsageError, match=f"sizes must be positive: {message}"):
        model_shapes(batch=1, heads_q=4, heads_kv=None, head_dims=(64,), seqlens=(16,), seqlen_k=seqlen_k,
                     dtype="float32", causals=(False,), modes=(Mode.FWD,))


def test_a_hidden_size_heads_do_not_divide_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="hidden_size 256 is not a multiple of num_attention_heads 3") as info:
        read_model_config(_config(tmp_path, {"hidden_size": 256, "num_attention_heads": 3}))
    assert info.value.hint is not None and "head_dim" in info.value.hint


def test_an_explicit_head_dim_needs_no_division(tmp_path: Path) -> None:
    model = read_model_config(_config(tmp_path, {"hidden_size": 256, "num_attention_heads": 3, "head_dim": 64}))
    assert model.head_dim == 64


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_softcap_is_refused(tmp_path: Path, value: str) -> None:
    path = tmp_path / "config.json"
    # json.dumps writes NaN and Infinity as Python's json reads them (and transformers' save_pretrained writes)
    path.write_text(json.dumps({"num_attention_heads": 8, "head_dim": 64, "attn_logit_softcapping": float(value)}),
                    encoding="utf-8")
    with pytest.raises(UsageError, match="attn_logit_softcapping must be a finite non-negative number") as info:
        read_model_config(path)
    assert info.value.hint


@pytest.mark.parametrize("value", [1e308, 1e-300])
def test_a_softcap_attention_refuses_is_refused_when_the_config_is_read(tmp_path: Path, value: float) -> None:
    """A softcap past float32's range (found by a CLI fuzz, 2026-12-03): the config was accepted and every class of
    ``warmup --model`` failed with attention()'s DispatchError; now one usage error naming the config's field."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"num_attention_heads": 8, "head_dim": 64, "attn_logit_softcapping": value}),
                    encoding="utf-8")
    with pytest.raises(UsageError, match="attn_logit_softcapping: softcap must be positive and a normal") as info:
        read_model_config(path)
    assert info.value.hint


@pytest.mark.parametrize("cpu", [False, True], ids=["gpu-sizes", "cpu-sizes"])
def test_one_position_gives_each_class_once_and_no_longer_than_the_model(tmp_path: Path, cpu: bool) -> None:
    model = read_model_config(_config(tmp_path, {**DECODER, "max_position_embeddings": 1}))
    shapes = model_config_shapes(model, dtype="float32", batch=1, seqlens=(), modes=(Mode.FWD, Mode.FWD_BWD),
                                 cpu=cpu)
    assert len(shapes) == len(set(shapes))
    assert [(s.mode, s.seqlen_q, s.seqlen_k) for s in shapes] == [(Mode.FWD, 1, 1), (Mode.FWD_BWD, 1, 1)]
