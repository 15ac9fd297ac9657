"""Bad input and unreachable parts: a clear ``error:`` + ``hint:``, exit 2 (bad input) or 1 (not possible here),
never a traceback. The real CLI in a subprocess."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(cli_env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "attnforge", "fleet", *args], capture_output=True, text=True,
                          env=cli_env, timeout=120, check=False)


def _clean(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert done.returncode == code, done.stdout + done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert "error:" in done.stderr and "hint:" in done.stderr, done.stderr
    for word in words:
        assert word in done.stderr, done.stderr


@pytest.mark.parametrize("address", [pytest.param("not an address", id="spaces"),
                                     pytest.param("10.0.0.1", id="no-port"),
                                     pytest.param("host:99999", id="port-out-of-range")])
def test_a_malformed_address_is_bad_usage(cli_env: dict[str, str], address: str) -> None:
    _clean(_run(cli_env, "probe", "--address", address), 2, "not a Ray address")


def test_an_address_nobody_answers_is_not_possible_and_quick(cli_env: dict[str, str]) -> None:
    _clean(_run(cli_env, "probe", "--address", f"127.0.0.1:{_free_port()}"), 1, "no Ray cluster answers")


def test_missing_ray_names_the_install_command(cli_env: dict[str, str], tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    env = {**cli_env, "PYTHONPATH": f"{tmp_path / 'shadow'}:{cli_env['PYTHONPATH']}"}
    _clean(_run(env, "probe"), 1, "pip install 'attnforge[fleet]'")


def test_a_snapshot_that_is_not_attnforges_is_bad_input(cli_env: dict[str, str], tmp_path: Path) -> None:
    bogus = tmp_path / "node.json"
    bogus.write_text(json.dumps({"hostname": "gpu-07", "gpus": 8}))
    _clean(_run(cli_env, "plan", "flash-attn", "--snapshot", str(bogus)), 2, "node.json", "attnforge probe --json")


def test_an_index_server_that_does_not_answer_is_not_possible(cli_env: dict[str, str]) -> None:
    url = f"http://user:s3cret-pw@127.0.0.1:{_free_port()}/simple/"
    done = _run(cli_env, "build", "flash-attn", "--index", url)
    _clean(done, 1, "does not answer")
    assert "s3cret-pw" not in done.stderr + done.stdout  # credentials are never printed


def test_report_without_records_says_what_to_run(cli_env: dict[str, str]) -> None:
    _clean(_run(cli_env, "report"), 2, "fleet verify")


@pytest.mark.parametrize(("verb", "extra"), [("install", ("--index-url", "file:///nowhere/simple")),
                                             ("plan", ()), ("build", ())])
@pytest.mark.parametrize(("names", "words"), [(("no-such-kernel",), ("unknown backend",)),
                                              (("flash-atn",), ("did you mean 'flash-attn'",)),
                                              ((), ("name at least one backend",))])
def test_fleet_bad_backend_names_are_refused_before_ray_or_any_node_is_asked(
        cli_env: dict[str, str], verb: str, extra: tuple[str, ...], names: tuple[str, ...],
        words: tuple[str, ...]) -> None:
    """An address nobody answers: reaching for it would fail (exit 1) with a connection error, and without
    ``--address`` plan and build started a local Ray (seconds and its banner) before saying the name was wrong."""
    done = _run(cli_env, verb, *names, *extra, "--address", f"127.0.0.1:{_free_port()}")
    _clean(done, 2, *words)
    assert "Ray" not in done.stderr


@pytest.mark.parametrize("answer", [pytest.param(None, id="silent"),
                                    pytest.param(b"HTTP/1.1 400 Bad Request\r\n\r\n", id="http1")])
@pytest.mark.slow
def test_an_address_that_is_not_ray_fails_clearly_within_20_s(cli_env: dict[str, str], answer: bytes | None,
                                                              ) -> None:
    """A plain TCP server on 127.0.0.1 (silent, or an HTTP/1 server): not Ray's gRPC. `ray.init` alone hung 820 s."""
    import threading
    import time

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            if answer is not None:
                conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    start = time.monotonic()
    try:
        done = _run(cli_env, "probe", "--address", f"127.0.0.1:{port}", "--json")
    finally:
        server.close()
        for conn in held:
            conn.close()
    assert time.monotonic() - start <= 20
    _clean(done, 1, "does not answer as a Ray cluster")
    assert json.loads(done.stdout)["kind"] == "error"  # --json: JSON on stdout in this fault too


@pytest.mark.parametrize("verb", ["install", "plan"])
def test_fleet_takes_a_backend_alias_as_attnforge_plan_does(cli_env: dict[str, str], verb: str) -> None:
    """``flash_attn`` and ``sageattention`` name catalog backends (``attnforge plan flash_attn`` takes them): the
    early name check lets them through, so the command goes on to the cluster, here an address nobody answers."""
    extra = ("--index-url", "file:///nowhere/simple") if verb == "install" else ()
    done = _run(cli_env, verb, "flash_attn", "sageattention", *extra, "--address", f"127.0.0.1:{_free_port()}")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "unknown backend" not in done.stderr and "Traceback" not in done.stderr
