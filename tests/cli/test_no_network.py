"""Error paths found on the lent GPU machine: a DNS resolver that never answers, ``--offline``, a deleted cwd.

The network is stubbed only at its OS seam (``socket.getaddrinfo`` / ``socket.socket.connect``); the commands are
the real ones (``main``), and the deleted working directory is a real one, in a real subprocess.
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

from attnforge._system.net import HostLookup
from attnforge.cli import main
from attnforge.fetch.deadline import NetDeadline
from attnforge.fetch.http import FetchError, HttpClient
from attnforge.fetch.listings import ListingCache

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SNAP = FIXTURES / "snapshots"
WIN5090 = str(SNAP / "windows_rtx5090_torch2.8_cu128.json")
CPU = str(SNAP / "cpu_dev_torch2.13_cpu.json")
API = "http://api.github.attnforge-test"  # never resolved for real: the lookup below answers for it
RELEASES_URL = f"{API}/repos/woct0rdho/SageAttention/releases?per_page=100"


@pytest.fixture
def silent_dns(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A resolver that never answers for any name (the lent GPU machine); returns the names asked."""
    asked: list[str] = []
    release = threading.Event()

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(str(host))
        release.wait(60)  # "never" for the test; released at teardown so no thread outlives it long
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setenv("ATTNFORGE_WHEEL_SOURCES", "on")
    monkeypatch.setenv("GITHUB_API_URL", API)
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    yield asked
    release.set()


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every name lookup and connection is recorded and refused."""
    touched: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        touched.append(repr(args[:2]))
        raise OSError("the network was touched")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setenv("ATTNFORGE_WHEEL_SOURCES", "on")
    return touched


def _plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    rc = main(["plan", *argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_a_lookup_that_never_answers_costs_one_short_deadline(silent_dns: list[str]) -> None:
    fetcher = HttpClient(deadline=NetDeadline(hosts=HostLookup(timeout_s=0.5)))
    start = time.monotonic()
    with pytest.raises(FetchError, match=r"no answer to the name lookup within 0.5 s .*unreachable"):
        fetcher.get("http://download.pytorch.example/whl/cu130/")
    with pytest.raises(FetchError, match="no answer"):  # the same host: not asked again
        fetcher.get("http://download.pytorch.example/whl/cu128/")
    assert time.monotonic() - start < 2.0
    assert silent_dns == ["download.pytorch.example"]


def test_plan_with_silent_dns_uses_the_cached_listing_with_its_age_and_goes_on(
    silent_dns: list[str], attnforge_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    releases = json.loads((FIXTURES / "wheels" / "listings" / "woct0rdho_SageAttention.releases.json").read_text())
    ListingCache(root=attnforge_home / "listings").save(
        RELEASES_URL, body=releases, etag=None, fetched_at="2026-11-20T08:00:00+00:00")
    start = time.monotonic()
    rc, doc = _plan(capsys, "sageattention-2", "--snapshot", WIN5090)
    elapsed = time.monotonic() - start
    assert elapsed < 8.0, f"plan took {elapsed:.1f} s with a silent resolver"  # one 3 s deadline, not 21 s
    assert rc == 0 and doc["chosen"]["kind"] == "wheel"
    line = next(p for p in doc["listing_problems"] if "woct0rdho" in p)
    assert "no answer to the name lookup within 3 s" in line
    assert "used the listing fetched 2026-11-20T08:00:00+00:00" in line and "days old" in line
    assert silent_dns.count("api.github.attnforge-test") == 1  # every GitHub source after the first: no wait


def test_plan_with_silent_dns_and_no_cached_listing_says_unreachable_and_builds(
    silent_dns: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    rc, doc = _plan(capsys, "sageattention-2", "--snapshot", WIN5090)
    line = next(p for p in doc["listing_problems"] if "woct0rdho" in p)
    assert "the source is unreachable; skipped" in line
    assert all(c["kind"] != "wheel" for c in doc["candidates"])
    assert rc in (0, 1)


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["plan", "sageattention-2", "--snapshot", WIN5090, "--offline"], id="plan"),
        pytest.param(["plan", "flash-attn-3", "--snapshot", str(SNAP / "h200_torch2.11_cu130.json"), "--offline"],
                     id="plan-pytorch-index"),
        pytest.param(["install", "flash-attn", "--snapshot", CPU, "--offline", "--no-verify"], id="install"),
        pytest.param(["build", "flash-attn", "--snapshot", CPU, "--offline"], id="build"),
    ],
)
def test_offline_never_touches_the_network(
    argv: list[str], no_network: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) in (0, 1)
    assert no_network == []
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["probe", "--json"], id="probe"),
        pytest.param(["plan", "flash-attn", "--offline"], id="plan"),
        pytest.param(["install", "flash-attn", "--offline", "--no-verify"], id="install"),
        pytest.param(["build", "flash-attn"], id="build"),
        pytest.param(["cache", "list"], id="cache-list"),
        pytest.param(["plan", "flash-attn", "--snapshot", "relative.json"], id="relative-path"),
    ],
)
def test_a_deleted_working_directory_is_said_not_a_traceback(
    argv: list[str], tmp_path: Path, cli_env: dict[str, str]
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    script = ("import os, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); "
              "os.execv(sys.executable, [sys.executable, '-m', 'attnforge', *sys.argv[2:]])")
    done = subprocess.run([sys.executable, "-c", script, str(gone), *argv], capture_output=True, text=True,
                          env=cli_env, cwd=tmp_path, timeout=300)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "note: the current directory no longer exists" in done.stderr
    assert done.returncode in (0, 1, 2), done.stderr[-2000:]
    if argv[0] == "probe":
        assert done.returncode == 0 and json.loads(done.stdout)["platform"]["disk_free_bytes"] is not None
    if "relative.json" in argv:
        assert done.returncode == 2 and "relative.json" in done.stderr


def test_an_offline_build_of_a_source_it_would_download_is_refused_before_building(
    no_network: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The H200 could build flash-attn, but its source is the PyPI sdist: --offline says so, exit 1."""
    assert main(["build", "flash_attn", "--snapshot", str(SNAP / "h200_torch2.11_cu130.json"), "--offline"]) == 1
    err = capsys.readouterr().err
    assert "error: flash-attn cannot be built offline" in err
    assert "--offline: the pypi-sdist source cannot be downloaded; pass a local --source" in err
    assert no_network == []


@pytest.mark.slow
def test_an_index_url_whose_host_never_answers_is_one_line_after_one_deadline(
    silent_dns: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--index-url`` pages (fetch/indexes.py) sit behind the same deadline: one wait for the host, however
    many distributions the backend has, then the plan goes on."""
    start = time.monotonic()
    rc, doc = _plan(capsys, "flash-attn", "--snapshot", str(SNAP / "h200_torch2.11_cu130.json"),
                    "--index-url", "https://wheels.attnforge-test/simple")
    assert time.monotonic() - start < 8.0
    lines = [p for p in doc["listing_problems"] if p.startswith("https://wheels.attnforge-test/simple")]
    assert lines and all("no answer to the name lookup within 3 s" in line for line in lines)
    assert silent_dns.count("wheels.attnforge-test") == 1
    assert rc == 0 and doc["chosen"]["kind"] == "source"
