"""Shape classes: one constructor, a string form that round-trips, decode and chunked prefill named."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnforge.types.shapes import (
    DTYPES,
    LEGACY_HEAD_KEYS,
    AttentionShape,
    Dims,
    Feature,
    Mode,
    ShapeClass,
    bucket,
    current_head_keys,
)

sizes = st.integers(min_value=1, max_value=1 << 17)


@st.composite
def shapes(draw: st.DrawFn) -> AttentionShape:
    kv = draw(st.integers(1, 16))
    return AttentionShape(batch=draw(st.integers(1, 64)), heads_q=kv * draw(st.integers(1, 16)), heads_kv=kv,
                          head_dim=draw(st.sampled_from((32, 64, 96, 128, 192, 256))), seqlen_q=draw(sizes),
                          seqlen_k=draw(sizes), causal=draw(st.booleans()), mode=draw(st.sampled_from(list(Mode))),
                          dtype=draw(st.sampled_from(DTYPES)), head_dim_v=draw(st.sampled_from((None, 128, 512))),
                          features=frozenset(draw(st.sets(st.sampled_from(list(Feature))))))


@given(shapes())
def test_the_string_form_round_trips(shape: AttentionShape) -> None:
    cls = shape.shape_class
    assert ShapeClass.parse(str(cls)) == cls
    assert str(ShapeClass.parse(str(cls))) == str(cls)


@given(sizes)
def test_bucket_is_the_smallest_power_of_two_at_least_n(n: int) -> None:
    b = bucket(n)
    assert b >= n and b & (b - 1) == 0 and (b == 1 or b // 2 < n)


def _shape(sq: int, sk: int, **kw: object) -> AttentionShape:
    base: dict[str, object] = {"batch": 1, "heads_q": 32, "heads_kv": 8, "head_dim": 128, "seqlen_q": sq,
                               "seqlen_k": sk, "causal": True, "mode": Mode.FWD, "dtype": "bfloat16"}
    return AttentionShape(**{**base, **kw})  # type: ignore[arg-type]


def test_the_string_names_every_part() -> None:
    cls = _shape(512, 4096, features=frozenset({Feature.WINDOW, Feature.SINKS}), head_dim_v=64).shape_class
    assert str(cls) == "bfloat16 fwd causal D128/64 gqa4 Sq512 Sk4096 +sinks +window"
    assert cls.kind == "chunked-prefill"
    assert _shape(1, 4000).shape_class.kind == "decode"
    assert _shape(3000, 4096).shape_class.kind == "prefill"  # same bucket
    assert _shape(3000, 4096).shape_class == _shape(4096, 4096, batch=7, heads_q=64, heads_kv=16).shape_class


def test_gqa_ratio_and_features_split_classes() -> None:
    assert _shape(4096, 4096).shape_class != _shape(4096, 4096, heads_kv=32).shape_class
    assert _shape(4096, 4096).shape_class != _shape(4096, 4096, features=frozenset({Feature.MASK})).shape_class


@pytest.mark.parametrize("text", [
    pytest.param("bfloat16 fwd causal D128 gqa4 Sq500 Sk4096", id="bucket-not-power-of-two"),
    pytest.param("bfloat8 fwd causal D128 gqa4 Sq512 Sk4096", id="unknown-dtype"),
    pytest.param("bfloat16 fwd causal D128 gqa4 Sq512 Sk4096 +paging", id="unknown-feature"),
    pytest.param("bfloat16 bwd causal D128 gqa4 Sq512 Sk4096", id="unknown-mode"),
    pytest.param("", id="empty"),
])
def test_parse_rejects_what_str_never_writes(text: str) -> None:
    with pytest.raises(ValueError, match=r"shape class|dtype|buckets|feature"):
        ShapeClass.parse(text)


@pytest.mark.parametrize(("doc", "expected"), [
    pytest.param({"batch": 1, "heads": 32, "kv_heads": 8}, {"batch": 1, "heads_q": 32, "heads_kv": 8}, id="old"),
    pytest.param({"batch": 1, "heads_q": 32, "heads_kv": 8}, {"batch": 1, "heads_q": 32, "heads_kv": 8}, id="new"),
    pytest.param({"dtype": "float16"}, {"dtype": "float16"}, id="no-heads"),
])
def test_recorded_head_keys_read_in_the_current_spelling(doc: dict[str, object], expected: dict[str, object]) -> None:
    assert current_head_keys(doc) == expected
    assert set(LEGACY_HEAD_KEYS.values()) <= {f.name for f in dataclasses.fields(Dims)}


def test_a_document_with_both_spellings_is_refused() -> None:
    with pytest.raises(ValueError, match="one spelling"):
        current_head_keys({"heads": 4, "heads_q": 4})
