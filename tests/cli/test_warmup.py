"""``attnforge warmup``: a model's config.json -> its shape classes compiled and measured now, the records the
dispatcher reads stored, one line per class (real CPU backends, the real record store)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from attnforge.backends.adapter import AttentionCall
from attnforge.backends.exact import reference_attention
from attnforge.cli import main
from attnforge.dispatch import runtime
from attnforge.records import RecordStore, VerifyRecord
from attnforge.verify.device import current_device

LLAMA = {"model_type": "llama", "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 4096}


@pytest.fixture(autouse=True)
def fresh_dispatcher(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import torch

    monkeypatch.setenv("ATTNFORGE_AUTOTUNE", "1")
    previous, threads = runtime.set_dispatcher(None), torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    runtime.set_dispatcher(previous)


def _config(tmp_path: Path, doc: dict[str, object]) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


class Kernel:
    """A verified backend at the kernel seam (on a CPU no real kernel is a candidate without a bench record)."""

    def load_error(self) -> str | None:
        return None

    def unsupported_reasons(self, call: AttentionCall) -> list[str]:
        return []

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
        return reference_attention(q, k, v, causal=causal, scale=scale).to(q.dtype)


def test_a_models_classes_are_measured_and_stored(attnforge_home: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    key = current_device("cpu").key
    store = RecordStore(attnforge_home)
    store.add_verify(VerifyRecord(device_key=key, backend="kernel", backend_version=None, ok=True, summary="ok"))
    runtime.set_dispatcher(runtime.Dispatcher({"kernel": Kernel()}, records=store))
    argv = ["warmup", "--model", _config(tmp_path, LLAMA), "--device", "cpu", "--mode", "fwd", "--budget", "0.02",
            "--rounds", "1", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "warmup" and doc["measuring"] is True
    assert [c["chosen"] for c in doc["classes"]] and all(c["chosen"] in {"sdpa", "kernel"} for c in doc["classes"])
    assert {c["shape"]["head_dim"] for c in doc["classes"]} == {32}  # hidden_size / num_attention_heads
    assert all(c["timed_again"] in (True, False) for c in doc["classes"])  # each class says it (the key is there)
    measured = {(r.backend, r.run_id[:9]) for r in store.bench_records(key)}
    assert measured == {("sdpa", "autotune-"), ("kernel", "autotune-")}  # the records attention() reads
    assert any(s["source"] == "attnforge" for s in doc["caches"]["settings"])


def test_a_models_long_prefill_is_warmed_as_a_padded_prefills_varlen_call(
        attnforge_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--model`` warms a causal prefill at least the transformers integration's varlen threshold long also as the
    varlen call a left-padded prompt of it becomes (that route's kernel compiles on its first call: FA4's). The
    threshold is lowered to the CPU shape set's prefill length (S32; 2048 on a GPU)."""
    from attnforge.integrations import transformers as integration

    monkeypatch.setattr(integration, "PREFILL_VARLEN_MIN", 32)
    runtime.set_dispatcher(runtime.Dispatcher({}, records=RecordStore(attnforge_home)))
    argv = ["warmup", "--model", _config(tmp_path, LLAMA), "--device", "cpu", "--mode", "fwd", "--budget", "0.02",
            "--rounds", "1", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    varlen = [c for c in doc["classes"] if "varlen" in c["features"]]
    plain = [c["shape"] for c in doc["classes"] if not c["features"]]
    want = [p["label"] for p in plain if p["causal"] and p["seqlen_q"] == p["seqlen_k"] >= 32]
    assert want and [c["shape"]["label"] for c in varlen] == want  # each long causal prefill, nothing shorter
    assert any(p["seqlen_q"] < 32 or p["seqlen_q"] != p["seqlen_k"] for p in plain)  # shapes left out exist
    assert varlen[0]["chosen"] and not varlen[0]["error"] and "+varlen" in varlen[0]["shape_class"]


def test_measuring_off_is_said_and_fails(attnforge_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ATTNFORGE_AUTOTUNE", "0")
    assert main(["warmup", "--model", _config(tmp_path, LLAMA), "--device", "cpu", "--mode", "fwd"]) == 1
    assert "ATTNFORGE_AUTOTUNE=0" in capsys.readouterr().out


def test_it_needs_a_model_or_shapes(attnforge_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["warmup", "--device", "cpu"]) == 2
    assert "--model" in capsys.readouterr().err


def test_a_sliding_window_models_long_prefill_is_warmed_whole_and_with_its_window(
        attnforge_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A prompt longer than a sliding-window model's window is an ``S x S`` call whose window hides keys: warm-up
    warms that class (and its windowed variant), not one cut to the window's length (which no layer calls). On a
    CPU the lengths shrink (4096 -> 64) and the window does not, so the window here is 32."""
    runtime.set_dispatcher(runtime.Dispatcher({}, records=RecordStore(attnforge_home)))
    mistral = {**LLAMA, "model_type": "mistral", "sliding_window": 32}
    argv = ["warmup", "--model", _config(tmp_path, mistral), "--device", "cpu", "--mode", "fwd", "--budget", "0.02",
            "--rounds", "1", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    windowed = [c["shape"] for c in doc["classes"] if "window" in c["features"]]
    assert [(s["seqlen_q"], s["seqlen_k"]) for s in windowed] == [(64, 64)]
    plain = {(c["shape"]["seqlen_q"], c["shape"]["seqlen_k"]) for c in doc["classes"] if not c["features"]}
    assert (64, 64) in plain and all(sk <= 64 for _, sk in plain)


class Quantizing(Kernel):
    """A verified quantizing backend at the kernel seam (SageAttention's capabilities: allow_quantized only)."""

    caps = type("Caps", (), {"quantized": True, "features": frozenset(), "priority": 10})()

    def unsupported_reasons(self, call: AttentionCall) -> list[str]:
        return [] if call.precision == "allow_quantized" else ["quantizes Q/K/V: only with allow_quantized"]


@pytest.mark.parametrize("precision", [None, "allow_quantized"])
def test_precision_says_which_calls_a_model_makes(attnforge_home: Path, tmp_path: Path, precision: str | None,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``--precision allow_quantized`` warms the classes a model calling ``attention(precision="allow_quantized")``
    makes, its quantized candidates timed with the rest; the default warms exact calls and never calls them."""
    key = current_device("cpu").key
    store = RecordStore(attnforge_home)
    store.add_verify(VerifyRecord(device_key=key, backend="sage", backend_version=None, ok=True, summary="ok"))
    runtime.set_dispatcher(runtime.Dispatcher({"sage": Quantizing()}, records=store))
    argv = ["warmup", "--shapes", "model", "--batch", "1", "--heads", "2", "--head-dim", "16", "--seqlen", "16",
            "--device", "cpu", "--mode", "fwd", "--budget", "0.02", "--rounds", "1", "--json"]
    assert main(argv + (["--precision", precision] if precision else [])) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["precision"] == (precision or "exact") and not any(c["error"] for c in doc["classes"])
    timed = {r.backend for r in store.bench_records(key)}
    assert ("sage" in timed) is (precision == "allow_quantized")


def test_a_config_from_a_pipe_is_read_once(attnforge_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """``--model <(cat config.json)`` or ``/dev/stdin``: a pipe gives its bytes once, and warmup read the config twice
    (its window and softcap, then its shape classes), so the second read called a valid config "not JSON" (found by a
    CLI fuzz, 2026-12-03). Measuring off ends the run right after the config was used."""
    import os
    import threading

    monkeypatch.setenv("ATTNFORGE_AUTOTUNE", "0")
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)

    done = threading.Event()

    def write_once() -> None:
        with fifo.open("w", encoding="utf-8") as fh:
            fh.write(json.dumps(LLAMA))
        while not done.is_set():  # any later reader gets nothing, as from a pipe (no hang)
            with fifo.open("w", encoding="utf-8"):
                pass

    writer = threading.Thread(target=write_once, daemon=True)
    writer.start()
    code = main(["warmup", "--model", str(fifo), "--device", "cpu", "--mode", "fwd"])
    captured = capsys.readouterr()
    done.set()
    os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # lets the writer's waiting open return
    writer.join(timeout=5)
    assert "not JSON" not in captured.err, captured.err
    assert code == 1 and "ATTNFORGE_AUTOTUNE=0" in captured.out
