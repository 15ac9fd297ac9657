"""What a log says about itself: package, torch, full module paths, Windows paths, printable text only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge.diagnose import diagnose_file, diagnose_text
from attnforge.diagnose.logfacts import full_module, log_facts, printable
from tests._fakes import FIXTURES
from tests.conftest import SRC

WINDOWS_LOGS = FIXTURES / "logs" / "windows"


@pytest.mark.parametrize(
    ("log", "package", "torch"),
    [
        ("  Building wheel for flash-attn (setup.py) ... error\n", "flash-attn", None),
        ("Collecting sageattention==2.2.0\n  torch.__version__  = 2.13.0+cpu\n", "sageattention", "2.13.0+cpu"),
        ("ERROR: Failed building wheel for xformers\ntorch 2.8.0+cu128\n", "xformers", "2.8.0+cu128"),
        ("nothing here\n", None, None),
    ],
)
def test_the_log_names_its_package_and_torch(log: str, package: str | None, torch: str | None) -> None:
    facts = log_facts(log)
    assert (facts.package, facts.torch_version) == (package, torch)


def test_a_cpu_torch_in_the_log_fills_the_cause_without_a_snapshot() -> None:
    log = ("Building wheel for flash-attn (setup.py)\n  torch.__version__  = 2.13.0+cpu\n"
           "  OSError: nvcc was not found.\n")
    d = diagnose_text(log)
    assert d.signature == "cuda-home-cpu-torch"
    assert "torch 2.13.0+cpu is a CPU-only build" in d.cause
    assert "<" not in d.cause


def test_a_module_is_named_by_its_full_import_path() -> None:
    d = diagnose_file(WINDOWS_LOGS / "dll_init_failed_sage_fused.log")
    assert d.known
    assert "sageattention._fused" in d.cause
    assert any("import sageattention._fused" in step for step in d.fix)
    assert not any("import _fused" in step for step in d.fix)


@pytest.mark.parametrize(
    ("module", "text", "expected"),
    [
        ("_fused", "  File \"C:\\Py\\Lib\\site-packages\\sageattention\\quant.py\", line 2\n    from . import _fused\n",
         "sageattention._fused"),
        ("_C", "from xformers._C import ops\nImportError: DLL load failed while importing _C", "xformers._C"),
        ("flash_attn_2_cuda", "import flash_attn_2_cuda as m", "flash_attn_2_cuda"),
        ("_fused", "  File \"/opt/x/pkg/sub/mod.py\", line 1\n    from ._fused import f\n", "sub._fused"),
    ],
)
def test_full_module(module: str, text: str, expected: str) -> None:
    assert full_module(module, text) == expected


@pytest.mark.parametrize(
    ("line", "location"),
    [
        ("C:\\Program Files\\My Project\\csrc\\flash_api.cpp(42): error C2872: 'std': ambiguous symbol",
         "C:\\Program Files\\My Project\\csrc\\flash_api.cpp:42"),
        ("D:/a b/c d/kernel.cu(7): error: identifier \"x\" is undefined", "D:/a b/c d/kernel.cu:7"),
        ("/home/u/src/kernel.cu:12:3: error: expected ';'", "/home/u/src/kernel.cu:12"),
    ],
)
def test_source_locations_keep_windows_paths_whole(line: str, location: str) -> None:
    d = diagnose_text(f"FAILED: x.o\n{line}\nninja: build stopped: subcommand failed.\n")
    assert d.location == location


def test_only_printable_text_is_shown(tmp_path: Path) -> None:
    log = tmp_path / "blob.log"
    log.write_bytes(b"\x1b[31mOSError: nvcc was not found.\x1b[0m\n\x00\x07\x1b\xff\xfe" + bytes(range(32)) * 4)
    d = diagnose_file(log)
    shown = " ".join([d.cause, *(e.text for e in d.evidence), *d.fix])
    assert all(ch.isprintable() for ch in shown), repr(shown)
    assert any("unprintable" in n for n in d.notes)
    assert printable("a\x1b[1mb\x1b[0m\x00c")[0] == "abc"


@pytest.mark.integration
def test_the_cli_fills_placeholders_from_this_machines_probe(tmp_path: Path) -> None:
    log = tmp_path / "arch.log"
    log.write_text("nvcc fatal   : Unsupported gpu architecture 'compute_70'\n")
    done = subprocess.run([sys.executable, "-m", "attnforge", "diagnose", str(log), "--json"], capture_output=True,
                          text=True, env={**__import__("os").environ, "PYTHONPATH": str(SRC)}, timeout=300)
    doc = json.loads(done.stdout)
    assert "<nvcc_version>" not in doc["cause"]
    assert any("this machine's probe" in n for n in doc["notes"])


# The toolchain a log shows (issue 31 item 8). Lines as the tools print them: nvcc --version (CUDA 12.4's banner,
# also in tests/fixtures/logs/flash_attn-2.8.3_sm120_nvcc12.4_unsupported_arch.log), CMake's compiler
# identification, attnforge's own log header (build/execute.py _log_header), gcc --version / gcc -v, the nvcc
# path torch's cpp_extension puts on each ninja command line (Linux and the Windows toolkit layout).
@pytest.mark.parametrize(
    ("log", "nvcc", "home", "compiler"),
    [
        ("Cuda compilation tools, release 12.4, V12.4.131\n", "12.4", None, None),
        ("-- The CUDA compiler identification is NVIDIA 12.6.85\n", "12.6", None, None),
        ("attnforge: env CUDA_HOME=/usr/local/cuda-12.1\n", "12.1", "/usr/local/cuda-12.1", None),
        ("[2/9] /usr/local/cuda-12.4/bin/nvcc -c a.cu\n  gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0\n", "12.4",
         "/usr/local/cuda-12.4", "gcc 11.4.0"),
        ("/opt/cuda-12.8/bin/nvcc -c a.cu\nCuda compilation tools, release 12.4, V12.4.131\n", "12.4",
         "/opt/cuda-12.8", None),  # the banner is what ran; the path only where no banner says
        ('"C:\\Program Files\\NVIDIA GPU Computing Toolkit\\CUDA\\v12.6\\bin\\nvcc" -c a.cu\n', "12.6",
         "C:\\Program Files\\NVIDIA GPU Computing Toolkit\\CUDA\\v12.6", None),
        ("gcc version 13.2.0 (GCC)\n", None, None, "gcc 13.2.0"),
        ("-- The CXX compiler identification is GNU 12.3.0\n", None, None, "gcc 12.3.0"),
        ("Ubuntu clang version 17.0.6\n", None, None, "clang 17.0.6"),
        ("nvcc fatal   : Unsupported gpu architecture 'compute_120'\n", None, None, None),
    ],
)
def test_the_log_names_its_own_toolchain(log: str, nvcc: str | None, home: str | None, compiler: str | None) -> None:
    facts = log_facts(log)
    assert (facts.nvcc_version, facts.cuda_home, facts.host_compiler) == (nvcc, home, compiler)
