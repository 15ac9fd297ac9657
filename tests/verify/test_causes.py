"""Verify keeps the whole cause of a backend's exception and shows its first meaningful line (issue 31 item 5)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from attnforge.catalog.tolerances import load_tolerances
from attnforge.records import RecordStore
from attnforge.verify.cases import generate_cases
from attnforge.verify.causes import full_text, headline, output_headline
from attnforge.verify.check import CaseStatus, verify_backend
from attnforge.verify.device import current_device
from tests.verify.adapters import SdpaMathAdapter

CPU = current_device("cpu")
CASES = generate_cases(dtypes=("float32",), head_dims=(32,), max_seqlen=32, seed=5)

#: torch 2.13's text, read from a real torch.compile with torch._inductor.config.cpp.cxx = ("no-such-cxx",) on
#: this machine: the InductorError's message ends in dynamo's boilerplate, its __cause__ is InvalidCxxCompiler.
TORCH_TAIL = ("\n\nSet TORCHDYNAMO_VERBOSE=1 for the internal stack trace (please do this especially if you're "
              'reporting a bug to PyTorch). For even more developer context, set TORCH_LOGS="+dynamo"\n')
CXX_MESSAGE = "No working C++ compiler found in torch._inductor.config.cpp.cxx: ('no-such-cxx',)"


class InvalidCxxCompiler(RuntimeError):  # noqa: N818 - torch's own name
    pass


class InductorError(RuntimeError):
    pass


def _compile_error() -> InductorError:
    try:
        try:
            raise InvalidCxxCompiler(CXX_MESSAGE)
        except InvalidCxxCompiler as inner:
            raise InductorError(f"InvalidCxxCompiler: {CXX_MESSAGE}{TORCH_TAIL}") from inner
    except InductorError as outer:
        return outer


@dataclass
class NoCompilerAdapter(SdpaMathAdapter):
    name: str = "nocxx"

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
        raise _compile_error()


def test_the_headline_skips_torchs_boilerplate_and_names_the_missing_compiler() -> None:
    exc = _compile_error()
    assert f"{exc}".strip().splitlines()[-1].startswith("Set TORCHDYNAMO_VERBOSE")  # what used to be kept
    assert headline(exc) == f"InductorError: InvalidCxxCompiler: {CXX_MESSAGE}"


def test_a_message_of_only_boilerplate_falls_back_to_the_cause() -> None:
    exc = RuntimeError(TORCH_TAIL)
    exc.__cause__ = OSError("cab.so: file too short")
    assert headline(exc) == "RuntimeError: cab.so: file too short"
    assert headline(ValueError()) == "ValueError"


def test_the_full_text_has_every_exception_of_the_chain_and_where_it_was_raised() -> None:
    text = full_text(_compile_error())
    assert "InvalidCxxCompiler: No working C++ compiler found" in text
    assert "InductorError: InvalidCxxCompiler" in text
    assert "The above exception was the direct cause" in text
    assert "_compile_error" in text  # a frame of the traceback tail


def test_a_dead_childs_output_is_named_by_its_error_line_not_the_boilerplate_after_it() -> None:
    output = f"Traceback (most recent call last):\n  File \"x.py\", line 1\nInductorError: boom{TORCH_TAIL}"
    assert output_headline(output) == "InductorError: boom"
    assert output_headline("") == ""


def test_verify_records_the_chain_and_the_summary_names_the_compiler(attnforge_home: Path) -> None:
    res = verify_backend(NoCompilerAdapter(), device=CPU, cases=CASES[:2], tolerances=load_tolerances())
    assert not res.ok
    case = res.cases[0]
    assert case.status is CaseStatus.ERROR
    assert "No working C++ compiler found" in case.detail
    assert "No working C++ compiler found" in res.summary
    assert "TORCHDYNAMO_VERBOSE" not in res.summary
    store = RecordStore(attnforge_home)
    store.add_verify(res.to_record())
    stored = store.latest_verify(CPU.key)["nocxx"]
    cause = stored.details["cases"][0]["cause"]
    assert "The above exception was the direct cause" in cause
    assert "InvalidCxxCompiler" in cause


@pytest.mark.slow
def test_the_cli_shows_the_meaningful_line_and_the_chain_under_v(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from attnforge.backends import registry
    from attnforge.cli import main
    from attnforge.verify import run

    monkeypatch.setattr(registry, "adapters", lambda: {"nocxx": NoCompilerAdapter()})
    monkeypatch.setattr(run, "cases_for", lambda *a, **k: list(CASES[:1]))
    for verbose in (False, True):  # each backend runs in its own child: two runs, not more
        assert main(["verify", "nocxx", "--device", "cpu", *(["-v"] if verbose else [])]) == 1
        out = capsys.readouterr().out
        assert f"InductorError: InvalidCxxCompiler: {CXX_MESSAGE}" in " ".join(out.split())
        assert ("The above exception was the direct cause" in out) is verbose


@pytest.mark.integration
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch internals imported by inductor
def test_a_real_flex_compile_without_a_cxx_compiler_is_named_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real torch.compile of FlexAttention on CPU, with Inductor pointed at a compiler that does not exist:
    the case says so (it used to read "Set TORCHDYNAMO_VERBOSE=1 ...")."""
    import torch

    from attnforge.backends import registry
    from attnforge.backends.flex import FlexAdapter

    base = registry.adapters()["flex"]
    assert isinstance(base, FlexAdapter)
    flex = FlexAdapter(name="flex", caps=base.caps, requirement=base.requirement)  # torch.compile, on CPU
    monkeypatch.setattr(torch._inductor.config.cpp, "cxx", ("no-such-cxx",))
    res = verify_backend(flex, device=CPU, cases=CASES[:1], tolerances=load_tolerances())
    [case] = res.cases
    assert case.status is CaseStatus.ERROR
    assert "No working C++ compiler found" in case.detail, case.detail
    assert "InvalidCxxCompiler" in case.cause
