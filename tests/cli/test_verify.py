"""`attnforge verify`: SDPA math passes on CPU (exit 0); a wrong backend fails, worst element shown (1)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnforge.backends import registry
from attnforge.cli import main
from attnforge.records import RecordStore
from attnforge.verify.device import current_device
from tests.verify.adapters import WrongAdapter


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.mark.slow
def test_sdpa_math_verifies_on_cpu_and_is_recorded(attnforge_home: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "sdpa-math", "--device", "cpu", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "verify"
    assert doc["ok"] is True
    [result] = doc["results"]
    assert result["backend"] == "sdpa-math"
    assert result["native"]["imports"] is True  # the subprocess import ran for real
    assert {c["status"] for c in result["cases"]} == {"passed"}
    assert {c["case"]["dtype"] for c in result["cases"]} == {"float32", "bfloat16"}
    assert doc["schema_version"] == 2  # the verify document's own: cases name their heads heads_q/heads_kv
    assert all({"heads_q", "heads_kv"} <= set(c["case"]) and "heads" not in c["case"] for c in result["cases"])
    saved = RecordStore(attnforge_home).latest_verify(current_device("cpu").key)
    assert saved["sdpa-math"].ok


def test_a_wrong_backend_fails_with_the_worst_element(attnforge_home: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    real = registry.adapters()
    monkeypatch.setattr(registry, "adapters", lambda: {**real, "wrong": WrongAdapter()})
    assert main(["verify", "wrong", "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out
    assert "worst at [" in out
    assert "of elements outside tolerance" in out
    saved = RecordStore(attnforge_home).latest_verify(current_device("cpu").key)
    assert not saved["wrong"].ok


def test_unknown_backend_is_bad_usage(attnforge_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "flash-attn-9", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "no adapter for backend(s) flash-attn-9" in err
    assert "hint: known backends:" in err
