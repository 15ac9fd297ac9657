"""``attnforge install`` argument handling and error paths (the real installs are in tests/install)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnforge.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["install", "no-such-backend"], "unknown backend", id="unknown-backend"),
        pytest.param(["install", "flash attn!"], "not a backend requirement", id="bad-requirement"),
        pytest.param(["install", "flash-attn", "--arch", "ninety"], "not a compute capability",
                     id="bad-arch"),
        pytest.param(["install", "no-such-backend", "--from-source", "--allow-unsupported-compiler"],
                     "unknown backend", id="allow-unsupported-compiler-is-an-option"),
    ],
)
def test_bad_input_exits_2_with_a_hint(
    attnforge_home: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"error: {message}" in err
    assert "Traceback" not in err


@pytest.mark.integration
def test_nothing_viable_exits_1_with_every_reason(
    attnforge_home: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """No GPU, a CPU torch and an offline request: nothing can install flash-attn here, and it says why."""
    assert main(["install", "flash-attn", "--offline", "--no-verify"]) == 1
    err = capsys.readouterr().err
    assert "error: nothing can install flash-attn" in err
    assert "cause:" in err
    assert "hint: see `attnforge plan flash-attn`" in err


def test_xformers_refused_from_pypi_points_at_the_pytorch_index(
    attnforge_home: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Seen on the H200: PyPI's xformers wheel has no local label and is the CUDA 12.8 build."""
    wheelhouse = tmp_path / "wh"
    wheelhouse.mkdir()
    (wheelhouse / "xformers-0.0.35-py39-none-manylinux_2_28_x86_64.whl").write_bytes(b"")
    assert main(["install", "xformers", "--find-links", str(wheelhouse), "--offline", "--no-verify"]) == 1
    err = capsys.readouterr().err
    assert "no local version label" in err
    assert "hint: this torch needs the xFormers build for its CUDA: attnforge install xformers --index-url " \
           "https://download.pytorch.org/whl/cpu" in err  # this machine's torch is the CPU build


def test_allow_overlap_is_offered(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["install", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--allow-overlap" in out
    assert "refused by default" in out


def test_an_overlap_warning_is_printed_as_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    from attnforge.cli.install import _render
    from attnforge.install.flow import InstallResult
    from attnforge.resolve.types import Plan, Request

    request = Request(backend="flash-attn")
    note = ("flash-attn 2.8.3.post2 ships flash_attn/cute/ which flash-attn-4 4.0.0b36 installed: installing it "
            "replaced 20 of flash-attn-4's files; reinstalling restores them: `python -m pip install "
            "'flash-attn-4[cu13]==4.0.0b36'`")
    _render(InstallResult(request=request, plan=Plan(request=request, candidates=()), action="cache-hit",
                          warnings=(note,)))
    assert f"note: {note}" in capsys.readouterr().out  # [cu13] survives: no rich markup in warnings


def test_the_installed_versions_failed_verify_reaches_the_request(tmp_path: Path) -> None:
    import dataclasses

    from attnforge.install.inputs import _verify_failure
    from attnforge.probe.snapshot import InstalledBackend, SystemSnapshot
    from attnforge.records import RecordStore, VerifyRecord
    from tests.conftest import REPO

    snap = SystemSnapshot.load(REPO / "tests" / "fixtures" / "snapshots" / "h200_torch2.11_cu130.json")
    snap = dataclasses.replace(snap, backends=(InstalledBackend(backend="flash-attn", distribution="flash-attn",
                                                                version="2.8.3", imports=True),))
    assert _verify_failure(snap, "flash-attn", tmp_path / "home") is None  # never verified
    store = RecordStore(tmp_path / "home")
    record = VerifyRecord(device_key=snap.device_key(), backend="flash-attn", backend_version="2.8.3",
                          ok=False, summary="max abs err 0.3 > 0.02")
    store.add_verify(dataclasses.replace(record, backend_version="2.8.2"))
    assert _verify_failure(snap, "flash-attn", tmp_path / "home") is None  # another version failed
    store.add_verify(record)
    assert _verify_failure(snap, "flash-attn", tmp_path / "home") == "max abs err 0.3 > 0.02"
    store.add_verify(dataclasses.replace(record, ok=True, summary="ok"))
    assert _verify_failure(snap, "flash-attn", tmp_path / "home") is None  # the newest one passed


def test_an_installed_backend_that_compiles_on_first_call_says_to_run_warmup(
        capsys: pytest.CaptureFixture[str]) -> None:
    """FlashAttention-4 is left out of measure-on-first-use (its kernels compile per variant on their first call):
    its install says how to let it compete; another backend's install says nothing of the kind."""
    from attnforge.cli.install import _render
    from attnforge.install.flow import InstallResult
    from attnforge.resolve.types import Plan, Request

    for backend, expected in (("flash-attn-4", True), ("flash-attn-3", False)):
        request = Request(backend=backend)
        _render(InstallResult(request=request, plan=Plan(request=request, candidates=()), action="cache-hit"))
        out = " ".join(capsys.readouterr().out.split())
        assert ("attnforge warmup" in out) is expected, out
