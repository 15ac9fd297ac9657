"""The fleet's index server is reached through the one HTTP client: a server that accepts and never answers is
a FleetError within the command's network budget, and the upload credentials are sent as basic auth and never
appear in a message. Real sockets on 127.0.0.1, no Ray needed."""

from __future__ import annotations

import base64
import http.server
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnforge.fetch.deadline import NetDeadline, command_deadline
from attnforge.fleet import FleetError
from attnforge.fleet.index import open_index
from tests._http import local_server
from tests.fetch.servers import PROXY_VARIABLES, BlackHole


@pytest.fixture(autouse=True)
def _no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in PROXY_VARIABLES:
        monkeypatch.delenv(var, raising=False)


class _Simple(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []  # noqa: RUF012 - reset by the fixture

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        type(self).seen.append(dict(self.headers.items()))
        self.send_response(403 if "Authorization" not in self.headers else 200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


@pytest.fixture
def simple() -> Iterator[str]:
    _Simple.seen = []
    with local_server(_Simple) as url:
        yield url + "/simple/"


def test_an_index_server_that_never_answers_is_a_fleet_error_within_the_budget(tmp_path: Path) -> None:
    hole = BlackHole()
    try:
        start = time.monotonic()
        with command_deadline(NetDeadline(budget_s=1.5)), pytest.raises(FleetError) as err:
            open_index(f"{hole.url}/simple/", home=tmp_path)
        assert time.monotonic() - start < 10
    finally:
        hole.close()
    assert err.value.message == f"the package index at {hole.url}/simple/ does not answer"
    assert err.value.cause is not None and "no answer from" in err.value.cause


def test_upload_credentials_are_basic_auth_and_never_in_a_message(simple: str, tmp_path: Path) -> None:
    env = {"ATTNFORGE_INDEX_USER": "ci", "ATTNFORGE_INDEX_PASSWORD": "hunter2"}
    open_index(simple, home=tmp_path, environ=env)
    assert _Simple.seen[-1]["Authorization"] == "Basic " + base64.b64encode(b"ci:hunter2").decode()
    in_url = open_index(simple.replace("http://", "http://ci:s3cret@"), home=tmp_path, environ={})
    assert _Simple.seen[-1]["Authorization"] == "Basic " + base64.b64encode(b"ci:s3cret").decode()
    assert in_url.pip_url == simple  # pip gets the URL without the password
    with pytest.raises(FleetError) as err:  # no credentials: the server refuses the page
        open_index(simple, home=tmp_path, environ={})
    assert err.value.cause is not None and "HTTP 403" in err.value.cause
