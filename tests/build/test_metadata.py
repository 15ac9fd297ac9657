"""The project name a source tree declares (pyproject.toml, setup.cfg, setup.py), read without building."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnforge.build.metadata import declared_name
from attnforge.build.source import local_sha256, parse_source, tree_sha256
from tests._fakes import FIXTURES


@pytest.mark.parametrize(
    ("files", "name"),
    [
        pytest.param({"pyproject.toml": '[project]\nname = "from-pyproject"\n', "setup.py": 'setup(name="x")'},
                     "from-pyproject", id="pep621-first"),
        pytest.param({"pyproject.toml": "[build-system]\nrequires = []\n",
                      "setup.cfg": "[metadata]\nname = from_cfg\n"}, "from_cfg", id="setup-cfg"),
        pytest.param({"setup.py": "from setuptools import setup\nsetup(name='lit', version='1')\n"}, "lit",
                     id="setup-py-literal"),
        pytest.param({"setup.py": 'import setuptools\nPACKAGE_NAME = "flash_attn"\n'
                                  "setuptools.setup(name=PACKAGE_NAME)\n"}, "flash_attn", id="setup-py-constant"),
        pytest.param({"setup.py": "setup(name=compute())\n"}, None, id="computed-is-not-guessed"),
        pytest.param({"pyproject.toml": "not toml [", "setup.py": "setup(name='after-bad-toml')"},
                     "after-bad-toml", id="malformed-pyproject"),
        pytest.param({"setup.py": "def (:"}, None, id="syntax-error"),
        pytest.param({}, None, id="empty"),
    ],
)
def test_declared_name(tmp_path: Path, files: dict[str, str], name: str | None) -> None:
    for rel, text in files.items():
        (tmp_path / rel).write_text(text, encoding="utf-8")
    assert declared_name(tmp_path) == name


def test_the_fixture_extension_is_named_by_its_setup_py() -> None:
    assert declared_name(FIXTURES / "ext_pkg") == "af_ext_fixture"


def test_a_local_source_is_hashed_as_the_build_hashes_it(tmp_path: Path) -> None:
    (tmp_path / "setup.py").write_text("setup(name='x')", encoding="utf-8")
    assert local_sha256(parse_source(str(tmp_path))) == tree_sha256(tmp_path)
    assert local_sha256(parse_source("git+https://example.invalid/x.git@v1")) is None
    assert local_sha256(parse_source(str(tmp_path / "missing"))) is None
