"""The doctor report over snapshot fixtures: statuses, next steps and the verdict."""

from __future__ import annotations

import dataclasses

import pytest

from attnforge.catalog import load_catalog
from attnforge.probe import GpuInfo, InstalledBackend, NativeModule, SystemSnapshot
from attnforge.records import BenchRecord, VerifyRecord
from attnforge.report.doctor import SEE_BLOCKER, Status, doctor_report
from attnforge.report.preflight import build_blockers
from tests._fakes import FIXTURES

CATALOG = load_catalog()


def _snap(name: str) -> SystemSnapshot:
    return SystemSnapshot.load(FIXTURES / "snapshots" / name)


H200 = _snap("h200_torch2.11_cu130.json")
CPU = _snap("cpu_dev_torch2.13_cpu.json")


def _rows(snap: SystemSnapshot, **kw):  # type: ignore[no-untyped-def]
    report = doctor_report(snap, CATALOG, build_blockers=build_blockers(snap, CATALOG), **kw)
    return report, {r.backend: r for r in report.rows}


def _with_backend(snap: SystemSnapshot, inst: InstalledBackend) -> SystemSnapshot:
    others = tuple(b for b in snap.backends if b.backend != inst.backend)
    return dataclasses.replace(snap, backends=(*others, inst))


def test_cpu_machine_says_cpu_build_once_and_why_flash_attn_cannot_be_built() -> None:
    report, rows = _rows(CPU)
    assert report.blocker is not None and "2.13.0+cpu is a CPU build" in report.blocker
    assert "install a CUDA build of torch" in report.blocker
    assert rows["sdpa-math"].status is Status.READY
    assert all(r.status is Status.UNSUPPORTED for k, r in rows.items() if k != "sdpa-math")
    fa2 = rows["flash-attn"]
    assert fa2.problem is not None and fa2.problem.startswith("cannot be built here")
    assert "CPU-only build" in fa2.problem and "no GPU" in fa2.problem
    assert fa2.next_step == SEE_BLOCKER
    assert report.verdict.fastest_now == "SDPA math"
    assert "CPU build" in report.verdict.to_go_faster
    assert any("GPU: none found" in line for line in report.system)
    assert any(line.startswith("nvcc 13.0") for line in report.system)
    assert any("gcc 12" in line for line in report.system)


def test_h200_without_packages_recommends_flash_attn_4() -> None:
    report, rows = _rows(H200)
    assert report.blocker is None
    for sdpa in ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math", "flex"):
        assert rows[sdpa].status is Status.READY, sdpa
    assert rows["flash-attn"].status is Status.MISSING
    assert rows["flash-attn"].next_step == "attnforge install flash-attn"
    assert rows["flash-attn-4"].gpu_support == "yes"
    # FA3 is faster than cuDNN in the catalog's priority but FA4 comes first (priority 10).
    assert report.verdict.fastest_now == "SDPA cuDNN"
    assert "FlashAttention-4" in report.verdict.to_go_faster
    assert "attnforge install flash-attn-4" in report.verdict.to_go_faster


def test_bench_records_drive_the_verdict() -> None:
    key = H200.device_key()
    bench = [BenchRecord(device_key=key, backend=b, backend_version=None, dtype="bfloat16", mode="fwd", causal=False,
                         batch=1, heads_q=16, heads_kv=16, head_dim=128, seqlen_q=16384, seqlen_k=16384, ms=1.0,
                         tflops=t, peak_mem_bytes=None, run_id="r") for b, t in [("sdpa-cudnn", 612.0),
                                                                                 ("sdpa-flash", 400.0)]]
    ok = {b: VerifyRecord(device_key=key, backend=b, backend_version=None, ok=True, summary="ok")
          for b in ("sdpa-cudnn", "sdpa-flash")}
    report, _ = _rows(H200, bench=bench, verified=ok)
    assert report.verdict.fastest_now == "SDPA cuDNN"
    assert "612 TFLOP/s" in report.verdict.evidence
    # the one rule: never an unverified backend, even when it measured fastest
    report, _ = _rows(H200, bench=bench, verified={"sdpa-flash": ok["sdpa-flash"]})
    assert report.verdict.fastest_now != "SDPA cuDNN"
    assert "400 TFLOP/s" in report.verdict.evidence


def test_xformers_cuda_12_wheel_under_cu130_torch_names_the_real_cause() -> None:
    """Seen on the H200: PyPI's xformers 0.0.35 is the cu128 build; 'built for PyTorch 2.10' is not the cause."""
    details = ("xformers._cpp_lib.xFormersInvalidLibException: xFormers can't load C++/CUDA extensions. "
               "xFormers was built for:", "PyTorch 2.10.0+cu128 with CUDA 1208 (you have 2.11.0+cu130)",
               "Python  3.10.19 (you have 3.12.3)")
    inst = InstalledBackend(backend="xformers", distribution="xformers", version="0.0.35", imports=True,
                            native=(NativeModule(name="xformers._C", ok=False,
                                                 error="OSError: libcudart.so.12: cannot open shared object file"),),
                            details=details)
    _, rows = _rows(_with_backend(H200, inst))
    row = rows["xformers"]
    assert row.status is Status.BROKEN
    assert row.problem == ("xFormers 0.0.35 is a CUDA 12.8 build (its _C needs libcudart.so.12) but torch is a "
                           "CUDA 13.0 build: its CUDA kernels are not loaded")
    assert "--index-url https://download.pytorch.org/whl/cu130" in row.next_step


def test_missing_xformers_points_at_the_pytorch_index_of_this_cuda() -> None:
    _, rows = _rows(H200)
    assert rows["xformers"].next_step == "attnforge install xformers --index-url https://download.pytorch.org/whl/cu130"


def test_xformers_built_for_another_torch_is_broken_with_the_reason() -> None:
    details = ("WARNING[XFORMERS]: xFormers can't load C++/CUDA extensions. xFormers was built for:",
               "PyTorch 2.10.0+cu130 with CUDA 1300 (you have 2.11.0+cu130)",
               "Python  3.10.18 (you have 3.12.3)")
    inst = InstalledBackend(backend="xformers", distribution="xformers", version="0.0.35", imports=True,
                            native=(NativeModule(name="xformers._C", ok=False,
                                                 error="ImportError: undefined symbol"),), details=details)
    _, rows = _rows(_with_backend(H200, inst))
    row = rows["xformers"]
    assert row.status is Status.BROKEN
    assert row.problem is not None
    assert "built for PyTorch 2.10.0+cu130 / Python 3.10, you have 2.11.0+cu130 / 3.12" in row.problem
    assert "pip uninstall xformers" in row.next_step


def test_broken_native_module_of_a_built_backend_suggests_a_rebuild() -> None:
    inst = InstalledBackend(backend="flash-attn", distribution="flash-attn", version="2.8.3", imports=False,
                            import_error="ImportError: flash_attn_2_cuda...so: undefined symbol: _ZN3c10",
                            native=(NativeModule(name="flash_attn_2_cuda", ok=False, error="undefined symbol"),))
    _, rows = _rows(_with_backend(H200, inst))
    assert rows["flash-attn"].status is Status.BROKEN
    assert "--from-source" in rows["flash-attn"].next_step


def test_verified_and_unverified_installed_backend() -> None:
    inst = InstalledBackend(backend="flash-attn-4", distribution="flash-attn-4", version="4.0.0b36", imports=True)
    snap = _with_backend(H200, inst)
    _, rows = _rows(snap)
    assert rows["flash-attn-4"].status is Status.READY
    assert rows["flash-attn-4"].next_step == "attnforge verify flash-attn-4"
    ok = VerifyRecord(device_key="k", backend="flash-attn-4", backend_version="4.0.0b36", ok=True, summary="ok")
    _, rows = _rows(snap, verified={"flash-attn-4": ok})
    assert rows["flash-attn-4"].verified is True and rows["flash-attn-4"].next_step == "ready"
    bad = dataclasses.replace(ok, ok=False, summary="bf16 d=128: max abs err 0.4 > 0.02")
    _, rows = _rows(snap, verified={"flash-attn-4": bad})
    assert rows["flash-attn-4"].status is Status.BROKEN
    assert "max abs err" in (rows["flash-attn-4"].problem or "")


@pytest.mark.parametrize(
    ("cc", "unsupported"),
    [
        pytest.param((7, 5), {"flash-attn", "flash-attn-3", "flash-attn-4", "sdpa-flash", "sdpa-cudnn", "flex",
                               "sageattention-2"}, id="turing"),
        pytest.param((12, 0), {"flash-attn-3"}, id="rtx5090-no-fa3"),
    ],
)
def test_compute_capability_gates(cc: tuple[int, int], unsupported: set[str]) -> None:
    gpu = dataclasses.replace(H200.gpus[0], compute_capability=cc, name="some GPU")
    _, rows = _rows(dataclasses.replace(H200, gpus=(gpu,)))
    got = {k for k, r in rows.items() if r.status is Status.UNSUPPORTED}
    assert got == unsupported
    for k in unsupported:
        assert f"this GPU is {cc[0]}.{cc[1]}" in rows[k].gpu_support


def test_no_torch_blocks_everything_but_says_how_to_fix() -> None:
    report, rows = _rows(dataclasses.replace(H200, torch=None))
    assert report.blocker is not None and "install a CUDA build of torch" in report.blocker
    assert all(r.status is Status.UNSUPPORTED for r in rows.values())


def test_cuda_torch_without_gpu() -> None:
    report, _ = _rows(dataclasses.replace(H200, gpus=()))
    assert report.blocker is not None and report.blocker.startswith("no NVIDIA GPU found")


def test_device_keys() -> None:
    assert H200.device_key() == "NVIDIA H200|9.0|torch 2.11.0+cu130"
    assert CPU.device_key() == "cpu|torch 2.13.0+cpu"
    gpu_only = dataclasses.replace(CPU, gpus=(GpuInfo(index=0, name="X", compute_capability=(8, 0), memory_bytes=None,
                                                      driver_version=None, cuda_driver_version=None, source="nvml"),))
    assert gpu_only.device_key() == "cpu|torch 2.13.0+cpu"  # a CPU torch cannot use it


@pytest.mark.parametrize(("fa3_version", "rebind"), [("3.0.0+cu130torch2.9.stable.sm90", True),
                                                    ("3.0.0+cu130torch2.11.cxx11abitrue.sm90", False),
                                                    ("3.0.0", False)])
def test_a_stable_abi_fa3_is_offered_the_build_bound_to_this_torch(fa3_version: str, rebind: bool) -> None:
    """With every faster backend ready and verified, an FA3 whose attnforge label says stable ABI is offered
    ``--abi torch`` (its calls are boxed); one bound to this torch, or one with no label, is not."""
    fa3 = InstalledBackend(backend="flash-attn-3", distribution="flash-attn-3", version=fa3_version, imports=True,
                           native=(NativeModule(name="flash_attn_3._C", ok=True),))
    fa4 = InstalledBackend(backend="flash-attn-4", distribution="flash-attn-4", version="4.0.0b36", imports=True)
    snap = _with_backend(_with_backend(H200, fa3), fa4)
    key = snap.device_key()
    verified = {b: VerifyRecord(device_key=key, backend=b, backend_version=v, ok=True, summary="ok")
                for b, v in (("flash-attn-3", fa3_version), ("flash-attn-4", "4.0.0b36"))}
    report, rows = _rows(snap, verified=verified)
    assert rows["flash-attn-3"].status is Status.READY
    said = report.verdict.to_go_faster
    assert ("attnforge install flash-attn-3 --abi torch" in said) is rebind, said
    gain = CATALOG.recipe("flash-attn-3").per_torch.gain  # type: ignore[union-attr]
    assert (gain in said) is rebind, said  # what the recipe's data says the bound build saves
    assert rebind or said.startswith("nothing faster is known"), said  # not an earlier branch's advice
