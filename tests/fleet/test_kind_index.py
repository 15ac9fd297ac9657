"""Per-kind sub-indexes: three torch variants of one project in one fleet directory index; plain
``pip install --index-url <kind URL> PROJECT`` (no ``--no-deps``: the project has no dependencies, so nothing
reaches the network) installs each kind's own variant, where the shared root index would hand every kind the
same one. On a real pypiserver (one namespace, no sub-indexes) the same three variants are told apart by each
kind's exact version. And an index server that falls back to PyPI is refused by ``fleet install`` before any node
is asked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge.cache.key import CacheKeyInputs
from attnforge.fleet.index import DirIndex, ServerIndex
from attnforge.fleet.kind_index import kind_index_urls, kind_requirements, publish_kinds, server_requirement
from attnforge.fleet.requests import assemble_for_kinds
from attnforge.install.inputs import RequestArgs
from attnforge.probe.snapshot import SystemSnapshot
from tests.cache.wheelmaker import make_wheel

SNAPSHOTS = Path(__file__).resolve().parents[1] / "fixtures" / "snapshots"

TORCHES = ("2.9", "2.10", "2.11")


def _inputs(torch: str, version: str | None = None) -> CacheKeyInputs:
    return CacheKeyInputs(name="af-variant", version=version or f"0.1.0+cu130torch{torch}", source_sha256="0" * 64,
                          archs=((9, 0),), flags=(), torch_version=f"{torch}.0+cu130", cuda_version="13.0",
                          cxx11_abi=True, python_tag="py3", platform_tag="any", glibc=None, toolchain=())


def _pip_installed_value(url: str, target: Path, requirement: str = "af-variant") -> str:
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}  # this machine's pip.conf adds indexes: plain pip here
    env = {k: v for k, v in env.items() if not k.startswith("PIP_") or k == "PIP_CONFIG_FILE"}
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--target",
                           str(target), "--index-url", url, requirement], capture_output=True, text=True,
                          check=False, timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return (target / "af_variant" / "__init__.py").read_text().splitlines()[1]


@pytest.mark.integration
def test_each_kind_pip_installs_its_own_torch_variant(tmp_path: Path) -> None:
    index = DirIndex(tmp_path / "index", home=tmp_path / "head")
    published = {}
    for i, torch in enumerate(TORCHES):
        wheel = make_wheel(tmp_path / "wheels" / torch, name="af-variant", version=f"0.1.0+cu130torch{torch}",
                           value=i)
        published[f"k-torch{torch}"] = index.publish(f"sha256:{i + 1:032x}{0:032x}", wheel, _inputs(torch), None)
    urls = publish_kinds(index, {kind: [p] for kind, p in published.items()})
    for kind, torch in zip(published, TORCHES, strict=True):
        assert urls[kind] == kind_index_urls(index.pip_url)(kind)
        line = _pip_installed_value(urls[kind], tmp_path / f"target-{kind}")
        assert line == f'VERSION = "0.1.0+cu130torch{torch}"', kind
    assert kind_index_urls(index.pip_url)("k-unknown") is None  # no wheel for that kind: no URL, no guess
    # the shared root index offers all three: pip takes one variant for every kind (the wrong wheel)
    root = _pip_installed_value(index.pip_url, tmp_path / "target-root")
    assert root == 'VERSION = "0.1.0+cu130torch2.11"'  # the 2.9 and 2.10 kinds would get it too


@pytest.mark.integration
def test_on_an_index_server_each_kind_pip_installs_its_own_variant_by_its_exact_version(
        pypiserver: tuple[str, Path], tmp_path: Path) -> None:
    """pypiserver has one namespace (no sub-index per kind): the three variants are published to it, and each kind
    is handed its exact version, the one `attnforge plan --index-url URL` on that kind's snapshot takes from the
    server (`fleet install`'s pin); plain pip with it installs the kind's own, where the bare name gives every
    kind the same one."""
    url, _ = pypiserver
    index = ServerIndex(url, home=tmp_path / "head", environ={})
    source = tmp_path / "af-variant-src"
    source.mkdir()
    (source / "pyproject.toml").write_text('[project]\nname = "af-variant"\nversion = "0.1.0"\n')
    published = {}
    for i, torch in enumerate(TORCHES):
        version = f"0.1.0+cu130torch{torch}.cxx11abitrue.sm90"  # attnforge's own label of a built wheel
        wheel = make_wheel(tmp_path / "wheels" / torch, name="af-variant", version=version, value=i)
        published[torch] = index.publish(f"sha256:{i + 1:032x}{0:032x}", wheel, _inputs(torch, version), None)
    pins = kind_requirements({torch: [p] for torch, p in published.items()})
    h200 = json.loads((SNAPSHOTS / "h200_torch2.11_cu130.json").read_text())
    for torch in TORCHES:
        h200["torch"]["version"] = f"{torch}.0+cu130"
        snapshot = SystemSnapshot.from_json(json.dumps(h200))
        (request,) = assemble_for_kinds(["af-variant"], RequestArgs(source=str(source), index_urls=(url,)),
                                        [snapshot], home=tmp_path / "head")
        pin = server_requirement(request.plan_on(snapshot), url, "af-variant")
        assert pin is not None and [pin] == pins[torch] == [f"af-variant==0.1.0+cu130torch{torch}.cxx11abitrue.sm90"]
        line = _pip_installed_value(url, tmp_path / f"target-{torch}", pin)
        assert line == f'VERSION = "0.1.0+cu130torch{torch}.cxx11abitrue.sm90"', torch
    root = _pip_installed_value(url, tmp_path / "target-root")  # the bare name: one variant for every kind
    assert root == 'VERSION = "0.1.0+cu130torch2.11.cxx11abitrue.sm90"'
    h200["torch"]["version"] = "2.8.0+cu130"  # a kind the server holds no wheel for: no pin, nothing guessed
    snapshot = SystemSnapshot.from_json(json.dumps(h200))
    (request,) = assemble_for_kinds(["af-variant"], RequestArgs(source=str(source), index_urls=(url,)),
                                    [snapshot], home=tmp_path / "head")
    assert server_requirement(request.plan_on(snapshot), url, "af-variant") is None


def test_a_rebuild_for_a_kind_replaces_its_variant_of_that_version(tmp_path: Path) -> None:
    index = DirIndex(tmp_path / "index", home=tmp_path / "head")
    for i, torch in enumerate(("2.10", "2.11")):
        wheel = make_wheel(tmp_path / "wheels" / torch, name="af-variant", version=f"0.1.0+cu130torch{torch}")
        publish_kinds(index, {"k-a": [index.publish(f"sha256:{i + 1:032x}{0:032x}", wheel, _inputs(torch), None)]})
    page = (tmp_path / "index" / "k-a" / "simple" / "af-variant" / "index.html").read_text()
    assert "torch2.11" in page and "torch2.10" not in page


@pytest.mark.integration
@pytest.mark.parametrize("pypiserver", ["fallback"], indirect=True)
def test_fleet_install_refuses_an_index_that_falls_back_to_pypi(pypiserver: tuple[str, Path],
                                                                 cli_env: dict[str, str]) -> None:
    url, _ = pypiserver
    done = subprocess.run([sys.executable, "-m", "attnforge", "fleet", "install", "sdpa-math", "--index-url", url],
                          capture_output=True, text=True, env=cli_env, timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    assert "falls back to pypi.org" in done.stderr and "--disable-fallback" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.integration
def test_an_index_without_fallback_passes_the_check(pypiserver: tuple[str, Path]) -> None:
    from attnforge.fleet.kind_index import refuse_fallback

    refuse_fallback(pypiserver[0])  # --disable-fallback: a 404 for unknown projects, no redirect
