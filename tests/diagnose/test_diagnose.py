"""Diagnosis of real recorded logs and of the real error strings behind every failure signature."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnforge.catalog.failures import load_failures
from attnforge.diagnose import diagnose_file, diagnose_text
from attnforge.probe.snapshot import SystemSnapshot
from tests._fakes import FIXTURES

LOGS = FIXTURES / "logs"
CPU = SystemSnapshot.load(FIXTURES / "snapshots" / "cpu_dev_torch2.13_cpu.json")
H200 = SystemSnapshot.load(FIXTURES / "snapshots" / "h200_torch2.11_cu130.json")


def test_real_out_of_memory_log_points_at_the_compiler_line_not_the_wrappers() -> None:
    d = diagnose_file(LOGS / "af_ext_fixture_ulimit_v_800000.log", name="af_ext_fixture")
    assert d.known
    assert d.signature == "out-of-memory"
    assert [(e.line, e.text) for e in d.evidence] == [
        (30, "virtual memory exhausted: Cannot allocate memory")
    ]
    assert d.failed_target is not None
    assert d.failed_target.endswith("af_ext_fixture/add.o")
    assert any("--jobs 1" in step for step in d.fix)


def test_real_build_isolation_log() -> None:
    d = diagnose_file(LOGS / "af_ext_fixture_build_isolation.log", name="af_ext_fixture")
    assert d.signature == "build-isolation-no-torch"
    assert any("No module named 'torch'" in e.text for e in d.evidence)
    assert any("--no-build-isolation" in step for step in d.fix)


def test_a_successful_log_is_not_a_known_failure() -> None:
    d = diagnose_file(LOGS / "flash_attn-2.8.3.post2_sm90_cu130_success.log")
    assert not d.known
    assert d.signature is None
    assert "successful build" in d.cause


# One real line per signature (quoted in shared/research/install-anchors.md section 10 and its sources).
EXAMPLES = [
    (
        "build-isolation-no-torch",
        "  Getting requirements to build wheel: started\n  ModuleNotFoundError: No module named 'torch'",
    ),
    ("torch-not-installed", "    import torch\nModuleNotFoundError: No module named 'torch'"),
    (
        "cuda-home-missing",
        "OSError: CUDA_HOME environment variable is not set. Please set it to your CUDA install root.",
    ),
    (
        "cutlass-missing",
        "AssertionError: csrc/cutlass is missing, please use source distribution or git clone",
    ),
    ("nvcc-too-old", "RuntimeError: FlashAttention is only supported on CUDA 11.7 and above."),
    (
        "no-target-archs",
        "RuntimeError: No target compute capabilities. Set TORCH_CUDA_ARCH_LIST or build on a machine "
        "with GPUs.",
    ),
    ("unknown-torch-arch", "ValueError: Unknown CUDA arch (12.1) or GPU not supported"),
    (
        "cuda-major-mismatch",
        "RuntimeError: The detected CUDA version (12.4) mismatches the version that was used to "
        "compile PyTorch (13.0). Please make sure to use the same CUDA versions.",
    ),
    ("unsupported-gpu-arch", "nvcc fatal   : Unsupported gpu architecture 'compute_128'"),
    (
        "unsupported-gcc",
        "/usr/local/cuda/include/crt/host_config.h:143:2: error: #error -- unsupported GNU version! "
        "gcc versions later than 13 are not supported!",
    ),
    (  # the Windows catalog's sharper signature (with its three fixes) wins over generic unsupported-msvc
        "win-msvc-too-new-for-nvcc",
        "host_config.h(164): fatal error C1189: #error:  -- unsupported Microsoft Visual Studio "
        "version! Only the versions between 2017 and 2022 (inclusive) are supported!",
    ),
    ("out-of-memory", "nvcc error   : 'cicc' died due to signal 9 (Kill signal)"),
    ("compiler-crash", "nvcc error   : 'ptxas' died due to signal 11 (Invalid memory reference)"),
    # nvcc's message without the host_config.h prefix (wrapped onto its own line): only the generic one matches
    ("unsupported-msvc", "#error:  -- unsupported Microsoft Visual Studio version! Only the versions between 2017 "
                         "and 2022"),
    ("win-std-ambiguous", "compiled_autograd.h(1134): error C2872: 'std': ambiguous symbol"),
    ("msvc-conformance", "flash_api.cpp(310): error C7555: use of designated initializers requires at least "
                         "'/std:c++20'"),
    (
        "long-paths",
        "ninja: error: Stat(C:/Users/me/flash-attention/build/temp.win-amd64-cpython-312/Release/x.obj): "
        "Filename longer than 260 characters",
    ),
    (
        "missing-cl",
        "UserWarning: Error checking compiler version for cl: [WinError 2] The system cannot find the "
        "file specified",
    ),
    (
        "distutils-use-sdk",
        "UserWarning: It seems that the VC environment is activated but DISTUTILS_USE_SDK is not "
        "set.This may lead to multiple activations of the VC env.",
    ),
    (
        "ninja-missing",
        "UserWarning: Attempted to use ninja as the BuildExtension backend but we could not find "
        "ninja.. Falling back to using the slow distutils backend.",
    ),
    ("disk-full", "OSError: [Errno 28] No space left on device"),
    ("source-compile-error", "/src/csrc/add.cpp:12:5: error: 'foo' was not declared in this scope"),
    ("linker-error", "/usr/bin/ld: cannot find -lcudart: No such file or directory"),
    ("no-matching-distribution", "ERROR: No matching distribution found for flash-attn==9.9.9"),
    (
        "undefined-symbol",
        "ImportError: /venv/lib/python3.12/site-packages/flash_attn_2_cuda.cpython-312-x86_64-linux-"
        "gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEi",
    ),
    (
        "win-dll-procedure-not-found",
        "ImportError: DLL load failed while importing flash_attn_2_cuda: The specified procedure "
        "could not be found.",
    ),
    ("dll-load-failed", "ImportError: DLL load failed while importing _C: Access is denied."),
    (
        "glibc-too-old",
        "ImportError: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.32' not found (required by "
        "flash_attn_2_cuda.so)",
    ),
    ("no-kernel-image", "RuntimeError: CUDA error: no kernel image is available for execution on the device"),
    (
        "xformers-built-for",
        "WARNING[XFORMERS]: xFormers can't load C++/CUDA extensions. xFormers was built for:\n"
        "    PyTorch 2.5.1+cu121 with CUDA 1201 (you have 2.6.0+cpu)",
    ),
    ("fa-ampere-only", "RuntimeError: FlashAttention only supports Ampere GPUs or newer."),
    ("file-outside-source-tree", "FileNotFoundError: [Errno 2] No such file or directory: '../README.md'"),
    ("cutlass-headers-missing", "/b/hopper/flash.h:9:10: fatal error: cute/tensor.hpp: No such file or directory"),
    ("slim-build-outside-capabilities", "RuntimeError: This flash attention build does not support FP16."),
]


@pytest.mark.parametrize(("expected", "log"), [pytest.param(s, t, id=s) for s, t in EXAMPLES])
def test_each_signature_recognises_its_real_error(expected: str, log: str) -> None:
    d = diagnose_text("some earlier output\n" + log + "\nerror: subprocess-exited-with-error\n")
    assert d.signature == expected
    signature = load_failures().get(expected)
    assert signature is not None
    groups = {g for p in signature.patterns for g in p.groupindex}
    assert not any(f"<{g}>" in d.cause for g in groups), f"a group of the match is unfilled: {d.cause}"


def test_every_packaged_signature_without_conditions_has_an_example() -> None:
    unconditional = {s.id for s in load_failures().signatures if not s.when}
    windows_tested_elsewhere = {i for i in unconditional if i.startswith("win-")}  # test_windows_signatures.py
    examples = {s for s, _ in EXAMPLES}
    assert unconditional - windows_tested_elsewhere == examples - windows_tested_elsewhere


def test_the_failed_block_wins_over_errors_elsewhere_and_names_the_source_location() -> None:
    log = "\n".join(
        [
            "  [1/2] c++ -MMD -MF /b/add.o.d -I/torch/include -c -c /src/add.cpp -o /b/add.o -DTORCH_EXT=_C",
            "  FAILED: [code=1] /b/add.o",
            "  c++ -MMD -MF /b/add.o.d -I/torch/include -c -c /src/add.cpp -o /b/add.o -DTORCH_EXT=_C -DX=1",
            "  /src/add.cpp:7:1: error: expected ';' before '}' token",
            "  ninja: build stopped: subcommand failed.",
            "  RuntimeError: Error compiling objects for extension",
            "ImportError: x.so: undefined symbol: _ZN3c10foo",
        ]
    )
    d = diagnose_text(log)
    assert d.signature == "source-compile-error"
    assert d.location == "/src/add.cpp:7"
    assert d.cause == "/src/add.cpp:7 does not compile: expected ';' before '}' token"
    assert d.failed_target == "/b/add.o"
    assert [e.line for e in d.evidence] == [4]


def test_wrapper_lines_alone_are_not_a_cause() -> None:
    log = (
        "  ninja: build stopped: subcommand failed.\n"
        "  subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status 1.\n"
        "  RuntimeError: Error compiling objects for extension\n"
        "  error: subprocess-exited-with-error\n"
    )
    d = diagnose_text(log, log_path="x.log")
    assert not d.known
    assert d.cause.startswith("attnforge does not recognise this failure")
    assert not any("ninja: build stopped" in e.text for e in d.evidence)


CUDA_HOME_LOG = (
    "  torch.__version__  = 2.13.0+cpu\n"
    "  OSError: CUDA_HOME environment variable is not set. Please set it to your CUDA install root.\n"
)
CUDA_HOME_ONLY = "  OSError: CUDA_HOME environment variable is not set. Please set it to your CUDA install root.\n"


@pytest.mark.parametrize(
    ("log", "snapshot", "expected"),
    [
        pytest.param(CUDA_HOME_LOG, CPU, "cuda-home-cpu-torch", id="cpu-torch-explains-it"),
        pytest.param(CUDA_HOME_ONLY, CPU, "cuda-home-cpu-torch", id="snapshot-cpu-torch-explains-it"),
        pytest.param(CUDA_HOME_ONLY, H200, "cuda-home-missing", id="cuda-torch-toolkit-problem"),
        pytest.param(CUDA_HOME_ONLY, None, "cuda-home-missing", id="nothing-says-cpu"),
        # the log's own words outrank a snapshot: build isolation can pull a CPU torch into a CUDA machine's build
        pytest.param(CUDA_HOME_LOG, H200, "cuda-home-cpu-torch", id="log-says-cpu-over-snapshot"),
        pytest.param(CUDA_HOME_LOG, None, "cuda-home-cpu-torch", id="log-says-cpu-without-snapshot"),
    ],
)
def test_the_root_cause_outranks_the_symptom_of_cuda_home_not_set(
    log: str, snapshot: SystemSnapshot | None, expected: str
) -> None:
    d = diagnose_text(log, snapshot=snapshot, name="flash-attn")
    assert d.signature == expected
    if expected == "cuda-home-cpu-torch":
        assert "2.13.0+cpu" in d.cause
        assert "CPU-only" in d.cause
    if snapshot is CPU:
        assert any("download.pytorch.org/whl/cu130" in step for step in d.fix), "cu130 from the 13.0 toolkit"


def test_placeholders_come_from_the_match_and_the_snapshot() -> None:
    log = "nvcc fatal   : Unsupported gpu architecture 'compute_70'"
    with_snapshot = diagnose_text(log, snapshot=H200, name="flash-attn", log_path="/l.log")
    assert with_snapshot.cause.startswith("nvcc 13.0 cannot compile for compute_70")
    assert any(step.startswith("attnforge build flash-attn --arch") for step in with_snapshot.fix)
    assert with_snapshot.notes == ()
    probed = diagnose_text(log, machine=H200)
    assert probed.cause.startswith("nvcc 13.0 cannot compile for compute_70")
    assert any("this machine's probe" in n for n in probed.notes)
    without = diagnose_text(log)
    assert without.cause.startswith("nvcc <this machine's nvcc version> cannot compile for compute_70")


def test_unreadable_log_is_a_usage_error(tmp_path: Path) -> None:
    from attnforge.errors import UsageError

    with pytest.raises(UsageError, match="cannot read the log"):
        diagnose_file(tmp_path / "missing.log")


# issue 31 item 8: the log's own nvcc, not this machine's. The fixture is composed: attnforge's own log header
# (build/execute.py _log_header), pip's and torch cpp_extension's lines around a ninja FAILED block in the shape
# of the real RTX 5090 log in Dao-AILab/flash-attention#1563, with CUDA 12.4's `nvcc --version` banner
# (release 12.4, V12.4.131) and nvcc's own "Unsupported gpu architecture 'compute_120'" line.
NVCC_124_LOG = FIXTURES / "logs" / "flash_attn-2.8.3_sm120_nvcc12.4_unsupported_arch.log"


@pytest.mark.parametrize("where", ["snapshot", "machine"])
def test_an_old_nvcc_in_the_log_is_blamed_not_this_machines_nvcc(where: str) -> None:
    machine = {where: H200}  # this machine (or the snapshot) has nvcc 13.0, which could build sm_120
    d = diagnose_file(NVCC_124_LOG, name="flash-attn", **machine)
    assert d.signature == "unsupported-gpu-arch"
    assert d.cause == ("nvcc 12.4 cannot compile for compute_120: compute_120 needs CUDA >= 12.8, and the nvcc "
                       "that ran is 12.4")
    assert "13.0" not in d.cause
    assert d.fix[0].startswith("CUDA_HOME=/usr/local/cuda-12.8 attnforge build flash-attn")
    assert not any("--arch 9.0" in step for step in d.fix)
    assert any("nvcc 12.4" in n and "gcc 11.4.0" in n and "/usr/local/cuda-12.4" in n for n in d.notes)


@pytest.mark.parametrize(
    ("line", "reason", "fix"),
    [
        ("nvcc fatal   : Unsupported gpu architecture 'compute_70'", "CUDA 13.0 dropped it", "--arch 9.0"),
        ("nvcc fatal   : Unsupported gpu architecture 'compute_128'", "is not an architecture", "--arch 9.0"),
        ("Cuda compilation tools, release 12.6, V12.6.85\nnvcc fatal   : Unsupported gpu architecture 'sm_100a'",
         "needs CUDA >= 12.8, and the nvcc that ran is 12.6", "CUDA_HOME=/usr/local/cuda-12.8"),
    ],
)
def test_the_arch_reason_comes_from_the_toolchain_table(line: str, reason: str, fix: str) -> None:
    d = diagnose_text(line, snapshot=H200, name="flash-attn")
    assert reason in d.cause
    assert fix in d.fix[0]


def test_diagnose_cli_reads_the_logs_nvcc(capsys: pytest.CaptureFixture[str]) -> None:
    from attnforge.cli import main

    assert main(["diagnose", str(NVCC_124_LOG), "--snapshot", str(FIXTURES / "snapshots" /
                                                                  "h200_torch2.11_cu130.json")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "compute_120 needs CUDA >= 12.8, and the nvcc that ran is 12.4" in out


def test_a_log_past_the_read_limit_is_read_up_to_it_and_says_so(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``diagnose /dev/zero`` read without end (CLI fuzz, 2026-12-03): a log is read up to
    :data:`attnforge.diagnose.MAX_LOG_READ_BYTES`, its failure still found there, and the note says what was left."""
    from attnforge import diagnose

    real = (LOGS / "af_ext_fixture_ulimit_v_800000.log").read_bytes()
    log = tmp_path / "long.log"
    log.write_bytes(real + b"x" * 4096)
    monkeypatch.setattr(diagnose, "MAX_LOG_READ_BYTES", len(real) + 10)
    d = diagnose_file(log, name="af_ext_fixture")
    assert d.known and d.signature == "out-of-memory"  # the failure is in the part read
    assert any("only the first" in n for n in d.notes)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_an_endless_file_given_as_a_model_config_is_refused() -> None:
    from attnforge._system.files import read_user_file
    from attnforge.errors import UsageError

    with pytest.raises(UsageError, match="longer than 64 MiB") as err:
        read_user_file(Path("/dev/zero"), what="the model config", hint="pass a config.json")
    assert err.value.hint == "pass a config.json"
