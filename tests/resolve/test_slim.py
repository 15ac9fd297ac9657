"""Slim builds: switches from the recipe data, translation-unit counts, estimates, ``plan`` text and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnforge.catalog import load_catalog
from attnforge.catalog.slim import Capabilities, SlimRequest, count_units, estimate_s, plan_slim
from attnforge.cli import main
from attnforge.errors import UsageError
from attnforge.install.keys import built_wheel_inputs
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve import build_spec
from attnforge.resolve.types import CachedArtifact, CandidateKind, Request
from tests._fakes import FIXTURES

H200 = str(FIXTURES / "snapshots" / "h200_torch2.11_cu130.json")
#: The 16 switches set by hand for the measured slim FA3 (issue 15: 5 compile steps, 2 min 09 s on the H200).
ISSUE_15 = {f"FLASH_ATTENTION_DISABLE_{n}" for n in [
    "FP16", "FP8", "SPLIT", "PAGEDKV", "APPENDKV", "LOCAL", "SOFTCAP", "VARLEN", "CLUSTER", "SM80", "HDIM64",
    "HDIM96", "HDIM192", "HDIM256", "HDIMDIFF64", "HDIMDIFF192"]}


def fa3() -> object:
    return load_catalog().recipes["flash-attn-3"].slim


def test_hdim128_bf16_on_hopper_sets_exactly_the_measured_switches() -> None:
    plan = plan_slim("flash-attn-3", fa3(), SlimRequest(head_dims=(128,), dtypes=("bfloat16",)),  # type: ignore[arg-type]
                     archs=((9, 0),), max_jobs=16)
    assert set(plan.env) == ISSUE_15 and set(plan.env.values()) == {"TRUE"}
    assert (plan.units, plan.full_units) == (5, 293)  # the recorded 5 compile steps; setup.py's 293
    assert plan.capabilities == Capabilities(head_dims=(128,), dtypes=("bfloat16",), backward=True, features=())
    assert plan.estimate_s is not None and plan.full_estimate_s is not None
    assert plan.estimate_s < plan.full_estimate_s / 10


def test_unit_counts_follow_setup_py() -> None:
    assert count_units("fa3-hopper", set()) == 293
    assert count_units("fa3-hopper", ISSUE_15) == 5
    assert count_units("fa3-hopper", ISSUE_15 | {"FLASH_ATTENTION_DISABLE_BACKWARD"}) == 4
    # fp16 kept as well: one more forward (x2 packgqa variants) and one more backward unit
    assert count_units("fa3-hopper", ISSUE_15 - {"FLASH_ATTENTION_DISABLE_FP16"}) == 8


def test_a_head_dim_runs_on_the_next_kernel_up_and_features_are_kept_when_asked() -> None:
    plan = plan_slim("flash-attn-3", fa3(), SlimRequest(head_dims=(80,), features=("varlen", "paged-kv"),  # type: ignore[arg-type]
                     backward=False), archs=((8, 0), (9, 0)), max_jobs=8)
    assert plan.capabilities.head_dims == (96,)
    assert plan.capabilities.features == ("paged-kv", "varlen")
    assert plan.capabilities.backward is False
    assert "FLASH_ATTENTION_DISABLE_BACKWARD" in plan.env
    assert "FLASH_ATTENTION_DISABLE_SM80" not in plan.env  # an 8.0 target keeps the sm80 kernels
    assert "FLASH_ATTENTION_DISABLE_VARLEN" not in plan.env


@pytest.mark.parametrize(
    "request_", [SlimRequest(head_dims=(512,)), SlimRequest(dtypes=("float32",)), SlimRequest(features=("dropout",))]
)
def test_what_the_recipe_cannot_build_is_bad_usage(request_: SlimRequest) -> None:
    with pytest.raises(UsageError) as info:
        plan_slim("flash-attn-3", fa3(), request_, archs=((9, 0),), max_jobs=8)  # type: ignore[arg-type]
    assert info.value.hint


def test_estimates_scale_from_the_recorded_build() -> None:
    timing = load_catalog().recipes["flash-attn-3"].slim.timing  # type: ignore[union-attr]
    assert estimate_s(timing, 5, 16) == 129
    assert estimate_s(timing, 32, 16) == 2 * 129
    assert estimate_s(None, 5, 16) is None


def test_plan_on_the_h200_shows_the_slim_build(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "flash-attn-3", "--snapshot", H200, "--head-dim", "128", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    for var in ISSUE_15:
        assert f"  {var}=TRUE" in out
    assert "leaves out head dims 64, 96, 192, 256" in out
    assert "leaves out dtypes float16, float8_e4m3fn" in out
    assert "slim 5 translation units, ~2 min; full 293 translation units, ~41 min" in out


def test_plan_json_carries_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "flash-attn-3", "--snapshot", H200, "--head-dim", "128", "--dtype", "bf16", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    slim = doc["slim"]
    assert set(slim["env"]) == ISSUE_15
    assert set(doc["chosen"]["build"]["env"]) >= ISSUE_15
    assert (slim["units"], slim["full_units"], slim["estimate_s"], slim["full_estimate_s"]) == (5, 293, 129, 2451)
    assert doc["chosen"]["build"]["capabilities"] == {
        "head_dims": [128], "dtypes": ["bfloat16"], "backward": True, "features": []}
    assert any(line.startswith("head dims") for line in slim["left_out"])


def test_a_full_plan_offers_the_slim_build(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "flash-attn-3", "--snapshot", H200]) == 0
    out = capsys.readouterr().out
    assert "a slim build is much cheaper" in out and "--head-dim 128 --dtype bf16" in out
    assert "FLASH_ATTENTION_DISABLE" not in out


def test_a_backend_without_switches_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "flash-attn", "--snapshot", H200, "--from-source", "--head-dim", "128", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["slim"] is None
    assert any("no slim build: flash-attn's setup.py has no head-dim" in r for r in doc["chosen"]["reasons"]
               + doc["chosen"]["build"]["notes"])


def test_an_unknown_feature_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "flash-attn-3", "--snapshot", H200, "--features", "dropout"]) == 2
    err = capsys.readouterr().err
    assert "error: flash-attn-3 has no build feature dropout" in err and "hint:" in err


@pytest.mark.parametrize(
    ("config", "dims"),
    [
        pytest.param({"head_dim": 128, "hidden_size": 4096, "num_attention_heads": 64}, "128", id="head_dim"),
        pytest.param({"hidden_size": 4096, "num_attention_heads": 32, "head_dim": None}, "128", id="hidden/heads"),
        pytest.param({"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}, "192",
                     id="deepseek"),
        pytest.param({"text_config": {"hidden_size": 2048, "num_attention_heads": 32}}, "64", id="text_config"),
    ],
)
def test_model_config_gives_the_head_dims(
    config: dict[str, object], dims: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["plan", "flash-attn-3", "--snapshot", H200, "--model", str(path), "--dtype", "bf16"]) == 0
    assert f"can run: head dims {dims};" in capsys.readouterr().out


def test_a_model_config_without_head_dims_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"vocab_size": 3}')
    assert main(["plan", "flash-attn-3", "--snapshot", H200, "--model", str(path)]) == 2
    assert "names no head dim" in capsys.readouterr().err


def test_the_switches_change_the_cache_key_and_the_build_root(tmp_path: Path) -> None:
    snapshot = SystemSnapshot.load(Path(H200))
    catalog = load_catalog()
    full = build_spec(snapshot, catalog, Request(backend="flash-attn-3"), home=str(tmp_path))
    slim = build_spec(snapshot, catalog, Request(backend="flash-attn-3", slim=SlimRequest(head_dims=(128,))),
                      home=str(tmp_path))
    assert full.capabilities is None and slim.capabilities is not None
    assert full.build_root != slim.build_root
    wheel = tmp_path / "flash_attn_3-3.0.0b1-cp39-abi3-linux_x86_64.whl"
    keys = [built_wheel_inputs(wheel=wheel, spec=s, source_sha256="0" * 64, snapshot=snapshot) for s in (full, slim)]
    assert "FLASH_ATTENTION_DISABLE_HDIM64=TRUE" in keys[1].flags
    assert keys[0].flags != keys[1].flags


def _cached_fa3(flags: tuple[str, ...]) -> CachedArtifact:
    return CachedArtifact(key="sha256:" + "a" * 64, name="flash-attn-3", version="3.0.0b1",
                          filename="flash_attn_3-3.0.0b1-cp39-abi3-linux_x86_64.whl", archs=((9, 0),),
                          torch_version="2.11.0+cu130", cuda_version="13.0", cxx11_abi=True, sha256="b" * 64,
                          flags=flags)


@pytest.mark.parametrize(
    ("flags", "slim", "accepted"),
    [
        pytest.param((), None, True, id="full-serves-full"),
        pytest.param((), SlimRequest(head_dims=(128,), dtypes=("bfloat16",)), True, id="full-serves-slim"),
        pytest.param(tuple(f"{v}=TRUE" for v in ISSUE_15), None, False, id="slim-refused-for-full"),
        pytest.param(tuple(f"{v}=TRUE" for v in ISSUE_15), SlimRequest(head_dims=(128,), dtypes=("bfloat16",)),
                     True, id="slim-serves-the-same-slim"),
        pytest.param(tuple(f"{v}=TRUE" for v in ISSUE_15), SlimRequest(head_dims=(128,)), False,
                     id="bf16-only-refused-for-fp16"),
    ],
)
def test_a_cached_slim_build_serves_only_requests_inside_it(
    flags: tuple[str, ...], slim: SlimRequest | None, accepted: bool
) -> None:
    from attnforge.resolve.resolver import resolve

    plan = resolve(SystemSnapshot.load(Path(H200)), load_catalog(), Request(backend="flash-attn-3", slim=slim),
                   cached=[_cached_fa3(flags)])
    cand = next(c for c in plan.candidates if c.kind is CandidateKind.CACHE)
    assert cand.accepted is accepted, cand.reasons
    if not accepted:
        assert "FLASH_ATTENTION_DISABLE_FP16" in " ".join(cand.reasons)


def test_installed_capabilities_come_from_the_cache_entry_pip_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnforge.cache import capabilities as caps_mod

    entry = tmp_path / "artifacts" / ("c" * 64)
    entry.mkdir(parents=True)
    wheel = entry / "flash_attn_3-3.0.0b1-cp39-abi3-linux_x86_64.whl"
    wheel.write_bytes(b"")
    want = Capabilities(head_dims=(128,), dtypes=("bfloat16",), backward=False, features=("varlen",))
    (entry / "provenance.json").write_text(json.dumps({"details": {"capabilities": want.to_json()}}))
    site = tmp_path / "site"
    info = site / "flash_attn_3-3.0.0b1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flash_attn_3\nVersion: 3.0.0b1\n")
    (info / "direct_url.json").write_text(json.dumps({"url": wheel.as_uri(), "archive_info": {}}))
    monkeypatch.syspath_prepend(str(site))
    assert caps_mod.installed_capabilities(["flash-attn-3"]) == want
    assert caps_mod.backend_capabilities("flash-attn-3") == want
    assert caps_mod.backend_capabilities("sdpa-flash") is None
    (entry / "provenance.json").write_text(json.dumps({"details": {"origin": "source-build"}}))
    assert caps_mod.installed_capabilities(["flash-attn-3"]) is None  # a full build: no limits recorded


def test_plan_takes_the_same_source_strings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "flash-attention"
    assert main(["plan", "flash-attn-3", "--snapshot", H200, "--source", f"{repo}#subdirectory=hopper",
                 "--head-dim", "128", "--json"]) == 0
    source = json.loads(capsys.readouterr().out)["chosen"]["build"]["source"]
    assert (source["kind"], source["location"], source["subdirectory"]) == ("path", str(repo), "hopper")
    assert source["submodules"] == ["csrc/cutlass"]
    assert main(["plan", "flash-attn-3", "--snapshot", H200, "--source", f"{repo}/hopper", "--json"]) == 0
    source = json.loads(capsys.readouterr().out)["chosen"]["build"]["source"]
    assert (source["location"], source["subdirectory"]) == (str(repo), "hopper")  # hopper/ alone: its repo


def test_a_qk_v_pair_keeps_its_own_kernels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = plan_slim("flash-attn-3", fa3(), SlimRequest(head_dim_pairs=((192, 128),), dtypes=("bfloat16",)),  # type: ignore[arg-type]
                     archs=((9, 0),), max_jobs=16)
    assert plan.capabilities.head_dims == (192,) and plan.capabilities.features == ("hdimdiff192",)
    kept = {"FLASH_ATTENTION_DISABLE_HDIM192", "FLASH_ATTENTION_DISABLE_HDIMDIFF192"}
    assert not kept & set(plan.env)  # flash_api.cpp reaches the 192x128 kernel only inside the HDIM192 switch
    path = tmp_path / "config.json"  # DeepSeek-V3's attention: qk 128 + 64 (rope), v 128
    path.write_text(json.dumps({"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}))
    assert main(["plan", "flash-attn-3", "--snapshot", H200, "--model", str(path), "--dtype", "bf16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["slim"]["capabilities"]["features"] == ["hdimdiff192"]
    assert main(["plan", "flash-attn-3", "--snapshot", H200, "--head-dim", "192x128", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["slim"]["capabilities"]["features"] == ["hdimdiff192"]
    assert main(["plan", "flash-attn-3", "--snapshot", H200, "--head-dim", "192y128"]) == 2


def test_a_bad_slim_table_is_a_catalog_error_naming_every_field(tmp_path: Path) -> None:
    import shutil

    from attnforge.catalog import DATA_DIR
    from attnforge.errors import CatalogError

    for f in DATA_DIR.glob("*.toml"):
        shutil.copy(f, tmp_path / f.name)
    toml = tmp_path / "backends.toml"
    text = toml.read_text()
    text = text.replace('units_model = "fa3-hopper"', 'units_model = "fa9"\nspeed = 3', 1)
    text = text.replace('full_units = 293', 'full_units = "many"', 1)
    text = text.replace('arch_switches = { 8 = ', 'arch_switches = { sm8 = ', 1)
    toml.write_text(text)
    with pytest.raises(CatalogError) as info:
        load_catalog(tmp_path)
    problems = "\n".join(info.value.problems)
    for field in ("slim.units_model", "slim.speed", "slim.full_units", "slim.arch_switches.sm8"):
        assert f"recipes.flash-attn-3.{field}" in problems


@pytest.mark.parametrize(
    ("slim", "accepted", "words"),
    [
        pytest.param(SlimRequest(head_dims=(128,), dtypes=("bfloat16",)), True, "", id="same-slim"),
        pytest.param(SlimRequest(head_dims=(100,), dtypes=("bfloat16",), backward=False), True, "", id="inside"),
        pytest.param(None, False, "is a slim one", id="full-asked"),
        pytest.param(SlimRequest(head_dims=(64, 256), dtypes=("bfloat16", "float16")), False,
                     "lacks head dim 256, float16", id="outside"),  # 64 runs on the 128 kernel
    ],
)
def test_an_installed_slim_build_serves_only_requests_inside_it(
    slim: SlimRequest | None, accepted: bool, words: str, tmp_path: Path
) -> None:
    from attnforge.resolve.resolver import resolve

    doc = json.loads(Path(H200).read_text())
    doc["backends"] = [b for b in doc["backends"] if b["backend"] != "flash-attn-3"] + [
        {"backend": "flash-attn-3", "distribution": "flash-attn-3", "version": "3.0.0b1", "imports": True,
         "native": [{"name": "flash_attn_3._C", "ok": True}]}]
    (tmp_path / "s.json").write_text(json.dumps(doc))
    have = Capabilities(head_dims=(128,), dtypes=("bfloat16",), backward=True, features=())
    plan = resolve(SystemSnapshot.load(tmp_path / "s.json"), load_catalog(),
                   Request(backend="flash-attn-3", slim=slim, installed_capabilities=have))
    installed = plan.candidates[0]
    assert installed.accepted is accepted, installed.reasons
    assert words in " ".join(installed.reasons)
