from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from attnforge._system.runner import SubprocessRunner
from attnforge.errors import InstallError
from attnforge.install.pip import check_requirements, pip_install
from attnforge.install.wheelfile import WheelMetadata, read_wheel_metadata
from tests.cache.wheelmaker import make_wheel
from tests.venvs import nested_venv


def meta(*requires: str, name: str = "flash-attn") -> WheelMetadata:
    return WheelMetadata(name=name, version="2.8.3", requires_dist=requires)


INSTALLED = {"torch": "2.11.0+cu130", "einops": "0.8.1", "numpy": None}


@pytest.mark.parametrize(
    ("wheel_meta", "missing"),
    [
        pytest.param(meta("torch", "einops"), (), id="all-there"),
        pytest.param(meta("torch>=2.4", "numpy"), ("numpy",), id="numpy-left-to-user"),
        pytest.param(meta("einops<0.5"), ("einops<0.5",), id="wrong-einops-reported-not-fixed"),
        pytest.param(meta('torch==1.0; python_version < "3"'), (), id="marker-excludes"),
        pytest.param(meta('pytest; extra == "test"'), (), id="extra-excluded"),
        pytest.param(meta("torch==2.11.0"), (), id="local-label-satisfies"),
    ],
)
def test_requirements_other_than_torch_are_reported(
    wheel_meta: WheelMetadata, missing: tuple[str, ...]
) -> None:
    assert check_requirements(wheel_meta, INSTALLED) == missing


@pytest.mark.parametrize(
    ("wheel_meta", "installed", "match"),
    [
        pytest.param(meta("torch==2.5.1"), INSTALLED, "requires torch==2.5.1", id="other-torch"),
        pytest.param(meta("torch"), {"torch": None}, "not installed", id="no-torch"),
        pytest.param(meta("triton>=3.5"), {"triton": "3.1.0"}, "requires triton", id="other-triton"),
        pytest.param(meta(name="torch"), INSTALLED, "never replaces the torch stack", id="is-torch"),
        pytest.param(meta(name="TorchVision"), INSTALLED, "never replaces", id="is-torchvision"),
    ],
)
def test_anything_that_would_change_torch_is_refused(
    wheel_meta: WheelMetadata, installed: dict[str, str | None], match: str
) -> None:
    with pytest.raises(InstallError, match=match):
        check_requirements(wheel_meta, installed)


def test_metadata_is_read_from_the_wheel(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, name="af-pure-fixture", version="1.2", requires=("torch>=2", "einops"))
    got = read_wheel_metadata(wheel)
    assert got == WheelMetadata(name="af-pure-fixture", version="1.2", requires_dist=("torch>=2", "einops"))


def test_a_broken_wheel_is_reported_not_raised_raw(tmp_path: Path) -> None:
    bad = tmp_path / "af_pure_fixture-1.0-py3-none-any.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(InstallError, match="not a readable wheel"):
        read_wheel_metadata(bad)


@pytest.fixture
def venv_python(tmp_path: Path) -> str:
    """A fresh venv that sees the system torch (and pip) but installs into itself."""
    return nested_venv(tmp_path / "venv")


@pytest.mark.integration
def test_pip_installs_into_the_target_interpreter_and_keeps_torch(venv_python: str, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "dist", value=5, requires=("torch", "af-not-on-this-machine"))
    result = pip_install(wheel, runner=SubprocessRunner(), python=venv_python)
    assert result.missing_requirements == ("af-not-on-this-machine",)
    import torch

    assert result.torch_version == torch.__version__
    out = subprocess.run([venv_python, "-c", "import af_pure_fixture as m; print(m.VALUE, m.__file__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "5"
    assert out[1].startswith(str(tmp_path / "venv"))


@pytest.mark.integration
def test_a_wheel_for_another_torch_never_reaches_pip(venv_python: str, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "dist", requires=("torch==2.5.1",))
    with pytest.raises(InstallError, match="never changes your torch"):
        pip_install(wheel, runner=SubprocessRunner(), python=venv_python)
    probe = subprocess.run([venv_python, "-c", "import af_pure_fixture"], capture_output=True)
    assert probe.returncode != 0


@pytest.mark.integration
def test_pip_failure_carries_pips_own_words(venv_python: str, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "dist", tag="cp27-cp27m-win32")  # not installable on this interpreter
    with pytest.raises(InstallError, match="pip could not install") as info:
        pip_install(wheel, runner=SubprocessRunner(), python=venv_python)
    assert "not a supported wheel" in (info.value.cause or "")
