"""pip where the interpreter has it, ``uv pip --python`` where it does not (``uv venv``); index questions go
through pip so its configuration and credentials apply (a real HTTP index on 127.0.0.1 with Basic auth)."""

from __future__ import annotations

import base64
import http.server
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnforge._system.runner import SubprocessRunner
from attnforge.errors import InstallError
from attnforge.install.index import index_pick, index_versions
from attnforge.install.installer import Installer, installer_for
from attnforge.install.pip import pip_install
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
    monkeypatch.setattr("attnforge.install.installer.find_uv", lambda: None)
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

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://af:s3cret@127.0.0.1:{server.server_address[1]}/simple/"
    finally:
        server.shutdown()
        server.server_close()


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
