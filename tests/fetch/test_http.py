"""The one HTTP client and the command's network deadline, on real sockets on 127.0.0.1 (a black hole that
accepts and never answers, a refusing port, a small server) and, for retries, a fake opener at its seam."""

from __future__ import annotations

import base64
import email.message
import http.server
import io
import threading
import time
import urllib.error
from collections.abc import Iterator
from typing import Any

import pytest

from attnforge._system.net import HostLookup
from attnforge.errors import UsageError
from attnforge.fetch.deadline import NetDeadline, budget_from, command_deadline, current_deadline
from attnforge.fetch.http import FetchError, HttpClient, HttpStatusError, rate_limit_message, shown
from tests._http import local_server
from tests.fetch.servers import BlackHole, refusing_port


def _deadline(**kwargs: Any) -> NetDeadline:
    return NetDeadline(hosts=HostLookup(lookup=lambda host: None), **kwargs)


# -- retries at the opener seam ----------------------------------------------------------------------------
class _Resp:
    def __init__(self, body: bytes, status: int = 200) -> None:
        self.status, self._body = status, body
        self.headers = email.message.Message()

    def read(self) -> bytes:
        return self._body

    def __enter__(self) -> _Resp:
        return self

    def __exit__(self, *a: object) -> None:
        pass


def _http_error(code: int, headers: dict[str, str]) -> urllib.error.HTTPError:
    msg = email.message.Message()
    for k, v in headers.items():
        msg[k] = v
    return urllib.error.HTTPError("http://x", code, "err", msg, io.BytesIO(b""))


def test_server_errors_and_resets_are_retried_with_backoff() -> None:
    answers: list[Any] = [_http_error(503, {}), urllib.error.URLError("reset"), _Resp(b"ok")]
    slept: list[float] = []

    def opener(req: Any, timeout: float) -> Any:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    client = HttpClient(opener=opener, sleep=slept.append, backoff_s=0.5, deadline=_deadline())
    assert client.get("http://x").body == b"ok"
    assert slept == [0.5, 1.0]


def test_the_client_gives_up_after_its_retries() -> None:
    def opener(req: Any, timeout: float) -> Any:
        raise urllib.error.URLError("no route")

    with pytest.raises(FetchError) as err:
        HttpClient(opener=opener, sleep=lambda s: None, retries=2, deadline=_deadline()).get("http://x")
    assert "no route" in str(err.value) and "after 2 attempts" in str(err.value)


def test_a_rate_limit_or_a_404_is_not_retried() -> None:
    calls: list[int] = []

    def opener(req: Any, timeout: float) -> Any:
        calls.append(1)
        raise _http_error(429, {"X-RateLimit-Reset": "1795000000"})

    with pytest.raises(FetchError) as err:
        HttpClient(opener=opener, sleep=lambda s: None, deadline=_deadline()).get("http://x", token=True)
    assert calls == [1]
    assert "2026-11-18 11:06 UTC" in str(err.value) and "GITHUB_TOKEN" not in str(err.value)


def test_rate_limit_detection() -> None:
    assert rate_limit_message(403, {"X-RateLimit-Remaining": "12"}, "u", token=False) is None  # a plain 403
    line = rate_limit_message(403, {"X-RateLimit-Remaining": "0"}, "u", token=False)
    assert line is not None and "GITHUB_TOKEN" in line and "resets later" in line


@pytest.mark.parametrize("url", ["notaurl/repos/x", "ftp://host/x", ""])
def test_a_url_that_is_not_http_is_a_fetch_error(url: str) -> None:
    with pytest.raises(FetchError, match="is not an http"):
        HttpClient(deadline=_deadline()).get(url)


# -- real sockets: a black hole, a refusing port -------------------------------------------------------------
def test_a_host_that_never_answers_is_dead_for_the_rest_of_the_command(
    black_hole: BlackHole, no_proxies: None
) -> None:
    deadline = _deadline(budget_s=30)
    client = HttpClient(deadline=deadline, answer_timeout_s=0.5)
    with pytest.raises(FetchError) as first:
        client.get(f"{black_hole.url}/a")
    assert f"no answer from {black_hole.url}/a within 0.5 s" in str(first.value)
    assert f"127.0.0.1:{black_hole.port} is not asked again" in str(first.value)
    with pytest.raises(FetchError, match=f"not asked: 127.0.0.1:{black_hole.port} did not answer earlier"):
        HttpClient(deadline=deadline).get(f"{black_hole.url}/b")  # another client of the same command
    assert len(black_hole.accepted) == 1  # one connection, no retry of a timeout
    assert deadline.remaining_s() > 25


def test_a_proxy_that_never_answers_is_named_and_remembered(
    black_hole: BlackHole, no_proxies: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", black_hole.url)
    monkeypatch.setenv("HTTP_PROXY", black_hole.url)
    deadline = _deadline(budget_s=30)
    with pytest.raises(FetchError) as first:
        HttpClient(deadline=deadline, answer_timeout_s=0.5).get("https://api.github.example/repos/a/b/releases")
    assert "through the proxy 127.0.0.1" in str(first.value) and "the proxy 127.0.0.1" in str(first.value)
    with pytest.raises(FetchError, match=f"not asked: the proxy 127.0.0.1:{black_hole.port} did not answer earlier"):
        HttpClient(deadline=deadline).get("http://download.pytorch.example/whl/cu130/")  # same proxy
    assert len(black_hole.accepted) == 1


@pytest.mark.parametrize("proxy", ["http://[::1", "http://proxy.example:99999", "http://:3128"])
def test_a_proxy_that_is_not_a_url_is_a_usage_error_with_a_hint(
    proxy: str, no_proxies: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``HTTPS_PROXY=http://[::1`` raised ValueError from ``urlsplit`` on every request: an internal error of ``plan``
    and ``install`` (CLI fuzz, 2026-12-03). It is the environment's error, said with the variable to fix."""
    monkeypatch.setenv("HTTPS_PROXY", proxy)
    with pytest.raises(UsageError, match="HTTPS_PROXY names is not a URL") as err:
        HttpClient(deadline=_deadline()).get("https://api.github.example/repos/a/b/releases")
    assert "HTTPS_PROXY" in (err.value.hint or "")


def test_no_proxy_is_honoured_as_pip_does(
    black_hole: BlackHole, no_proxies: None, monkeypatch: pytest.MonkeyPatch, served: str
) -> None:
    monkeypatch.setenv("HTTP_PROXY", black_hole.url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    assert HttpClient(deadline=_deadline()).get(f"{served}/page").body == b"hello"
    assert black_hole.accepted == []


def test_a_refused_connection_is_not_retried_and_is_remembered(no_proxies: None) -> None:
    port = refusing_port()
    deadline = _deadline()
    with pytest.raises(FetchError, match=r"(?i)refused.*is not asked again"):
        HttpClient(deadline=deadline, sleep=lambda s: pytest.fail("a refusal was retried")).get(
            f"http://127.0.0.1:{port}/x")
    assert deadline.dead(f"127.0.0.1:{port}") is not None


def test_the_budget_caps_every_request_and_then_nothing_is_asked(
    black_hole: BlackHole, no_proxies: None
) -> None:
    deadline = _deadline(budget_s=1.0)
    start = time.monotonic()
    with pytest.raises(FetchError, match="within 1 s"):
        HttpClient(deadline=deadline, answer_timeout_s=30).get(f"{black_hole.url}/a")
    assert time.monotonic() - start < 8  # the budget, not the 30 s answer timeout
    assert deadline.remaining_s() == 0
    with pytest.raises(FetchError, match=r"not asked; the network budget of this command \(1 s, "
                                         r"ATTNFORGE_NET_BUDGET_S\) is spent"):
        HttpClient(deadline=deadline).get(f"http://127.0.0.1:{refusing_port()}/b")


def test_a_wait_past_two_seconds_is_said_once_through_the_callback(
    black_hole: BlackHole, no_proxies: None
) -> None:
    said: list[str] = []
    deadline = _deadline(budget_s=1.0, notice_after_s=0.2, on_wait=said.append)
    with pytest.raises(FetchError):
        HttpClient(deadline=deadline).get(f"{black_hole.url}/simple/flash-attn/")
    assert len(said) == 1
    assert said[0].startswith(f"waiting for {black_hole.url}/simple/flash-attn/: up to 1 s more of the 1 s")


def test_an_answer_within_the_notice_time_says_nothing(served: str, no_proxies: None) -> None:
    said: list[str] = []
    HttpClient(deadline=_deadline(on_wait=said.append)).get(f"{served}/page")
    assert said == []


# -- auth and credentials ------------------------------------------------------------------------------------
class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []  # noqa: RUF012 - one list per test (reset by the fixture)

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        type(self).seen.append(dict(self.headers.items()))
        status = 401 if self.path.startswith("/private") else 200
        self.send_response(status)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")


@pytest.fixture
def served() -> Iterator[str]:
    _Recorder.seen = []
    with local_server(_Recorder) as url:
        yield url


def test_credentials_in_the_url_are_basic_auth_and_never_shown(served: str, no_proxies: None) -> None:
    url = served.replace("http://", "http://team:s3cr%40t@") + "/private/x"
    with pytest.raises(HttpStatusError) as err:
        HttpClient(deadline=_deadline()).get(url)
    assert err.value.code == 401
    assert "s3cr" not in str(err.value) and "team" not in str(err.value)
    expected = "Basic " + base64.b64encode(b"team:s3cr@t").decode()
    assert _Recorder.seen[-1]["Authorization"] == expected
    assert shown(url) == f"{served}/private/x"


def test_an_explicit_auth_header_is_sent(served: str, no_proxies: None) -> None:
    with HttpClient(deadline=_deadline()).open(f"{served}/x", auth="Basic abc") as resp:
        assert resp.read() == b"hello"
    assert _Recorder.seen[-1]["Authorization"] == "Basic abc"


# -- the deadline itself -------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["abc", "-1", "nan", "inf"])
def test_a_bad_budget_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="ATTNFORGE_NET_BUDGET_S"):
        budget_from({"ATTNFORGE_NET_BUDGET_S": text})


def test_the_budget_defaults_to_20_s_and_reads_the_variable() -> None:
    assert budget_from({}) == 20.0
    assert budget_from({"ATTNFORGE_NET_BUDGET_S": "2.5"}) == 2.5


def test_a_command_shares_one_deadline_and_outside_a_command_each_call_gets_its_own() -> None:
    mine = NetDeadline(budget_s=3)
    with command_deadline(mine):
        assert current_deadline() is mine
        assert HttpClient().deadline is mine
    assert current_deadline() is not current_deadline()


def test_a_redirect_to_another_host_does_not_carry_the_credentials(served: str, no_proxies: None) -> None:
    class Redirect(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", f"{served}/file.whl")  # another port: another host for HTTP
            self.end_headers()

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        answer = HttpClient(deadline=_deadline()).get(f"http://team:pw@127.0.0.1:{srv.server_address[1]}/simple/")
    finally:
        srv.shutdown()
        srv.server_close()
    assert answer.body == b"hello"
    assert "Authorization" not in _Recorder.seen[-1]


def test_an_upload_is_not_refused_when_the_budget_is_spent(served: str, no_proxies: None) -> None:
    deadline = _deadline(budget_s=0)
    with pytest.raises(FetchError, match="budget"):
        HttpClient(deadline=deadline).get(f"{served}/x")
    with HttpClient(deadline=deadline).open(f"{served}/x", bounded=False) as resp:
        assert resp.read() == b"hello"


def test_a_name_lookup_cut_short_by_the_callers_deadline_does_not_mark_the_host_dead() -> None:
    import threading as _threading

    answered = _threading.Event()

    def slow(host: str) -> None:
        if not answered.wait(1.0):  # the first lookup outlives the caller's 0.05 s
            return

    hosts = HostLookup(lookup=slow)
    assert hosts.problem("https://files.example/x", timeout_s=0.05) is not None  # no answer in the time left
    answered.set()
    assert hosts.problem("https://files.example/x") is None  # asked again with the whole timeout: it answers
