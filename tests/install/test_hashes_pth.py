"""Hash provenance of fetched wheels (``--require-hashes``; "recorded on first use, not published") and no
``.pth`` code from the installed wheel running during ``attnforge install``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from attnforge._system.runner import SubprocessRunner
from attnforge.cache import Store
from attnforge.cache._files import sha256_file
from attnforge.errors import InstallError
from attnforge.fetch.download import HashSource
from attnforge.install.flow import install
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.types import Request
from tests.cache.wheelmaker import make_wheel
from tests.conftest import REPO
from tests.install.helpers import OrderedPlanner, pip_wheel_builder
from tests.venvs import nested_venv

pytestmark = pytest.mark.integration

SNAPSHOT = REPO / "tests" / "fixtures" / "snapshots" / "cpu_dev_torch2.13_cpu.json"


def _venv(path: Path) -> str:
    return nested_venv(path)  # sees the torch and pip of the venv the tests run in


def _install(store: Store, planner: OrderedPlanner, python: str, **kw: object):  # type: ignore[no-untyped-def]
    return install(Request(backend="af-pure-fixture"), snapshot=SystemSnapshot.load(SNAPSHOT), store=store,
                   planner=planner, builder=pip_wheel_builder, verifier=None, runner=SubprocessRunner(),
                   python=python, **kw)  # type: ignore[arg-type]


def test_an_unhashed_wheel_is_recorded_on_first_use_and_says_so(tmp_path: Path) -> None:
    links = tmp_path / "links"
    make_wheel(links)
    store = Store(tmp_path / "home")
    result = _install(store, OrderedPlanner(find_links=links), _venv(tmp_path / "venv"))
    assert result.action == "wheel"
    assert result.hash_source == HashSource.FIRST_USE == "recorded on first use, not published"
    assert any("recorded on first use" in w for w in result.warnings)
    (entry,) = store.list()
    assert entry.provenance["sha256_source"] == HashSource.FIRST_USE


def test_require_hashes_refuses_an_unhashed_wheel_before_fetching_it(tmp_path: Path) -> None:
    links = tmp_path / "links"
    make_wheel(links)
    store = Store(tmp_path / "home")
    python = _venv(tmp_path / "venv")
    with pytest.raises(InstallError, match="--require-hashes") as info:
        _install(store, OrderedPlanner(find_links=links), python, require_hashes=True)
    assert "publish" in (info.value.hint or "")
    assert store.list() == []
    assert subprocess.run([python, "-c", "import af_pure_fixture"], capture_output=True).returncode != 0


def test_require_hashes_accepts_a_published_hash(tmp_path: Path) -> None:
    links = tmp_path / "links"
    wheel = make_wheel(links)
    planner = OrderedPlanner(find_links=links, published_sha256={wheel.name: sha256_file(wheel)})
    result = _install(Store(tmp_path / "home"), planner, _venv(tmp_path / "venv"), require_hashes=True)
    assert result.action == "wheel" and result.hash_source == HashSource.PUBLISHED


def test_the_wheels_pth_does_not_run_during_install(tmp_path: Path) -> None:
    mark = tmp_path / "pth-ran"
    links = tmp_path / "links"
    make_wheel(links, extra_files={"af_evil.pth": f"import pathlib; pathlib.Path({str(mark)!r}).touch()\n".encode()})
    # a venv whose packages need no .pth code to be seen (the usual case): attnforge never starts it normally
    import venv

    venv.create(tmp_path / "venv", system_site_packages=True, with_pip=False)
    python = str(tmp_path / "venv" / "bin" / "python")
    # the torch this venv sees through the base's site-packages: none from a venv base, the system's torch outside
    # one (CI runs both); asked before the wheel (and its .pth) is installed
    seen = subprocess.run([python, "-c", "import importlib.metadata as m\ntry: print(m.version('torch'))\n"
                           "except m.PackageNotFoundError: print('')"], capture_output=True, text=True, check=True)
    torch_seen = seen.stdout.strip() or None
    result = _install(Store(tmp_path / "home"), OrderedPlanner(find_links=links), python)
    assert result.pip is not None and result.pip.torch_version == torch_seen  # the version check did run
    assert not mark.exists(), "attnforge ran the installed wheel's .pth"
    subprocess.run([python, "-c", "pass"], check=True)  # the user's next python start runs it, as Python does
    assert mark.exists()
