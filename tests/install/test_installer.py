"""pip where the interpreter has it, ``uv pip --python`` where it does not (``uv venv``); index questions go
through pip so its configuration and credentials apply (a real HTTP index on 127.0.0.1 with Basic auth)."""

from __future__ import annotations

import base64
import http.server
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnforge._system.runner import SubprocessRunner
from attnforge.build.frontend import Installer, installer_for
from attnforge.errors import InstallError
from attnforge.install.index import index_pick, index_versions
from attnforge.install.pip import pip_install
from tests._http import local_server
from tests.cache.wheelmaker import make_wheel
from tests.venvs import nested_venv, uv_venv


def test_pip_options_are_spelled_for_uv() -> None:
    uv = Installer(kind="uv", python="/env/bin/python", uv="/usr/bin/uv")
    assert uv.argv("install", "--no-deps", "--force-reinstall", "--no-input", "w.whl") == [
        "/usr/bin/uv", "pip", "install", "--python", "/env/bin/python", "--no-deps", "--reinstall", "w.whl"]
    pip = Installer(kind="pip", python="/env/bin/python")
    assert pip.argv("install", "--force-reinstall") == ["/env/bin/python", "-m", "pip", "install",
                                                        "--force-reinstall"]


def test_no_pip_and_no_uv_says_how_to_get_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = uv_venv(tmp_path / "uvenv")
    monkeypatch.setattr("attnforge.build.frontend.find_uv", lambda: None)
    with pytest.raises(InstallError, match="has no pip, and uv is not installed") as info:
        installer_for(python, runner=SubprocessRunner())
    assert "ensurepip" in str(info.value.hint)


@pytest.mark.integration
def test_a_venv_with_pip_uses_pip_and_a_uv_venv_uses_uv(tmp_path: Path) -> None:
    runner = SubprocessRunner()
    assert installer_for(nested_venv(tmp_path / "venv"), runner=runner).kind == "pip"
    assert installer_for(uv_venv(tmp_path / "uvenv"), runner=runner).kind == "uv"


@pytest.mark.integration
def test_pip_install_works_in_a_uv_venv_without_pip(tmp_path: Path) -> None:
    python = uv_venv(tmp_path / "uvenv")
    assert subprocess.run([python, "-c", "import pip"], capture_output=True).returncode != 0
    wheel = make_wheel(tmp_path / "dist", value=7)
    result = pip_install(wheel, runner=SubprocessRunner(), python=python)
    assert (result.name, result.version) == ("af-pure-fixture", "0.1.0")
    out = subprocess.run([python, "-c", "import af_pure_fixture as m; print(m.VALUE, m.__file__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "7"
    assert out[1].startswith(str(tmp_path / "uvenv"))


class _AuthIndex(http.server.SimpleHTTPRequestHandler):
    """A PEP 503 index behind HTTP Basic auth (user ``af``, password ``s3cret``)."""

    def do_GET(self) -> None:
        want = "Basic " + base64.b64encode(b"af:s3cret").decode()
        if self.headers.get("Authorization") != want:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="af"')
            self.end_headers()
            return
        super().do_GET()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def auth_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``http://af:s3cret@127.0.0.1:PORT/simple/`` offering af-pure-fixture 1.0 and 2.0rc1; pip's own config
    (this machine's find-links and extra indexes) is switched off so only this index answers."""
    root = tmp_path / "index"
    project = root / "simple" / "af-pure-fixture"
    project.mkdir(parents=True)
    links = []
    for version in ("1.0", "2.0rc1"):
        wheel = make_wheel(root / "files", version=version)
        links.append(f'<a href="../../files/{wheel.name}">{wheel.name}</a>')
    (project / "index.html").write_text("<html><body>" + "".join(links) + "</body></html>")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL"):
        monkeypatch.delenv(var, raising=False)

    def handler(*args: object, **kwargs: object) -> _AuthIndex:
        return _AuthIndex(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

    with local_server(handler) as url:
        yield url.replace("http://", "http://af:s3cret@") + "/simple/"


@pytest.mark.integration
def test_index_questions_go_through_pip_with_the_credentials_in_the_url(auth_index: str, tmp_path: Path) -> None:
    python = nested_venv(tmp_path / "venv")
    runner = SubprocessRunner()
    assert index_versions("af-pure-fixture", python=python, runner=runner, index_urls=(auth_index,)) == (
        "2.0rc1", "1.0")
    pick = index_pick("af-pure-fixture<2", python=python, runner=runner, index_urls=(auth_index,))
    assert pick is not None
    assert (pick.name, pick.version) == ("af-pure-fixture", "1.0")
    assert pick.url is not None and pick.url.endswith("af_pure_fixture-1.0-py3-none-any.whl")
    assert pick.sha256 is not None and len(pick.sha256) == 64
    assert index_pick("af-pure-fixture>5", python=python, runner=runner, index_urls=(auth_index,)) is None


@pytest.mark.integration
def test_wrong_credentials_are_an_install_error(auth_index: str, tmp_path: Path) -> None:
    python = nested_venv(tmp_path / "venv")
    bad = auth_index.replace("s3cret", "wrong")
    with pytest.raises(InstallError, match="could not be read") as info:
        index_pick("af-pure-fixture", python=python, runner=SubprocessRunner(), index_urls=(bad,))
    assert "401" in str(info.value.cause)
    assert "wrong" not in str(info.value)


def test_builds_and_downloads_are_spelled_for_uv(tmp_path: Path) -> None:
    uv = Installer(kind="uv", python="/env/bin/python", uv="/usr/bin/uv")
    assert uv.wheel_argv(tmp_path / "proj", tmp_path / "out") == [
        "/usr/bin/uv", "build", "--wheel", "--no-build-isolation", "--python", "/env/bin/python", "--out-dir",
        str(tmp_path / "out"), str(tmp_path / "proj")]
    assert uv.download_argv("--no-deps", "x==1") == [
        "/usr/bin/uv", "tool", "run", "--python", "/env/bin/python", "--from", "pip", "pip", "download", "--no-deps",
        "x==1"]
    pip = Installer(kind="pip", python="/env/bin/python")
    assert pip.download_argv("x==1") == ["/env/bin/python", "-m", "pip", "download", "x==1"]
    assert pip.wheel_argv(tmp_path, tmp_path)[:5] == ["/env/bin/python", "-m", "pip", "wheel", "-v"]


def _project(root: Path) -> Path:
    (root / "af_uv_built").mkdir(parents=True)
    (root / "af_uv_built" / "__init__.py").write_text("VALUE = 5\n")
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "af-uv-built"\nversion = "0.2.0"\n')
    return root


@pytest.mark.integration
def test_a_source_build_works_in_a_uv_venv_without_pip(tmp_path: Path) -> None:
    """`attnforge build` in a `uv venv`: `uv build --no-build-isolation` against the venv's own packages."""
    from attnforge.build import execute
    from attnforge.resolve.types import BuildSpec, SourceKind, SourceSpec
    from tests.venvs import inherit_outer_without_pip

    python = uv_venv(tmp_path / "uvenv")
    inherit_outer_without_pip(python, tmp_path)  # setuptools (and torch) as the outer env has them; no pip
    assert subprocess.run([python, "-c", "import pip"], capture_output=True).returncode != 0
    spec = BuildSpec(name="af-uv-built", version=None, archs=(), max_jobs=1, nvcc_threads=1, python=python,
                     source=SourceSpec(kind=SourceKind.PATH, location=str(_project(tmp_path / "proj"))))
    result = execute(spec, home=tmp_path / "home", environ={**os.environ, "UV_OFFLINE": "1"})
    assert result.wheel.name == "af_uv_built-0.2.0-py3-none-any.whl"
    assert result.log_path is not None
    assert "uv build --wheel --no-build-isolation" in result.log_path.read_text()


@pytest.mark.integration
def test_a_download_from_the_index_works_in_a_uv_venv_without_pip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uv has no download command: pip runs through `uv tool run`, here from ensurepip's bundled wheel, offline."""
    import ensurepip

    from attnforge.install.defaults import download_from_index
    from attnforge.resolve.types import Request

    python = uv_venv(tmp_path / "uvenv")
    wheel = make_wheel(tmp_path / "files", name="af-indexed", version="1.2.0")
    simple = tmp_path / "simple" / "af-indexed"
    simple.mkdir(parents=True)
    (simple / "index.html").write_text(f'<a href="{wheel.as_uri()}">{wheel.name}</a>\n')
    bundled = Path(ensurepip.__file__).parent / "_bundled"
    env = {"UV_OFFLINE": "1", "UV_FIND_LINKS": str(bundled), "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
           "UV_TOOL_DIR": str(tmp_path / "uv-tools"), "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": os.devnull,
           "PIP_NO_CACHE_DIR": "1"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    request = Request(backend="af-indexed", index_urls=((tmp_path / "simple").as_uri(),))
    got = download_from_index("af-indexed", "==1.2.0", request, tmp_path / "into", runner=SubprocessRunner(),
                              python=python)
    assert got.name == wheel.name
    assert got.read_bytes() == wheel.read_bytes()
