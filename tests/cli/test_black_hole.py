"""A network that accepts and never answers (issue 31): a proxy, a GitHub API, an ``--index-url`` on 127.0.0.1
that take the connection and send nothing, and a DNS resolver that never answers. Every command answers within
its network budget (``ATTNFORGE_NET_BUDGET_S``), says what it waits for after 2 s, and goes on without the
network (a source build, the cached listing with its age).

The servers are real sockets on 127.0.0.1 (:mod:`tests.fetch.servers`); the commands are the real ones, in
process (``main``) or, once, as ``python -m attnforge``. The time bounds are generous (the machine is loaded): a
broken budget costs 30 s or more per request.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from attnforge.catalog import load_catalog
from attnforge.cli import main
from attnforge.fetch.listings import ListingCache
from tests.fetch.servers import PROXY_VARIABLES, BlackHole

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SNAP = FIXTURES / "snapshots"
H200 = str(SNAP / "h200_torch2.11_cu130.json")
WIN5090 = str(SNAP / "windows_rtx5090_torch2.8_cu128.json")


@pytest.fixture
def hole(monkeypatch: pytest.MonkeyPatch) -> Iterator[BlackHole]:
    """A black hole on 127.0.0.1, the known wheel sources on, no proxy yet."""
    for var in PROXY_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("GITHUB_API_URL", raising=False)
    monkeypatch.setenv("ATTNFORGE_WHEEL_SOURCES", "on")
    server = BlackHole()
    yield server
    server.close()


@pytest.fixture
def as_proxy(hole: BlackHole, monkeypatch: pytest.MonkeyPatch) -> BlackHole:
    monkeypatch.setenv("HTTPS_PROXY", hole.url)
    monkeypatch.setenv("HTTP_PROXY", hole.url)
    return hole


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, float, str, str]:
    start = time.monotonic()
    rc = main(list(argv))
    elapsed = time.monotonic() - start
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, elapsed, out, err


def test_plan_behind_a_proxy_that_never_answers_ends_within_the_budget_and_says_what_it_waits_for(
    as_proxy: BlackHole, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ATTNFORGE_NET_BUDGET_S", "4")
    rc, elapsed, out, err = _run(capsys, "plan", "flash-attn", "--snapshot", H200, "--json")
    assert elapsed < 15, f"plan took {elapsed:.1f} s with a 4 s network budget"
    doc = json.loads(out)
    assert rc == 0 and doc["chosen"]["kind"] == "source"
    assert "note: waiting for https://api.github.com/repos/" in err
    assert f"(through the proxy 127.0.0.1:{as_proxy.port})" in err
    problems = [p for p in doc["listing_problems"] if p.startswith("wheel source")]
    assert len(problems) == 3 and all("network budget of this command (4 s" in p for p in problems)
    assert len(as_proxy.accepted) == 1  # the sources after the first were not even tried


@pytest.mark.parametrize("backend", list(load_catalog().backends))
def test_plan_of_every_catalog_backend_answers_behind_a_dead_proxy(
    backend: str, as_proxy: BlackHole, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ATTNFORGE_NET_BUDGET_S", "0.5")
    rc, elapsed, _, _ = _run(capsys, "plan", backend, "--snapshot", H200, "--json")
    assert rc in (0, 1)
    assert elapsed < 10


def test_plan_xformers_reads_the_pytorch_index_through_the_proxy_within_the_budget(
    as_proxy: BlackHole, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ATTNFORGE_NET_BUDGET_S", "3")
    rc, elapsed, out, err = _run(capsys, "plan", "xformers", "--snapshot", H200, "--json")
    assert elapsed < 12
    assert rc in (0, 1)
    line = next(p for p in json.loads(out)["listing_problems"] if "pytorch-xformers" in p)
    assert "download.pytorch.org" in line and "within 3 s" in line
    assert "note: waiting for https://download.pytorch.org/whl/cu13" in err


def test_install_behind_a_dead_proxy_gets_past_the_network_within_the_budget(
    as_proxy: BlackHole, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Up to the network part: the plan (listings through the proxy) is done, then the what-if install stops
    at the snapshot's interpreter, which is not on this machine."""
    monkeypatch.setenv("ATTNFORGE_NET_BUDGET_S", "1")
    rc, elapsed, _, err = _run(capsys, "install", "flash-attn", "--snapshot", H200, "--no-verify")
    assert elapsed < 12
    assert rc == 1 and "error: the build interpreter" in err
    assert "note: wheel source dao-ailab: no answer from https://api.github.com" in err


def test_a_github_api_that_never_answers_is_asked_once(
    hole: BlackHole, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GITHUB_API_URL", hole.url)
    monkeypatch.setenv("ATTNFORGE_NET_BUDGET_S", "3")
    rc, elapsed, out, err = _run(capsys, "plan", "flash-attn", "--snapshot", H200, "--json")
    assert elapsed < 12
    assert rc == 0 and json.loads(out)["chosen"]["kind"] == "source"
    assert f"note: waiting for {hole.url}/repos/Dao-AILab/flash-attention/releases" in err
    assert len(hole.accepted) == 1


def test_an_index_url_that_never_answers_is_one_problem_line_per_project(
    hole: BlackHole, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ATTNFORGE_WHEEL_SOURCES", "off")
    monkeypatch.setenv("ATTNFORGE_NET_BUDGET_S", "2")
    index = f"http://mirror:s3cret@127.0.0.1:{hole.port}/simple"
    rc, elapsed, out, _ = _run(capsys, "plan", "flash-attn", "--snapshot", H200, "--index-url", index, "--json")
    assert elapsed < 10
    doc = json.loads(out)
    lines = [p for p in doc["listing_problems"] if p.startswith(f"http://127.0.0.1:{hole.port}/simple")]
    assert lines and "no answer from" in lines[0]
    assert not any("s3cret" in p for p in doc["listing_problems"])  # the credentials: sent, never said
    assert rc == 0 and doc["chosen"]["kind"] == "source"


def test_a_spent_budget_falls_back_to_the_cached_listing_with_its_age(
    as_proxy: BlackHole, attnforge_home: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    releases = json.loads((FIXTURES / "wheels" / "listings" / "woct0rdho_SageAttention.releases.json").read_text())
    url = "https://api.github.com/repos/woct0rdho/SageAttention/releases?per_page=100"
    ListingCache(root=attnforge_home / "listings").save(url, body=releases, etag=None,
                                                        fetched_at="2026-11-20T08:00:00+00:00")
    monkeypatch.setenv("ATTNFORGE_NET_BUDGET_S", "1")
    rc, elapsed, out, _ = _run(capsys, "plan", "sageattention-2", "--snapshot", WIN5090, "--json")
    assert elapsed < 10
    doc = json.loads(out)
    assert rc == 0 and doc["chosen"]["kind"] == "wheel"
    line = next(p for p in doc["listing_problems"] if "woct0rdho" in p)
    assert "network budget of this command (1 s" in line
    assert "used the listing fetched 2026-11-20T08:00:00+00:00" in line and "days old" in line


@pytest.mark.parametrize("api", ["notaurl", "http://[::1", "https://api.example:99999"])
def test_a_github_api_url_that_is_not_a_url_skips_the_sources_with_a_clear_line(
    hole: BlackHole, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], api: str
) -> None:
    """``http://[::1`` and a port past 65535 raised ValueError from ``urlsplit``: an internal error of ``plan`` (CLI
    fuzz, 2026-12-03), where ``notaurl`` was a line."""
    monkeypatch.setenv("GITHUB_API_URL", api)
    rc, _, out, _ = _run(capsys, "plan", "flash-attn", "--snapshot", H200, "--json")
    problems = json.loads(out)["listing_problems"]
    assert rc == 0
    assert any(f"GITHUB_API_URL={api!r} is not an http(s):// URL" in p and p.endswith("skipped") for p in problems)


def test_a_bad_network_budget_is_bad_input(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ATTNFORGE_NET_BUDGET_S", "soon")
    assert main(["plan", "flash-attn", "--snapshot", H200]) == 2
    err = capsys.readouterr().err
    assert "error: ATTNFORGE_NET_BUDGET_S='soon' is not a number of seconds" in err and "hint:" in err


def test_a_silent_dns_waits_no_longer_than_the_budget(
    hole: BlackHole, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    release = threading.Event()

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        release.wait(60)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setenv("GITHUB_API_URL", "http://api.github.attnforge-test")
    monkeypatch.setenv("ATTNFORGE_NET_BUDGET_S", "1")
    try:
        rc, elapsed, out, _ = _run(capsys, "plan", "sageattention-2", "--snapshot", WIN5090, "--json")
    finally:
        release.set()
    assert elapsed < 8
    line = next(p for p in json.loads(out)["listing_problems"] if "woct0rdho" in p)
    assert "no answer to the name lookup within 1 s" in line
    assert rc in (0, 1)


@pytest.mark.slow
def test_the_real_command_with_the_default_budget_answers_within_20_s(
    as_proxy: BlackHole, cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``python -m attnforge plan flash-attn`` behind the dead proxy with no budget set: one request waits its
    answer timeout (10 s), the proxy is then dead for the other sources (was 275 s)."""
    env = {**cli_env, "HTTPS_PROXY": as_proxy.url, "HTTP_PROXY": as_proxy.url, "ATTNFORGE_WHEEL_SOURCES": "on"}
    env.pop("ATTNFORGE_NET_BUDGET_S", None)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "attnforge", "plan", "flash-attn", "--snapshot", H200],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False)
    elapsed = time.monotonic() - start
    assert elapsed < 20 + 10, f"{elapsed:.1f} s"  # 10 s of waiting, plus a loaded machine's start-up
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "note: waiting for https://api.github.com/repos/Dao-AILab" in done.stderr
    said = done.stdout + done.stderr  # the plan's notes are part of the plan
    assert f"the proxy 127.0.0.1:{as_proxy.port} is not asked again in this command" in said
    assert said.count(f"not asked: the proxy 127.0.0.1:{as_proxy.port} did not answer earlier in this command") == 2
    assert len(as_proxy.accepted) == 1
