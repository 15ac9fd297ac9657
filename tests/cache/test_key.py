from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnforge.cache.key import ArtifactKind, CacheKey, CacheKeyInputs
from attnforge.types.binary import AbiKind

SHA = "ab" * 32


def inputs(**changes: Any) -> CacheKeyInputs:
    base: dict[str, Any] = {
        "name": "flash-attn",
        "version": "2.8.3.post2",
        "source_sha256": SHA,
        "archs": ((9, 0),),
        "flags": ("FLASH_ATTENTION_DISABLE_DROPOUT=TRUE",),
        "torch_version": "2.11.0+cu130",
        "cuda_version": "13.0",
        "cxx11_abi": True,
        "python_tag": "cp311",
        "platform_tag": "linux_x86_64",
        "glibc": "2.36",
        "toolchain": (("nvcc", "13.0"), ("gcc", "12.2.0")),
    }
    base.update(changes)
    return CacheKeyInputs(**base)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"name": "sageattention"}, id="name"),
        pytest.param({"version": "2.8.3"}, id="version"),
        pytest.param({"kind": ArtifactKind.STATIC_LIB}, id="kind"),
        pytest.param({"source_sha256": "cd" * 32}, id="source"),
        pytest.param({"archs": ((8, 0), (9, 0))}, id="archs"),
        pytest.param({"flags": ()}, id="flags"),
        pytest.param({"torch_version": "2.11.0+cu128"}, id="torch"),
        pytest.param({"cuda_version": "12.8"}, id="cuda"),
        pytest.param({"cxx11_abi": False}, id="abi"),
        pytest.param({"python_tag": "cp312"}, id="python"),
        pytest.param({"platform_tag": "linux_aarch64"}, id="platform"),
        pytest.param({"glibc": "2.35"}, id="glibc"),
        pytest.param({"toolchain": (("nvcc", "12.9"), ("gcc", "12.2.0"))}, id="nvcc"),
        pytest.param({"toolchain": (("nvcc", "13.0"),)}, id="toolchain-entry-missing"),
    ],
)
def test_every_input_changes_the_key(change: dict[str, Any]) -> None:
    assert CacheKey.of(inputs(**change)) != CacheKey.of(inputs())


@pytest.mark.parametrize(
    "same",
    [
        pytest.param({"name": "flash_attn"}, id="name-normalised"),
        pytest.param({"name": "Flash.Attn"}, id="name-case"),
        pytest.param({"archs": ((9, 0), (9, 0))}, id="archs-dedup"),
        pytest.param({"toolchain": (("gcc", "12.2.0"), ("nvcc", "13.0"))}, id="toolchain-order"),
        pytest.param({"flags": ("FLASH_ATTENTION_DISABLE_DROPOUT=TRUE",) * 2}, id="flags-dedup"),
    ],
)
def test_spellings_of_the_same_build_share_a_key(same: dict[str, Any]) -> None:
    assert CacheKey.of(inputs(**same)) == CacheKey.of(inputs())


def test_canonical_json_is_sorted_compact_and_names_every_field() -> None:
    text = inputs(archs=((9, 0), (8, 0))).canonical_json()
    doc = json.loads(text)
    assert text == json.dumps(doc, sort_keys=True, separators=(",", ":"))
    assert doc["archs"] == ["8.0", "9.0"]
    # ``abi`` is named only when it is not the per-torch default, so keys made before it existed keep their value
    assert set(doc) == {f.name for f in dataclasses.fields(CacheKeyInputs)} - {"abi"} | {"key_schema"}
    assert "abi" in json.loads(dataclasses.replace(inputs(), abi=AbiKind.TORCH_STABLE).canonical_json())


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("ab" * 32, id="no-prefix"),
        pytest.param("sha256:" + "ab" * 31, id="short"),
        pytest.param("sha256:" + "AB" * 32, id="uppercase"),
        pytest.param("md5:" + "ab" * 32, id="other-algo"),
        pytest.param("sha256:" + "zz" * 32, id="not-hex"),
        pytest.param("", id="empty"),
    ],
)
def test_parse_rejects_malformed_keys(text: str) -> None:
    with pytest.raises(ValueError, match="cache key"):
        CacheKey.parse(text)


def test_bad_source_hash_is_refused() -> None:
    with pytest.raises(ValueError, match="source_sha256"):
        inputs(source_sha256="abc")


@given(st.text(alphabet="0123456789abcdef", min_size=64, max_size=64))
def test_key_text_round_trips(digest: str) -> None:
    key = CacheKey(digest)
    assert CacheKey.parse(str(key)) == key
    assert str(CacheKey.parse(str(key))) == f"sha256:{digest}"


_names = st.from_regex(r"[A-Za-z][A-Za-z0-9._-]{0,20}[A-Za-z0-9]", fullmatch=True)
_cc = st.tuples(st.integers(1, 12), st.integers(0, 9))
_maybe = st.none() | st.text(alphabet="0123456789.+abcu", min_size=1, max_size=12)


@given(
    name=_names,
    version=st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){0,3}", fullmatch=True),
    kind=st.sampled_from(ArtifactKind),
    source=st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
    archs=st.lists(_cc, max_size=5),
    flags=st.lists(st.text(min_size=1, max_size=20), max_size=4),
    torch_version=_maybe,
    cuda=_maybe,
    abi=st.none() | st.booleans(),
    glibc=_maybe,
    toolchain=st.dictionaries(st.sampled_from(["nvcc", "gcc", "cl"]), st.text(max_size=10), max_size=3),
)
def test_inputs_round_trip_through_json_and_keep_their_key(  # noqa: PLR0917 - one argument per strategy
    name: str, version: str, kind: ArtifactKind, source: str, archs: list[tuple[int, int]], flags: list[str],
    torch_version: str | None, cuda: str | None, abi: bool | None, glibc: str | None,
    toolchain: dict[str, str],
) -> None:
    original = CacheKeyInputs(
        name=name, version=version, kind=kind, source_sha256=source, archs=tuple(archs), flags=tuple(flags),
        torch_version=torch_version, cuda_version=cuda, cxx11_abi=abi, python_tag="cp311",
        platform_tag="linux_x86_64", glibc=glibc, toolchain=tuple(toolchain.items()),
    )
    again = CacheKeyInputs.from_json(json.loads(original.canonical_json()))
    assert again == original
    assert CacheKey.of(again) == CacheKey.of(original)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        pytest.param(lambda d: d.pop("key_schema"), "key_schema", id="no-schema"),
        pytest.param(lambda d: d.update(key_schema=99), "key_schema", id="future-schema"),
        pytest.param(lambda d: d.update(surprise=1), "bad cache key inputs", id="unknown-field"),
        pytest.param(lambda d: d.pop("python_tag"), "bad cache key inputs", id="missing-field"),
        pytest.param(lambda d: d.update(archs=["sm_90"]), "bad arch", id="bad-arch"),
        pytest.param(lambda d: d.update(kind="tarball"), "tarball", id="bad-kind"),
    ],
)
def test_from_json_rejects_bad_documents(mutate: Any, match: str) -> None:
    doc = inputs().to_json()
    mutate(doc)
    with pytest.raises(ValueError, match=match):
        CacheKeyInputs.from_json(doc)
