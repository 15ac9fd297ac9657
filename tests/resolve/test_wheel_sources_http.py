"""``attnforge plan`` against the recorded wheel listings, served over HTTP on 127.0.0.1 through
``GITHUB_API_URL`` (tests/fixtures/wheels/SOURCES.md says where each listing came from)."""

from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from attnforge.cli import main

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
LISTINGS = FIXTURES / "wheels" / "listings"
SNAP = FIXTURES / "snapshots"
REPOS = {
    "woct0rdho/SageAttention": "woct0rdho_SageAttention",
    "kingbri1/flash-attention": "kingbri1_flash-attention",
    "mjun0812/flash-attention-prebuild-wheels": "mjun0812_flash-attention-prebuild-wheels",
    "Dao-AILab/flash-attention": "Dao-AILab_flash-attention",
}


class _Server(http.server.ThreadingHTTPServer):
    hits: list[tuple[str, dict[str, str]]]
    mode: str  # "ok", "ratelimit", "down"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.hits.append((self.path, dict(self.headers.items())))
        if self.server.mode == "ratelimit":
            self._send(
                403,
                b'{"message": "API rate limit exceeded"}',
                {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1795000000"},
            )
            return
        if self.server.mode == "down":
            self._send(503, b"down", {})
            return
        target = self.path
        if target.startswith("http://"):  # asked as a proxy: the request line holds the absolute URL
            target = "/" + target.split("/", 3)[3]
        path, _, query = target.partition("?")
        if path.startswith("/repos/") and path.endswith("/releases"):
            repo = path.removeprefix("/repos/").removesuffix("/releases")
            releases = json.loads((LISTINGS / f"{REPOS[repo]}.releases.json").read_text())
            etag = f'"{repo}"'
            if self.headers.get("If-None-Match") == etag:
                self._send(304, b"", {"ETag": etag})
                return
            # two pages: the first release alone, then the rest (the client must follow Link rel="next")
            if "page=2" in query:
                self._send(200, json.dumps(releases[1:]).encode(), {"ETag": etag})
            else:
                host = self.headers["Host"]
                link = f'<http://{host}{path}?per_page=100&page=2>; rel="next"'
                self._send(200, json.dumps(releases[:1]).encode(), {"ETag": etag, "Link": link})
            return
        if path == "/whl/cu130/flash-attn-3/flash-attn-3/":
            self._send(200, (LISTINGS / "pytorch_cu130_flash-attn-3.html").read_bytes(), {})
            return
        self._send(404, b"not found", {})

    def _send(self, code: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch, attnforge_home: Path, tmp_path: Path) -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.hits, srv.mode = [], "ok"
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    extra = tmp_path / "team_sources.toml"
    extra.write_text(
        'schema_version = 1\n[sources.pytorch-flash-attn-3]\nkind = "pep503"\n'
        f'index = "{base}/whl/{{cuda_tag}}/flash-attn-3/"\n'
        'backends = ["flash-attn-3"]\ndistributions = ["flash-attn-3"]\ngrammars = []\n'
        'implied = { cuda = "{cuda_tag}", torch = "2.9", torch_match = "at-least" }\n'
        'covers = "test copy of the PyTorch FA3 index"\nsources = ["tests/fixtures/wheels/SOURCES.md"]\n'
    )
    monkeypatch.setenv("ATTNFORGE_WHEEL_SOURCES", "on")
    monkeypatch.setenv("GITHUB_API_URL", base)
    monkeypatch.setenv("ATTNFORGE_EXTRA_WHEEL_SOURCES", str(extra))
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    yield srv
    srv.shutdown()
    srv.server_close()


def _plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    rc = main(["plan", *argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def _reasons(doc: dict[str, Any], filename: str) -> list[str]:
    return next(c["reasons"] for c in doc["candidates"] if c["description"].startswith(filename))


def test_windows_5090_sageattention_picks_a_2_2_0_wheel_with_sm120(
    server: _Server, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, doc = _plan(capsys, "sageattention", "--snapshot", str(SNAP / "windows_rtx5090_torch2.8_cu128.json"))
    assert rc == 0
    chosen = doc["chosen"]
    assert chosen["kind"] == "wheel"
    assert chosen["wheel"]["filename"] == "sageattention-2.2.0+cu128torch2.8.0.post3-cp39-abi3-win_amd64.whl"
    assert chosen["wheel"]["source"] == "woct0rdho"
    assert any("declares code for 12.0: sm_120a" in r for r in chosen["reasons"])
    assert "v2.2.0-windows.post3" in chosen["wheel"]["url"]
    # the name people type resolves to SageAttention 2, never the PyPI 1.x sdist
    assert doc["backend"] == "sageattention-2"
    assert not any("pypi-sdist" in c["description"] for c in doc["candidates"])
    # the stable-ABI wheel for torch >= 2.9 is rejected with its reason
    reasons = _reasons(doc, "sageattention-2.2.0+cu128torch2.9.0andhigher.post4")
    assert any("built for torch 2.9.0 or newer (stable ABI), you have torch 2.8.0+cu128" in r for r in reasons)
    # CUDA 13 wheels need a CUDA 13 torch (and this driver runs CUDA up to 12.9)
    reasons = _reasons(doc, "sageattention-2.2.0+cu130torch2.9.0andhigher.post4")
    assert any("CUDA majors must match" in r for r in reasons)
    assert any("the driver" in r and "12.9" in r for r in reasons)
    # pagination was followed: the first page held only the post4 release
    assert any("page=2" in path for path, _ in server.hits)


def test_windows_5090_flash_attn_picks_a_windows_wheel_for_torch_2_8(
    server: _Server, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, doc = _plan(capsys, "flash_attn", "--snapshot", str(SNAP / "windows_rtx5090_torch2.8_cu128.json"))
    assert rc == 0
    wheel = doc["chosen"]["wheel"]
    assert wheel["filename"] == "flash_attn-2.8.3+cu128torch2.8.0cxx11abiFALSE-cp312-cp312-win_amd64.whl"
    assert wheel["source"] == "kingbri1"
    assert any(
        "built for torch 2.7.0 exactly, you have torch 2.8.0+cu128" in r
        for r in _reasons(doc, "flash_attn-2.8.3+cu128torch2.7.0cxx11abiFALSE-cp312-cp312-win_amd64.whl")
    )
    assert any(
        "do not fit Python 3.12.10" in r
        for r in _reasons(doc, "flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl")
    )
    # the source build is still listed after the wheels, and each route has its expected time
    kinds = [c["kind"] for c in doc["candidates"]]
    assert kinds.index("source") > kinds.index("wheel")
    assert doc["expected_s"]["wheel"] < doc["expected_s"]["source"] == 830


def test_linux_h100_torch_2_8_picks_an_upstream_or_mjun0812_fa2_wheel(
    server: _Server, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, doc = _plan(capsys, "flash-attn", "--snapshot", str(SNAP / "h100_torch2.8_cu128.json"))
    assert rc == 0
    wheel = doc["chosen"]["wheel"]
    assert wheel["source"] in ("dao-ailab", "mjun0812")
    assert wheel["filename"] == "flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"
    assert any(
        "cxx11abiFALSE, torch here uses cxx11abiTRUE" in r
        for r in _reasons(doc, "flash_attn-2.8.3+cu12torch2.8cxx11abiFALSE-cp312-cp312-linux_x86_64.whl")
    )


def test_h200_torch_2_11_cu130_picks_fa3_from_the_pytorch_index(
    server: _Server, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, doc = _plan(capsys, "flash_attn_3", "--snapshot", str(SNAP / "h200_torch2.11_cu130.json"))
    assert rc == 0
    wheel = doc["chosen"]["wheel"]
    assert wheel["filename"] == "flash_attn_3-3.0.0-cp39-abi3-manylinux_2_28_x86_64.whl"
    assert wheel["source"] == "pytorch-flash-attn-3"
    assert wheel["implied_cuda"] == "130"
    assert any("do not fit" in r for r in _reasons(doc, "flash_attn_3-3.0.0-cp39-abi3-win_amd64.whl"))


def test_listing_is_cached_and_reused_offline(server: _Server, capsys: pytest.CaptureFixture[str]) -> None:
    snap = str(SNAP / "windows_rtx5090_torch2.8_cu128.json")
    _plan(capsys, "sageattention-2", "--snapshot", snap)
    # second run: the first page is asked with If-None-Match and answered 304
    server.hits.clear()
    rc, doc = _plan(capsys, "sageattention-2", "--snapshot", snap)
    assert rc == 0 and doc["chosen"]["kind"] == "wheel"
    assert any(h.get("If-None-Match") == '"woct0rdho/SageAttention"' for _, h in server.hits)
    server.hits.clear()
    rc, doc = _plan(capsys, "sageattention-2", "--snapshot", snap, "--offline")
    assert server.hits == []
    assert doc["chosen"]["kind"] == "wheel"
    assert any("--offline: used the listing fetched" in p for p in doc["listing_problems"])


def test_offline_without_a_cached_listing_is_one_line_and_falls_through(
    server: _Server, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, doc = _plan(
        capsys, "sageattention-2", "--snapshot", str(SNAP / "windows_rtx5090_torch2.8_cu128.json"), "--offline"
    )
    lines = [p for p in doc["listing_problems"] if p.startswith("wheel source woct0rdho")]
    assert lines == ["wheel source woct0rdho: --offline and no listing was ever fetched; skipped"]
    assert all(c["kind"] != "wheel" for c in doc["candidates"])
    assert server.hits == []
    assert rc in (0, 1)


def test_rate_limit_is_a_line_with_the_reset_time_and_token_hint(
    server: _Server, capsys: pytest.CaptureFixture[str]
) -> None:
    server.mode = "ratelimit"
    _rc, doc = _plan(capsys, "sageattention-2", "--snapshot", str(SNAP / "windows_rtx5090_torch2.8_cu128.json"))
    line = next(p for p in doc["listing_problems"] if "woct0rdho" in p)
    assert "rate limit" in line and "2026-11-18" in line and "GITHUB_TOKEN" in line
    assert len([h for h in server.hits if "SageAttention" in h[0]]) == 1  # a rate limit is not retried


def test_token_is_sent_as_bearer(
    server: _Server, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_test")
    _plan(capsys, "sageattention-2", "--snapshot", str(SNAP / "windows_rtx5090_torch2.8_cu128.json"))
    assert any(h.get("Authorization") == "Bearer ghp_test" for _, h in server.hits)


def test_a_source_that_is_down_is_one_line_and_the_plan_goes_on(
    server: _Server, capsys: pytest.CaptureFixture[str]
) -> None:
    server.mode = "down"
    rc, doc = _plan(capsys, "sageattention-2", "--snapshot", str(SNAP / "windows_rtx5090_torch2.8_cu128.json"))
    lines = [p for p in doc["listing_problems"] if p.startswith("wheel source woct0rdho")]
    assert len(lines) == 1 and "HTTP 503" in lines[0] and "after 3 attempts" in lines[0]
    assert doc["chosen"]["kind"] == "source"  # falls through to the build from git
    assert rc == 0


def test_a_teams_find_links_page_is_a_source(
    server: _Server, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = f"http://127.0.0.1:{server.server_address[1]}"
    team = tmp_path / "team.toml"
    team.write_text(
        'schema_version = 1\n[sources.team]\nkind = "find-links"\n'
        f'index = "{base}/whl/cu130/flash-attn-3/flash-attn-3/"\n'
        'backends = ["flash-attn-3"]\ndistributions = ["flash-attn-3"]\ngrammars = []\n'
        'implied = { cuda = "130", torch = "2.10", torch_match = "at-least" }\n'
        'covers = "our builds"\nsources = ["our CI"]\n'
        # keep the fixture's 127.0.0.1 copy of the PyTorch index, so nothing reaches download.pytorch.org
        + Path(os.environ["ATTNFORGE_EXTRA_WHEEL_SOURCES"]).read_text().replace("schema_version = 1\n", "")
    )
    monkeypatch.setenv("ATTNFORGE_EXTRA_WHEEL_SOURCES", str(team))
    rc, doc = _plan(capsys, "flash-attn-3", "--snapshot", str(SNAP / "h200_torch2.11_cu130.json"))
    assert rc == 0
    team_rows = [c for c in doc["candidates"] if c["wheel"] and c["wheel"]["source"] == "team"]
    assert [c["wheel"]["filename"] for c in team_rows if c["accepted"]] == [
        "flash_attn_3-3.0.0-cp39-abi3-manylinux_2_28_x86_64.whl"
    ]
    assert team_rows[0]["wheel"]["implied_torch"] == "2.10"


def test_a_source_the_catalog_does_not_know_has_no_build_time_before_its_first_build(
    attnforge_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """[route_times]' default source figure is FlashAttention's and Sage's (15-60 min): a one-file C++ extension
    was printed "expected ~30 min" (it builds in ~20 s here). No figure until this machine has built it."""
    rc, doc = _plan(capsys, "--source", str(FIXTURES / "ext_pkg"), "--snapshot",
                    str(SNAP / "cpu_dev_torch2.13_cpu.json"))
    assert rc == 0
    assert doc["expected_s"]["source"] is None
    main(["plan", "--source", str(FIXTURES / "ext_pkg"), "--snapshot", str(SNAP / "cpu_dev_torch2.13_cpu.json")])
    out = capsys.readouterr().out
    assert "[source] build af_ext_fixture" in out and "expected ~" not in out
    assert "fixes its archs" not in out  # the C++-only recipe has no nvcc targets to name
    assert "af_ext_fixture installed in" not in out and "not looked for" in out  # the snapshot probes catalog ids


def test_the_build_route_time_comes_from_an_earlier_build_here(
    attnforge_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from attnforge.cache import Store
    from tests.cache.conftest import inputs_for
    from tests.cache.wheelmaker import make_wheel

    wheel = make_wheel(tmp_path / "w", name="flash-attn", version="2.8.3")
    log = tmp_path / "build.log"
    log.write_text("[97/97] Linking\nattnforge: built flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl in 512.0 s\n")
    Store(attnforge_home).put(wheel, inputs_for(wheel), log_path=log)
    rc, doc = _plan(capsys, "flash-attn", "--snapshot", str(SNAP / "h200_torch2.11_cu130.json"))
    assert rc == 0
    assert doc["expected_s"]["source"] == 512.0
    main(["plan", "flash-attn", "--snapshot", str(SNAP / "h200_torch2.11_cu130.json")])
    assert "(expected ~9 min, measured by an earlier build here)" in capsys.readouterr().out


def test_a_slim_build_route_time_is_the_slim_estimate(
    attnforge_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source line and the slim section of one plan agree (the early H100 call printed "expected ~30 min"
    for a slim FA3 whose slim section said ~2 min)."""
    monkeypatch.setenv("ATTNFORGE_WHEEL_SOURCES", "off")
    argv = ("flash-attn-3", "--head-dim", "64,128,256", "--dtype", "bf16", "--snapshot",
            str(SNAP / "h200_torch2.11_cu130.json"))
    rc, doc = _plan(capsys, *argv)
    assert rc == 0
    slim_s = doc["slim"]["estimate_s"]
    assert slim_s < doc["slim"]["full_estimate_s"] / 10
    assert doc["expected_s"]["source"] == slim_s
    main(["plan", *argv])
    assert f"(expected ~{slim_s / 60:.0f} min)" in capsys.readouterr().out


def test_the_proxy_from_the_environment_is_used(
    server: _Server, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_API_URL", "http://github-api.invalid")
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.delenv("no_proxy")
    rc, doc = _plan(capsys, "sageattention-2", "--snapshot", str(SNAP / "windows_rtx5090_torch2.8_cu128.json"))
    assert rc == 0 and doc["chosen"]["kind"] == "wheel"
    assert any(
        path.startswith("http://github-api.invalid/repos/woct0rdho/SageAttention/releases") for path, _ in server.hits
    )
