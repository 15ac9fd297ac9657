"""Downloading a listed wheel over HTTP on 127.0.0.1: streamed, hashed against the published digest, cached
with its provenance (source, URL, digest trust, listing time), then installed."""

from __future__ import annotations

import functools
import http.server
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from attnforge._system.runner import SubprocessRunner
from attnforge.cache import Store
from attnforge.cache._files import sha256_file
from attnforge.errors import CacheError, InstallError
from attnforge.fetch.download import check_digest, stream
from attnforge.install.flow import Action, InstallResult, install
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.types import CachedArtifact, Candidate, CandidateKind, Plan, Request, WheelRef
from tests._http import local_server
from tests.cache.wheelmaker import make_wheel
from tests.conftest import REPO
from tests.install.helpers import pip_wheel_builder
from tests.venvs import nested_venv

SNAPSHOT = REPO / "tests" / "fixtures" / "snapshots" / "cpu_dev_torch2.13_cpu.json"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "served"
    root.mkdir()
    with local_server(functools.partial(_Quiet, directory=str(root))) as url:
        yield url, root


def test_stream_hashes_what_it_writes(served: tuple[str, Path], tmp_path: Path) -> None:
    base, root = served
    (root / "blob.bin").write_bytes(b"x" * 3_000_000)
    sha = stream(f"{base}/blob.bin", tmp_path / "out.bin", progress=False)
    assert sha == sha256_file(tmp_path / "out.bin") == sha256_file(root / "blob.bin")


def test_stream_failure_is_an_install_error_and_leaves_no_partial_file(
    served: tuple[str, Path], tmp_path: Path
) -> None:
    base, _ = served
    with pytest.raises(InstallError) as err:
        stream(f"{base}/missing.whl", tmp_path / "missing.whl", progress=False)
    assert "could not download" in err.value.message
    assert not (tmp_path / "missing.whl").exists()


def test_check_digest() -> None:
    assert check_digest("a.whl", "u", "ab" * 32, None) == "recorded on first use, not published"
    assert check_digest("a.whl", "u", "ab" * 32, "AB" * 32) == "published"
    with pytest.raises(CacheError):
        check_digest("a.whl", "u", "ab" * 32, "cd" * 32)


class _OneWheel:
    def __init__(self, ref: WheelRef) -> None:
        self.ref = ref

    def __call__(self, request: Request, *, cached: Sequence[CachedArtifact]) -> Plan:
        cands = [
            Candidate(kind=CandidateKind.CACHE, description="cache", accepted=True, cache_key=a.key) for a in cached
        ]
        cands.append(Candidate(kind=CandidateKind.WHEEL, description=self.ref.filename, accepted=True, wheel=self.ref))
        return Plan(request=request, candidates=tuple(cands))


def _install_one(ref: WheelRef, store: Store, python: str) -> InstallResult:
    """``install`` of the fixture with ``ref`` as the only candidate (no verify), into ``python``."""
    return install(Request(backend="af-pure-fixture"), snapshot=SystemSnapshot.load(SNAPSHOT), store=store,
                   planner=_OneWheel(ref), builder=pip_wheel_builder, verifier=None, runner=SubprocessRunner(),
                   python=python)


@pytest.mark.integration
def test_a_listed_wheel_is_downloaded_checked_cached_with_provenance_and_installed(
    served: tuple[str, Path], tmp_path: Path
) -> None:
    base, root = served
    wheel = make_wheel(root, value=7)
    python = nested_venv(tmp_path / "venv")
    ref = WheelRef(
        filename=wheel.name,
        url=f"{base}/{wheel.name}",
        sha256=sha256_file(wheel),
        source="woct0rdho",
        listed_at="2026-11-22T22:00:00+00:00",
    )
    store = Store(tmp_path / "home")
    result = _install_one(ref, store, python)
    assert result.action == Action.WHEEL
    prov = store.list()[0].provenance
    assert prov["source"] == "woct0rdho"
    assert prov["url"] == ref.url
    assert prov["sha256_source"] == "published"
    assert prov["listed_at"] == "2026-11-22T22:00:00+00:00"
    done = subprocess.run([python, "-c", "import af_pure_fixture as m; print(m.VALUE)"], capture_output=True, text=True)
    assert done.stdout.strip() == "7"


@pytest.mark.integration
def test_a_wheel_that_does_not_match_its_published_digest_is_refused(served: tuple[str, Path], tmp_path: Path) -> None:
    base, root = served
    wheel = make_wheel(root, value=8)
    ref = WheelRef(filename=wheel.name, url=f"{base}/{wheel.name}", sha256="0" * 64, source="kingbri1")
    store = Store(tmp_path / "home")
    with pytest.raises(CacheError) as err:
        _install_one(ref, store, "/nonexistent/python")
    assert "does not match its published sha256" in err.value.message
    assert store.list() == []
