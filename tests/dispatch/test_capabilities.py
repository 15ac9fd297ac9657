"""The runtime capability table: strict loading, and the pure support check."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from attnforge.backends.adapter import AttentionCall
from attnforge.backends.capabilities import CausalMode, load_capabilities
from attnforge.catalog import DATA_DIR, load_catalog
from attnforge.errors import CatalogError

H200 = AttentionCall(device_type="cuda", compute_capability=(9, 0), dtype="bfloat16", batch=2, heads_q=8,
                     heads_kv=8, seqlen_q=128, seqlen_k=128, head_dim=128, causal=False, needs_grad=False)


def test_every_catalog_backend_has_runtime_capabilities() -> None:
    caps = load_capabilities()
    catalog = load_catalog()
    assert set(caps) == set(catalog.backends)
    for bid, cap in caps.items():
        assert cap.support == catalog.backends[bid].support
        assert cap.priority == catalog.backends[bid].priority


def _copy_data(tmp_path: Path, edit: tuple[str, str]) -> Path:
    for toml in DATA_DIR.glob("*.toml"):  # the catalog loads every data file, not only backends.toml
        shutil.copy(toml, tmp_path / toml.name)
    text = (DATA_DIR / "runtime.toml").read_text()
    assert edit[0] in text
    (tmp_path / "runtime.toml").write_text(text.replace(edit[0], edit[1], 1))
    return tmp_path


@pytest.mark.parametrize(("edit", "path"), [
    pytest.param(('causal = "square-only"', 'causal = "sideways"'), "runtime.sdpa-flash.causal",
                 id="bad-enum"),
    pytest.param(('devices = ["cuda"]', 'devices = ["tpu"]'), "runtime.sdpa-flash.devices[0]",
                 id="bad-device"),
    pytest.param(("backward = true", 'backward = "yes"'), "runtime.sdpa-flash.backward", id="bad-type"),
    pytest.param(("[runtime.sdpa-flash]", "[runtime.sdpa-turbo]"), "runtime.sdpa-flash", id="missing-row"),
    pytest.param(("head_dim_multiple = 8", "head_dim_multiple = 8\nspeed = 3"), "runtime.sdpa-flash.speed",
                 id="unknown-field"),
])
def test_bad_runtime_table_names_the_dotted_path(tmp_path: Path, edit: tuple[str, str], path: str) -> None:
    data = _copy_data(tmp_path, edit)
    with pytest.raises(CatalogError) as info:
        load_capabilities(load_catalog(data), data)
    assert any(p.startswith(path) for p in info.value.problems), info.value.problems


@pytest.mark.parametrize(("backend", "changes", "expected"), [
    pytest.param("flash-attn", {}, [], id="fa2-h200-ok"),
    pytest.param("flash-attn", {"device_type": "cpu", "compute_capability": None}, ["runs on cuda"],
                 id="fa2-cpu"),
    pytest.param("flash-attn", {"compute_capability": (7, 5)},
                 ["compute capability 8.0-12.1, this GPU is 7.5"], id="fa2-turing"),
    pytest.param("flash-attn", {"dtype": "float32"}, ["dtype float32"], id="fa2-fp32"),
    pytest.param("flash-attn", {"head_dim": 512}, ["head dim 512 > 256"], id="fa2-hd512"),
    pytest.param("flash-attn", {"causal": True, "seqlen_q": 64}, [], id="fa2-causal-bottom-right"),
    pytest.param("sdpa-flash", {"causal": True, "seqlen_q": 64}, ["causal only with Sq == Sk"],
                 id="sdpa-flash-rect"),
    pytest.param("sdpa-flash", {"causal": True}, [], id="sdpa-flash-square"),
    pytest.param("sdpa-efficient", {"causal": True, "seqlen_q": 64}, [], id="efficient-mask"),
    pytest.param("sdpa-cudnn", {"head_dim": 100}, ["head dim 100 is not a multiple of 8"], id="cudnn-hd100"),
    pytest.param("sageattention-2", {}, ["precision='allow_quantized'"], id="sage-exact"),
    pytest.param("sageattention-2", {"precision": "allow_quantized"}, [], id="sage-quantized"),
    pytest.param("sageattention-2", {"precision": "allow_quantized", "needs_grad": True}, ["no backward"],
                 id="sage-grad"),
    pytest.param("xformers", {"causal": True, "seqlen_q": 256}, ["rows with no key"],
                 id="xformers-empty-rows"),
    pytest.param("xformers", {"causal": True, "seqlen_q": 64}, [], id="xformers-bottom-right"),
    pytest.param("sdpa-math", {"device_type": "cpu", "compute_capability": None, "dtype": "float64"}, [],
                 id="math-cpu"),
    # FlexAttention with a causal BlockMask and GQA fails to compile below Sq 128 (H100, torch 2.11, runtime.toml)
    pytest.param("flex", {"causal": True, "heads_kv": 2, "seqlen_q": 96, "seqlen_k": 160},
                 ["GQA with a causal or window mask needs Sq >= 128 on CUDA"], id="flex-gqa-causal-short-q"),
    pytest.param("flex", {"heads_kv": 2, "seqlen_q": 1, "features": frozenset({"window"})},
                 ["GQA with a causal or window mask needs Sq >= 128"], id="flex-gqa-decode-window"),
    pytest.param("flex", {"causal": True, "heads_kv": 2}, [], id="flex-gqa-causal-one-block"),
    pytest.param("flex", {"causal": True, "seqlen_q": 96}, [], id="flex-mha-causal-short-q"),
    pytest.param("flex", {"heads_kv": 2, "seqlen_q": 96}, [], id="flex-gqa-unmasked-short-q"),
    pytest.param("flex", {"causal": True, "heads_kv": 2, "seqlen_q": 96, "device_type": "cpu",
                          "compute_capability": None, "dtype": "float32"}, [], id="flex-gqa-causal-cpu"),
])
def test_unsupported_reasons(backend: str, changes: dict[str, object], expected: list[str]) -> None:
    call = dataclasses.replace(H200, **changes)  # type: ignore[arg-type]
    reasons = load_capabilities()[backend].unsupported_reasons(call)
    assert len(reasons) == len(expected), reasons
    for reason, fragment in zip(reasons, expected, strict=True):
        assert fragment in reason


def test_causal_modes_cover_the_enum() -> None:
    used = {c.causal for c in load_capabilities().values()}
    assert CausalMode.SQUARE_ONLY in used
    assert CausalMode.BOTTOM_RIGHT in used
    assert CausalMode.MASK in used
