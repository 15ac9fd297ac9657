"""A find-links wheel that is damaged or mislabelled: refused with an ``error:``/``hint:``, never a traceback.

Real store, real files; the wheel is refused before pip runs, so no interpreter is touched.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from attnforge._system.runner import SubprocessRunner
from attnforge.cache import Store
from attnforge.errors import InstallError
from attnforge.install.flow import install
from attnforge.install.wheelfile import read_wheel_metadata
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.types import Request
from tests.conftest import REPO
from tests.install.helpers import OrderedPlanner, pip_wheel_builder

SNAPSHOT = REPO / "tests" / "fixtures" / "snapshots" / "h100_torch2.8_cu128.json"
NAME = "flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"


def _install(tmp_path: Path, links: Path) -> Store:
    store = Store(tmp_path / "home")
    # archs given: the fatbin check (which opens the wheel's binaries) runs
    install(Request(backend="flash-attn", offline=True, archs=((9, 0),), find_links=(str(links),)),
            snapshot=SystemSnapshot.load(SNAPSHOT), store=store, planner=OrderedPlanner(find_links=links),
            builder=pip_wheel_builder, verifier=None, runner=SubprocessRunner(), python=sys.executable)
    return store


def _mislabelled(links: Path) -> Path:
    links.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(links / NAME, "w") as zf:
        zf.writestr("xformers-0.0.1.dist-info/METADATA", "Name: xformers\nVersion: 0.0.1\n")
    return links / NAME


@pytest.mark.parametrize("content", [
    pytest.param(b"garbage\n", id="not-a-zip"),
    pytest.param(b"PK\x03\x04" + b"\0" * 20, id="truncated-zip"),
])
def test_a_find_links_wheel_that_is_not_a_zip_is_refused_before_anything_opens_it(
    tmp_path: Path, content: bytes
) -> None:
    links = tmp_path / "links"
    links.mkdir()
    (links / NAME).write_bytes(content)
    with pytest.raises(InstallError) as info:
        _install(tmp_path, links)
    error = info.value
    assert error.message == f"{NAME} is not a readable wheel"
    assert error.hint is not None and "damaged or not a wheel" in error.hint
    assert Store(tmp_path / "home").list() == [], "nothing unreadable enters the store"


def test_a_find_links_wheel_of_another_project_is_called_mislabelled(tmp_path: Path) -> None:
    links = tmp_path / "links"
    _mislabelled(links)
    with pytest.raises(InstallError) as info:
        _install(tmp_path, links)
    error = info.value
    assert error.message == f"{NAME} is mislabelled: it has no flash_attn-*.dist-info/METADATA"
    assert error.cause is not None and "xformers-0.0.1.dist-info" in error.cause
    assert "StopIteration" not in str(error)
    assert error.hint is not None and "another project's wheel" in error.hint


def test_read_wheel_metadata_names_a_wheel_without_any_dist_info(tmp_path: Path) -> None:
    wheel = tmp_path / "af_thing-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("af_thing/__init__.py", "")
    with pytest.raises(InstallError) as info:
        read_wheel_metadata(wheel)
    assert info.value.message.endswith("is mislabelled: it has no af_thing-*.dist-info/METADATA")
    assert info.value.cause == "its file name says af-thing, but it holds no *.dist-info directory at all"
