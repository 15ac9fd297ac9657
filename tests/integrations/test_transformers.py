"""attn_implementation="attnforge" in a tiny Llama built from a config (no download)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from attnforge.dispatch import runtime
from attnforge.records import RecordStore

transformers = pytest.importorskip("transformers")
from attnforge.integrations import transformers as tf_integration  # noqa: E402


@pytest.fixture(autouse=True)
def counting_dispatcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    previous = runtime.set_dispatcher(runtime.Dispatcher(records=RecordStore(tmp_path)))
    calls: list[tuple[int, ...]] = []
    real = runtime.attention

    def spy(q: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls.append(tuple(q.shape))
        return real(q, *args, **kwargs)

    monkeypatch.setattr(runtime, "attention", spy)
    yield calls
    runtime.set_dispatcher(previous)


def _model(impl: str) -> Any:
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation=impl).eval()


def test_same_logits_as_sdpa(counting_dispatcher: list[tuple[int, ...]]) -> None:
    tf_integration.register()
    ids = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = _model("sdpa")(ids).logits
        got = _model("attnforge")(ids).logits
    assert counting_dispatcher == [(2, 4, 11, 8)] * 2  # two layers, GQA 4/2 heads, served by attnforge
    torch.testing.assert_close(got, want)


def test_padding_mask_goes_to_sdpa_and_matches(counting_dispatcher: list[tuple[int, ...]]) -> None:
    tf_integration.register()
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :3] = 0
    with torch.no_grad():
        want = _model("sdpa")(ids, attention_mask=mask).logits
        got = _model("attnforge")(ids, attention_mask=mask).logits
    assert counting_dispatcher == []
    torch.testing.assert_close(got, want)


def test_generate_with_cache_matches_sdpa() -> None:
    tf_integration.register()
    ids = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(3))
    kwargs = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    want = _model("sdpa").generate(ids, **kwargs)
    got = _model("attnforge").generate(ids, **kwargs)
    assert got.tolist() == want.tolist()
