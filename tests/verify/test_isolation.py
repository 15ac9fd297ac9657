"""verify and bench run each backend in a child process: a real SIGSEGV, abort or hang is a recorded failure
naming the signal and the case, the parent lives on, and the command exits 1."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnforge._system.isolate import describe_exit
from attnforge._system.runner import SubprocessRunner
from attnforge.backends import registry
from attnforge.catalog.slim import Capabilities
from attnforge.catalog.tolerances import PrecisionKind, load_tolerances
from attnforge.cli import main
from attnforge.records import RecordStore
from attnforge.verify.cases import generate_cases
from attnforge.verify.device import current_device
from attnforge.verify.isolated import Isolation, crash_text, verify_in_child
from tests.verify._crashing import AbortAdapter, PoisonAdapter, SegvAdapter, adapters

TINY = ["--device", "cpu", "--head-dim", "32", "--seqlen", "64"]


@pytest.fixture(autouse=True)
def crashing_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import torch

    real = registry.adapters()
    monkeypatch.setattr(registry, "adapters", lambda: {**real, **adapters()})
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.mark.slow
def test_verify_records_a_sigsegv_and_a_hang_and_exits_1(
    attnforge_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parent = os.getpid()
    # a generous timeout where a crash is expected (a loaded CI machine is slow), a short one for the hang: long
    # enough for the child to start and reach its first case on a loaded machine (the summary then names the case)
    assert main(["verify", "segv", "sdpa-math", "--device", "cpu", "--timeout", "300", "--json"]) == 1
    by_name = {r["backend"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert main(["verify", "hang", "--device", "cpu", "--timeout", "10", "--json"]) == 1
    by_name.update({r["backend"]: r for r in json.loads(capsys.readouterr().out)["results"]})
    assert os.getpid() == parent  # still the same, living process
    assert by_name["segv"]["ok"] is False
    assert by_name["segv"]["summary"].startswith("SIGSEGV on bfloat16 D=")
    assert "float32" in json.dumps([c for c in by_name["segv"]["cases"] if c["status"] == "passed"])
    assert by_name["hang"]["ok"] is False
    assert by_name["hang"]["summary"].startswith("hang (no result within 10 s, killed) on ")  # in a case, not before
    assert by_name["sdpa-math"]["ok"] is True  # the backends after a crash still ran
    records = RecordStore(attnforge_home).latest_verify(current_device("cpu").key)
    assert records["segv"].ok is False and "SIGSEGV" in records["segv"].summary
    assert records["hang"].ok is False and "hang" in records["hang"].summary


@pytest.mark.slow
def test_bench_records_a_sigsegv_and_a_hang_and_exits_1(
    attnforge_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", *TINY, "--dtype", "bf16", "--mode", "fwd", "--causal", "off", "--json", "--max-noise", "1e6"]
    assert main([*argv, "segv", "--timeout", "300"]) == 1
    captured = capsys.readouterr()
    cells = {c["backend"]: c for row in json.loads(captured.out)["rows"] for c in row["cells"]}
    assert main([*argv, "hang", "--timeout", "15"]) == 1  # the SDPA baseline's timed child has it too: 8 s was short
    cells["hang"] = next(c for row in json.loads(capsys.readouterr().out)["rows"] for c in row["cells"]
                         if c["backend"] == "hang")
    assert cells["segv"]["status"] == "error" and cells["segv"]["detail"].startswith("SIGSEGV on bfloat16 D=32")
    assert cells["hang"]["status"] == "error" and "hang (no result within 15 s" in cells["hang"]["detail"]
    assert cells["sdpa"]["status"] == "ok"  # the baseline ran in its own child
    assert "error: segv crashed during bench: SIGSEGV" in captured.err
    store = RecordStore(attnforge_home)
    key = current_device("cpu").key
    verdicts = store.latest_verify(key)
    assert verdicts["segv"].ok is False and verdicts["hang"].ok is False  # the dispatcher will not use them
    assert {r.backend for r in store.bench_records(key)} == {"sdpa"}


@pytest.mark.slow
def test_an_abort_is_named_and_cases_outside_the_capabilities_are_not_run() -> None:
    device = current_device("cpu")
    cases = tuple(generate_cases(dtypes=("float32", "bfloat16"), head_dims=(32,), max_seqlen=64, seed=0))
    common = {"device": device, "cases": cases, "tolerances": load_tolerances(), "kind": PrecisionKind.EXACT,
                  "native": None, "isolation": Isolation(timeout_s=60), "runner": SubprocessRunner(),
                  "environ": dict(os.environ)}
    aborted = verify_in_child("abort", adapter=AbortAdapter(), caps=None, **common)  # type: ignore[arg-type]
    assert not aborted.ok and aborted.summary.startswith("SIGABRT on float32 D=32")
    poisoned = verify_in_child("poison", adapter=PoisonAdapter(), caps=None, **common)  # type: ignore[arg-type]
    assert not poisoned.ok and "illegal memory access" in poisoned.summary
    assert "poisoned the CUDA context" in poisoned.summary  # the child stopped after the first such error
    assert sum(c.status.value == "error" for c in poisoned.cases) == 1
    bf16_less = Capabilities(head_dims=(64,), dtypes=("float32",), backward=True, features=())
    fine = verify_in_child("segv", adapter=SegvAdapter(), caps=bf16_less, **common)  # type: ignore[arg-type]
    assert fine.ok, fine.summary  # the bfloat16 cases that would crash are skipped, with the reason
    skipped = [c for c in fine.cases if c.status.value == "skipped"]
    assert skipped and all("this build has no bfloat16 kernels" in c.detail for c in skipped)


def test_the_crash_text_names_the_missing_capability() -> None:
    caps = Capabilities(head_dims=(128,), dtypes=("bfloat16",), backward=True, features=())
    assert crash_text("SIGSEGV", "float16", 128, caps) == \
        "SIGSEGV on float16 D=128: this build has no float16 kernels (it has bfloat16)"
    assert crash_text("SIGSEGV", "bfloat16", 256, caps).endswith("this build has no head dim 256 kernels (it has 128)")
    assert crash_text("SIGBUS", "bfloat16", 64, None) == "SIGBUS on bfloat16 D=64: the kernel took its process down"


@pytest.mark.parametrize(
    ("code", "stderr", "text"),
    [(-11, "", "SIGSEGV"), (-6, "", "SIGABRT"), (124, "timed out after 5 s", "hang (no result within 5 s, killed)"),
     (1, "Traceback...\nKeyError: 'x'", "exit status 1 (KeyError: 'x')"),
     (0xC0000005, "", "access violation (0xC0000005, Windows' SIGSEGV)")],
)
def test_describe_exit(code: int, stderr: str, text: str) -> None:
    assert describe_exit(code, stderr, 5) == text


def test_bench_does_not_measure_outside_the_capabilities() -> None:
    from attnforge.bench.grid import ShapeSet
    from attnforge.bench.isolated import bench_in_children
    from attnforge.bench.select import choose_shapes, choose_timing

    device = current_device("cpu")
    shapes = choose_shapes(ShapeSet.DEFAULT, device=device, dtype="bfloat16", causal="off", mode="both",
                           batch=None, heads_q=None, heads_kv=None, head_dims=(32,), seqlens=(64,), seqlen_k=None)
    fwd_only_bf16 = Capabilities(head_dims=(64,), dtypes=("bfloat16",), backward=False, features=())
    got = bench_in_children(shapes, adapters={"segv": SegvAdapter()}, baseline="segv", device=device,
                            timing=choose_timing(device, "auto"), isolation=Isolation(timeout_s=60),
                            runner=SubprocessRunner(), environ=dict(os.environ), caps=lambda _: fwd_only_bf16)
    # forward bf16 is inside and crashes (the build claims it, so that is a real failure); fwd+bwd is skipped
    by_mode = {row.shape.mode.value: row.cells[0] for row in got.report.rows}
    assert by_mode["fwd"].status.value == "error" and by_mode["fwd"].detail.startswith("SIGSEGV on bfloat16 D=32")
    assert by_mode["fwd+bwd"].status.value == "skipped"
    assert by_mode["fwd+bwd"].detail == \
        "outside this build's capabilities: this build has no backward kernels (forward only)"
    assert set(got.crashes) == {"segv"}


def test_doctor_shows_the_crash_and_does_not_call_the_backend_fastest(tmp_path: Path) -> None:
    from attnforge.catalog import load_catalog
    from attnforge.probe.snapshot import SystemSnapshot
    from attnforge.records import VerifyRecord
    from attnforge.report.doctor import doctor_report
    from tests._fakes import FIXTURES

    doc = json.loads((FIXTURES / "snapshots" / "h200_torch2.11_cu130.json").read_text())
    doc["backends"] = [b for b in doc["backends"] if b["backend"] != "flash-attn-3"] + [
        {"backend": "flash-attn-3", "distribution": "flash-attn-3", "version": "3.0.0b1", "imports": True,
         "native": [{"name": "flash_attn_3._C", "ok": True}]}]
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(doc))
    crash = "SIGSEGV on float16 D=128: this build has no float16 kernels (it has bfloat16)"
    record = VerifyRecord(device_key="k", backend="flash-attn-3", backend_version="3.0.0b1", ok=False,
                          summary=f"{crash} (the child process died; 48 case(s) passed before)")
    report = doctor_report(SystemSnapshot.load(path), load_catalog(), verified={"flash-attn-3": record})
    row = next(r for r in report.rows if r.backend == "flash-attn-3")
    assert row.status.value == "broken" and crash in (row.problem or "")
    assert "flash-attn-3" not in report.verdict.fastest_now


def test_a_failed_feature_case_in_the_child_takes_only_that_feature_away() -> None:
    """The child's verdict follows verify's one rule (``verify.check.all_ok``): on the H100 run of 2026-11-25 flex
    failed only its causal_top_left cases, the child called the whole backend failed, and a Gemma-2 call that flex
    serves went to the exact math (29x slower)."""
    from attnforge.verify.cases import feature_cases
    from tests.verify._crashing import SoftcapBrokenAdapter

    device = current_device("cpu")
    plain = generate_cases(dtypes=("float32",), head_dims=(32,), max_seqlen=64, seed=0)
    cases = (*plain, *feature_cases(frozenset({"softcap"}), dtypes=("float32",), head_dims=(32,), max_seqlen=64))
    result = verify_in_child("softcap-broken", adapter=SoftcapBrokenAdapter(), caps=None, device=device,  # type: ignore[arg-type]
                             cases=cases, tolerances=load_tolerances(), kind=PrecisionKind.EXACT, native=None,
                             isolation=Isolation(timeout_s=60), runner=SubprocessRunner(), environ=dict(os.environ))
    assert result.ok, result.summary
    assert result.failed_features == ("softcap",)
    assert "not used for softcap" in result.summary


@pytest.mark.usefixtures("ctrl_c_raises")
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_a_stopped_bench_keeps_the_backends_it_finished(
    attnforge_home: Path, capsys: pytest.CaptureFixture[str], signum: int, code: int
) -> None:
    """Ctrl-C or SIGTERM while a backend's child runs: the backends done before are stored (the dispatcher
    reads them), the child is killed, and the command says what it kept and exits 128 + signum."""
    store = RecordStore(attnforge_home)
    key = current_device("cpu").key
    sent, finished = threading.Event(), threading.Event()

    def stop_once_sdpa_is_stored() -> None:  # the baseline runs first; `hang` then never returns
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not finished.is_set() and not store.bench_records(key):
            time.sleep(0.2)
        time.sleep(0.5)  # into the hang's child
        if not finished.is_set():  # never into a later test, should bench have returned on its own
            sent.set()
            os.kill(os.getpid(), signum)

    watcher = threading.Thread(target=stop_once_sdpa_is_stored, daemon=True)
    watcher.start()
    try:
        rc = main(["bench", "hang", *TINY, "--dtype", "bf16", "--mode", "fwd", "--causal", "off",
                   "--timeout", "300", "--json", "--max-noise", "1e6"])  # sdpa's cell is stored, however loaded
    finally:
        finished.set()
    watcher.join(timeout=5)
    err = capsys.readouterr().err
    assert sent.is_set() and rc == code
    assert "bench: sdpa done (1 of 2 backends" in err
    assert "bench stopped:" in err and "stored in" in err and "not measured: hang" in err
    assert {r.backend for r in store.bench_records(key)} == {"sdpa"}
    assert "hang" not in store.latest_verify(key)  # stopped by the user: not a verdict on the backend


def test_a_python_exception_in_the_bench_child_is_an_error_cell_not_a_crash_record() -> None:
    """The child's own code raising (a harness fault) used to be taken for the backend's crash: a failed verify
    record, and doctor then called the backend unverified. Now: error cells naming the exception, no crash."""
    from attnforge.bench.grid import ShapeSet
    from attnforge.bench.isolated import bench_in_children, crash_records
    from attnforge.bench.select import choose_shapes, choose_timing
    from tests.verify._crashing import UnbuildableAdapter

    device = current_device("cpu")
    shapes = choose_shapes(ShapeSet.DEFAULT, device=device, dtype="float32", causal="off", mode="fwd",
                           batch=None, heads_q=None, heads_kv=None, head_dims=(32,), seqlens=(64,), seqlen_k=None)
    got = bench_in_children(shapes, adapters={"unbuildable": UnbuildableAdapter()}, baseline="unbuildable",
                            device=device, timing=choose_timing(device, "auto"), isolation=Isolation(timeout_s=60),
                            runner=SubprocessRunner(), environ=dict(os.environ))
    cells = [row.cells[0] for row in got.report.rows]
    assert cells and all(c.status.value == "error" for c in cells)
    assert all("raised ValueError: this adapter cannot be rebuilt in a child" in (c.detail or "") for c in cells)
    assert got.crashes == {} and crash_records(got, device) == []
