"""The tool-output parsers, fed real recorded outputs."""

from __future__ import annotations

import pytest

from attnforge.probe import parsers
from tests._fakes import recorded


def test_nvcc_13_release_and_build_line() -> None:
    assert parsers.nvcc_release(recorded("nvcc_13.0_linux.txt")) == (
        "13.0", "Build cuda_13.0.r13.0/compiler.36424714_0")


@pytest.mark.parametrize(
    ("name", "version", "banner_start"),
    [
        pytest.param("gcc_12_debian.txt", "12.2.0", "gcc (Debian", id="debian-gcc"),
        pytest.param("gxx_12_debian.txt", "12.2.0", "g++ (Debian", id="debian-g++"),
        pytest.param("gcc_13_ubuntu.txt", "13.3.0", "gcc (Ubuntu", id="ubuntu-gcc-h200"),
    ],
)
def test_gnu_version(name: str, version: str, banner_start: str) -> None:
    parsed = parsers.gnu_version(recorded(name))
    assert parsed is not None
    assert parsed[0] == version
    assert parsed[1].startswith(banner_start)


def test_clang_version() -> None:
    text = "Debian clang version 14.0.6\nTarget: x86_64-pc-linux-gnu\nThread model: posix\n"
    assert parsers.clang_version(text) == ("14.0.6", "Debian clang version 14.0.6")


@pytest.mark.parametrize("text", ["", "garbage", "nvcc: NVIDIA (R) Cuda compiler driver\n"])
def test_unrecognised_outputs_give_none(text: str) -> None:
    assert parsers.nvcc_release(text) is None
    assert parsers.gnu_version(text) is None


def test_nvidia_smi_query_and_header() -> None:
    cuda = parsers.nvidia_smi_cuda_version(recorded("nvidia-smi_h200.txt"))
    assert cuda == "13.0"
    gpus = parsers.nvidia_smi_csv(recorded("nvidia-smi_query_h200.csv"), cuda)
    assert len(gpus) == 1
    g = gpus[0]
    assert (g.name, g.compute_capability, g.driver_version, g.cuda_driver_version) == (
        "NVIDIA H200", (9, 0), "580.159.04", "13.0")
    assert g.memory_bytes == 143771 * 1024 * 1024
    assert g.source == "nvidia-smi"


def test_nvidia_smi_skips_malformed_rows() -> None:
    text = "0, NVIDIA H200, 9.0, 143771, 580.159.04\n1, broken row\n2, X, [N/A], 1, 2\n"
    assert [g.index for g in parsers.nvidia_smi_csv(text, None)] == [0]


@pytest.mark.parametrize(("value", "text"), [(13000, "13.0"), (12080, "12.8"), (12090, "12.9"), (11080, "11.8")])
def test_cuda_version_from_int(value: int, text: str) -> None:
    assert parsers.cuda_version_from_int(value) == text


@pytest.mark.parametrize(("cl", "msc"), [("19.44.35207", 1944), ("19.39.33523", 1939), ("19.40.33811", 1940)])
def test_msc_ver(cl: str, msc: int) -> None:
    assert parsers.msc_ver(cl) == msc
