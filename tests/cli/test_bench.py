"""`attnforge bench --device cpu`: the whole path in seconds (table, JSON + schema, PNG, records)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from attnforge.bench.report import load_schema
from attnforge.cli import main
from attnforge.records import RecordStore, VerifyRecord
from attnforge.verify.device import current_device

TINY = ["--device", "cpu", "--head-dim", "32", "--seqlen", "64"]
# Tests of the plumbing pass --max-noise 1e6: on a loaded machine bench rightly refuses to store noisy cells
# (tests/bench/test_stability.py), which would make their counts and winners depend on the load.


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.mark.slow
def test_json_plot_and_records(attnforge_home: Path, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "bench.png"
    assert main(["bench", "sdpa-math", *TINY, "--json", "--plot", str(png)]) == 0
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, load_schema())
    assert doc["kind"] == "bench"
    assert doc["baseline"] == "sdpa"
    assert [b["name"] for b in doc["backends"]] == ["sdpa", "sdpa-math"]
    assert len(doc["rows"]) == 4  # causal on/off x fwd, fwd+bwd
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000
    stored = RecordStore(attnforge_home).bench_records(current_device("cpu").key)
    noisy = [c for row in doc["rows"] for c in row["cells"] if c["status"] == "noisy"]  # a loaded machine's
    assert all(c["detail"].startswith("not stored: ") for c in noisy)
    assert len(stored) + len(noisy) == 8  # every measured cell is stored or said to be too noisy
    assert {r.run_id for r in stored} == {doc["run_id"]}


@pytest.mark.slow
def test_table_marks_unverified_and_best(attnforge_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sdpa-math", *TINY, "--mode", "fwd", "--causal", "on", "--max-noise", "1e6"]) == 0
    out = capsys.readouterr().out
    assert "fwd causal D32 B4 H4 S64" in out
    assert "best" in out
    assert "sdpa-math*" in out
    assert "attnforge verify sdpa-math" in out
    assert "fwd = 4*B*Hq*Sq*Sk*D" in out
    assert "stored 2 result(s)" in out


@pytest.mark.slow
def test_without_names_the_verified_backends_are_benched(attnforge_home: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    key = current_device("cpu").key
    store = RecordStore(attnforge_home)
    for name, ok in (("sdpa-math", True), ("flex", False)):
        store.add_verify(VerifyRecord(device_key=key, backend=name, backend_version=None, ok=ok, summary="-"))
    assert main(["bench", "--max-noise", "1e6", *TINY, "--mode", "fwd", "--causal", "off", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(b["name"], b["verified"]) for b in doc["backends"]] == [("sdpa", False), ("sdpa-math", True)]


@pytest.mark.slow
def test_model_shape(attnforge_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--max-noise", "1e6", "sdpa-math", "--device", "cpu", "--shapes", "model", "--batch", "1",
            "--heads", "4",
            "--kv-heads", "2", "--head-dim", "16", "--seqlen", "32", "--seqlen-k", "48", "--mode", "fwd",
            "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["shape"] for r in rows] == [
        {"batch": 1, "heads_q": 4, "heads_kv": 2, "head_dim": 16, "head_dim_v": 16, "seqlen_q": 32, "seqlen_k": 48,
         "causal": c, "mode": "fwd", "dtype": "float32", "features": []} for c in (False, True)]
    assert rows[0]["shape_class"] == "float32 fwd full D16 gqa2 Sq32 Sk64"


# trimmed from the models' config.json on the Hugging Face Hub (meta-llama/Llama-3.1-8B, deepseek-ai/DeepSeek-V3)
LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
         "max_position_embeddings": 131072}
DEEPSEEK = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
            "num_key_value_heads": 128, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}


@pytest.mark.parametrize(("config", "classes"), [
    pytest.param(LLAMA, {"float32 fwd causal D128 gqa4 Sq16 Sk16", "float32 fwd causal D128 gqa4 Sq64 Sk64",
                         "float32 fwd causal D128 gqa4 Sq8 Sk64", "float32 fwd full D128 gqa4 Sq1 Sk64"},
                 id="llama-gqa-prefill-chunked-decode"),
    pytest.param(DEEPSEEK, {"float32 fwd causal D192/128 gqa1 Sq16 Sk16", "float32 fwd causal D192/128 gqa1 Sq64 Sk64",
                            "float32 fwd causal D192/128 gqa1 Sq8 Sk64", "float32 fwd full D192/128 gqa1 Sq1 Sk64"},
                 id="deepseek-mla-dv-differs"),
])
def test_model_config_measures_the_models_shape_classes_small_on_cpu(
        attnforge_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], config: dict[str, object],
        classes: set[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    assert main(["bench", "--max-noise", "1e6", "--device", "cpu", "--shapes", "model", "--model", str(path),
                 "--mode", "fwd", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, load_schema())
    assert {r["shape_class"] for r in doc["rows"]} == classes
    assert all(r["best"] == "sdpa" for r in doc["rows"])  # only the baseline ran


# trimmed from google/gemma-2-9b's config.json on the Hugging Face Hub
GEMMA2 = {"model_type": "gemma2", "hidden_size": 3584, "num_attention_heads": 16, "num_key_value_heads": 8,
          "head_dim": 256, "attn_logit_softcapping": 50.0, "sliding_window": 4096, "max_position_embeddings": 8192}


@pytest.mark.parametrize(("config", "said"), [
    pytest.param(GEMMA2, ("a logit softcap of 50 on every call", "a 4096-token sliding window"), id="gemma2"),
    pytest.param(LLAMA, (), id="llama"),
])
def test_model_config_says_which_features_bench_does_not_time(
        attnforge_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], config: dict[str, object],
        said: tuple[str, ...]) -> None:
    """bench times a model's plain shape classes; a config whose calls carry a softcap or a window says so and
    points at ``attnforge warmup --model`` (the records of a plain class do not serve a softcap call), on stderr,
    the JSON on stdout unchanged; a config with neither says nothing."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    assert main(["bench", "--max-noise", "1e6", "--device", "cpu", "--shapes", "model", "--model", str(path),
                 "--mode", "fwd", "--json"]) == 0
    out, err = capsys.readouterr()
    jsonschema.validate(json.loads(out), load_schema())
    if said:
        assert all(part in err for part in said), err
        assert f"attnforge warmup --model {path}" in err
    else:
        assert "note:" not in err


@pytest.mark.slow
def test_grid_and_diffusion_sets_on_cpu_keep_their_structure(attnforge_home: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--max-noise", "1e6", "--device", "cpu", "--shapes", "grid", "--mode", "fwd", "--json"]) == 0
    kinds = {r["shape_class"].split(" Sq")[0] + (" decode" if " Sq1 " in r["shape_class"] else "")
             for r in json.loads(capsys.readouterr().out)["rows"]}
    assert "float32 fwd causal D128 gqa4" in kinds and "float32 fwd full D128 gqa4 decode" in kinds
    assert {"float32 fwd causal D64 gqa1", "float32 fwd causal D256 gqa1"} <= kinds
    assert main(["bench", "--max-noise", "1e6", "--device", "cpu", "--shapes", "diffusion", "--mode", "fwd",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["shape"]["seqlen_q"] for r in rows] == [4608 // 64, 32760 // 64, 16384 // 64]


@pytest.mark.slow
def test_the_table_shows_spread_and_winner_margin(attnforge_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sdpa-math", *TINY, "--mode", "fwd", "--causal", "on", "--rounds", "4",
                 "--max-noise", "1e6"]) == 0  # a noisy cell (a loaded machine) has no margin to show
    out = capsys.readouterr().out
    assert "±" in out and "4 interleaved rounds" in out
    assert "(tie: " in out or "(+" in out or "(-" in out


@pytest.mark.parametrize(("argv", "message"), [
    pytest.param(["nope-attn"], "unknown backend(s): nope-attn", id="unknown-backend"),
    pytest.param(["--batch", "2"], "--batch only apply to --shapes model", id="model-option-on-grid"),
    pytest.param(["--shapes", "model", "--batch", "1"], "--shapes model needs --heads",
                 id="incomplete-model"),
    pytest.param(["--head-dim", "999"], "leave no shape of the grid", id="empty-filter"),
    pytest.param(["--shapes", "model", "--model", "/no/such/config.json"], "cannot read the model config",
                 id="missing-model-config"),
    pytest.param(["--model", "config.json"], "--model only apply to --shapes model", id="model-config-on-grid"),
    pytest.param(["--shapes", "model", "--model", "config.json", "--heads", "8"], "cannot be combined with --model",
                 id="model-config-and-sizes"),
])
def test_bad_input_exits_2_with_a_message(attnforge_home: Path, capsys: pytest.CaptureFixture[str],
                                          argv: list[str], message: str) -> None:
    assert main(["bench", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize("where", ["missing-folder", "read-only-folder"])
def test_a_plot_that_cannot_be_written_is_refused_before_any_measurement(
        attnforge_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """``bench --plot /nonexistent/x.png`` measured for minutes and then exited 2, its table never printed (CLI fuzz,
    2026-12-03): the folder is checked first, and nothing is measured or stored."""
    import os

    from attnforge.bench import run as bench_run

    folder = tmp_path / "plots"
    if where == "read-only-folder":
        folder.mkdir()
        real_access = os.access
        # as a non-root user sees a read-only folder (root's access() says writable to every mode bit)
        monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == folder else real_access(p, mode))
    measured: list[int] = []
    monkeypatch.setattr(bench_run, "run_bench", lambda *a, **k: measured.append(1))
    assert main(["bench", "sdpa-math", *TINY, "--plot", str(folder / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "cannot write the plot" in err and "hint:" in err
    assert measured == [] and RecordStore(attnforge_home).bench_records(current_device("cpu").key) == []
