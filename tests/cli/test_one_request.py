"""``plan``, ``build`` and ``install`` assemble one request (``attnforge.install.inputs``), so they agree.

Each disagreement of issue 23 runs the real command line (``main``, the console script's body): an alias and a
version specifier reach ``build``; ``plan --json`` shows the cached candidate ``install`` takes; and ``plan --json``
is the plan ``install`` executes for the same arguments, on every route kind, on the fixture snapshots.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from attnforge._serde import to_jsonable
from attnforge.cache import Store
from attnforge.cache._files import sha256_file
from attnforge.cli import main
from attnforge.install.flow import install
from attnforge.install.inputs import RequestArgs, assemble
from attnforge.install.keys import prebuilt_wheel_inputs
from attnforge.probe.snapshot import InstalledBackend, SystemSnapshot
from attnforge.resolve.types import CachedArtifact, Plan, Request
from tests.cache.wheelmaker import make_wheel

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
H200 = FIXTURES / "snapshots" / "h200_torch2.11_cu130.json"
H100 = FIXTURES / "snapshots" / "h100_torch2.8_cu128.json"
CPU = FIXTURES / "snapshots" / "cpu_dev_torch2.13_cpu.json"
WHEELS = FIXTURES / "wheels" / "h200_flash_attn"


def _plan_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    main(["plan", *argv, "--json"])
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def _cache_fa2_for(snapshot_path: Path, home: Path, tmp_path: Path) -> str:
    """A FlashAttention-2 wheel for the snapshot's machine in the store, keyed as ``install`` keys a fetched
    wheel; returns its key."""
    snapshot = SystemSnapshot.load(snapshot_path)
    wheel = make_wheel(tmp_path / "wh", name="flash-attn", version="2.8.3+cu13torch2.11cxx11abiTRUE",
                       tag="cp312-cp312-linux_x86_64")
    inputs = prebuilt_wheel_inputs(wheel=wheel, sha256=sha256_file(wheel), archs=snapshot.compute_capabilities,
                                   snapshot=snapshot)
    return Store(home).put(wheel, inputs, provenance={"origin": "test"}).entry.key


# -- 1. names and version specifiers: build accepts what plan accepts ---------------------------------------
@pytest.mark.parametrize("requirement", ["flash_attn", "flash-attn>=2.7", "FLASH-ATTN==2.8.3"])
def test_build_takes_the_names_and_specifiers_plan_takes(
    requirement: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", requirement, "--snapshot", str(H200)]) == 0
    capsys.readouterr()
    # the CPU machine cannot build it: the refusal is the preflight's (exit 1), not "unknown backend" (exit 2)
    assert main(["build", requirement, "--snapshot", str(CPU)]) == 1
    err = capsys.readouterr().err
    assert "unknown backend" not in err
    assert "error: flash-attn cannot be built on this machine" in err


def test_every_verb_refuses_an_unknown_name_the_same_way(capsys: pytest.CaptureFixture[str]) -> None:
    for verb in ("plan", "build", "install"):
        assert main([verb, "flash-atn", "--snapshot", str(CPU)]) == 2, verb
        assert "error: unknown backend" in capsys.readouterr().err, verb


# -- 2. plan shows the cached candidate install takes --------------------------------------------------------
def test_plan_lists_the_cached_entry_install_takes(
    attnforge_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = _cache_fa2_for(H200, attnforge_home, tmp_path)
    doc = _plan_json(["flash-attn", "--snapshot", str(H200)], capsys)
    assert [c["kind"] for c in doc["candidates"]] == ["installed", "cache", "source"]
    assert doc["chosen"]["kind"] == "cache"
    assert doc["chosen"]["cache_key"] == key


def test_plan_creates_no_cache_for_a_what_if(attnforge_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _plan_json(["flash-attn", "--snapshot", str(H200)], capsys)
    assert not (attnforge_home / "cache.db").exists()
    assert not (attnforge_home / "records.db").exists()


# -- the plan install executes == plan --json, per route kind -------------------------------------------------
class _ExecutedError(Exception):
    """Raised by the recording planner once install has asked for its plan (nothing is installed)."""


def _plan_install_executes(args: RequestArgs) -> Plan:
    """Run the install flow on the request ``attnforge install`` assembles for ``args`` and return the plan it
    acts on; the planner is the assembled one, wrapped only to stop before anything is fetched or built."""
    wanted = assemble(args)
    seen: list[Plan] = []

    def planner(request: Request, *, cached: list[CachedArtifact]) -> Plan:
        seen.append(wanted.planner(request, cached=cached))
        if seen[0].chosen is not None and seen[0].chosen.kind.value == "installed":
            return seen[0]  # install returns "already installed" on its own, touching nothing
        raise _ExecutedError

    with contextlib.suppress(_ExecutedError):
        install(wanted.request, snapshot=wanted.snapshot, store=Store(wanted.home), planner=planner,
                builder=None, verifier=None, runner=None)  # type: ignore[arg-type]
    return seen[0]


def _with_fa2_installed(path: Path, tmp_path: Path) -> Path:
    snap = SystemSnapshot.load(path)
    snap = dataclasses.replace(snap, backends=(InstalledBackend(
        backend="flash-attn", distribution="flash-attn", version="2.8.3", imports=True),))
    out = tmp_path / "installed.json"
    out.write_text(snap.to_json(), encoding="utf-8")
    return out


@pytest.mark.parametrize(
    ("route", "snapshot", "argv"),
    [
        pytest.param("installed", H200, ["flash-attn"], id="installed-h200"),
        pytest.param("cache", H200, ["flash-attn"], id="cache-h200"),
        pytest.param("wheel", H200, ["flash-attn==2.8.3", "--find-links", str(WHEELS)], id="wheel-h200"),
        pytest.param("source", H200, ["flash_attn", "--head-dim", "128"], id="source-h200-slim"),
        pytest.param("source", H100, ["flash-attn>=2.7", "--arch", "9.0"], id="source-h100"),
        pytest.param(None, CPU, ["flash-attn"], id="nothing-cpu"),
    ],
)
def test_plan_json_is_the_plan_install_executes(  # noqa: PLR0917 - three parameters and three fixtures
    route: str | None, snapshot: Path, argv: list[str], attnforge_home: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if route == "installed":
        snapshot = _with_fa2_installed(snapshot, tmp_path)
    if route == "cache":
        _cache_fa2_for(snapshot, attnforge_home, tmp_path)
    doc = _plan_json([*argv, "--snapshot", str(snapshot)], capsys)
    assert (doc["chosen"] or {}).get("kind") == route

    find_links = tuple(argv[argv.index("--find-links") + 1:][:1]) if "--find-links" in argv else ()
    args = RequestArgs(requirement=argv[0], find_links=find_links, snapshot_path=snapshot,
                       archs=tuple(argv[argv.index("--arch") + 1:][:1]) if "--arch" in argv else (),
                       head_dims=("128",) if "--head-dim" in argv else ())
    executed = _plan_install_executes(args)
    assert json.loads(json.dumps(to_jsonable(executed.candidates))) == doc["candidates"]
    assert json.loads(json.dumps(to_jsonable(executed.request))) == doc["request"]


def test_install_json_on_the_installed_route_shows_the_same_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real ``install`` command on a machine (snapshot) where the backend is installed and works."""
    snapshot = _with_fa2_installed(H200, tmp_path)
    doc = _plan_json(["flash_attn", "--snapshot", str(snapshot)], capsys)
    assert main(["install", "flash_attn", "--snapshot", str(snapshot), "--json", "--no-verify"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["action"] == "already-installed"
    assert done["plan"]["candidates"] == doc["candidates"]


# -- 3. build stores what it built; install of the same source is a cache hit; export serves it -------------
@pytest.mark.integration
@pytest.mark.slow  # 20-30 s: a real compile of the C++ fixture extension (issue 32)
def test_build_then_install_of_a_source_is_a_cache_hit_and_export_serves_it(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """The real console script in a fresh venv, as issue 32 measured it: ``build --source DIR`` of the C++ fixture
    extension (any torch extension, not a catalog backend) in a directory named ``src``, then ``plan --source``
    names the cache entry (the project's own name, this machine's build time), ``install --source`` compiles
    nothing, an edited tree is a new build, and ``cache export`` serves the entry."""
    import shutil
    import subprocess

    from tests.venvs import nested_venv

    python = nested_venv(tmp_path / "venv")
    source = tmp_path / "src"  # the directory's name is not the project's
    shutil.copytree(FIXTURES / "ext_pkg", source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    logs = Path(cli_env["ATTNFORGE_HOME"]) / "logs"

    def attnforge(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([python, "-m", "attnforge", *argv], capture_output=True, text=True, env=cli_env,
                              cwd=tmp_path, timeout=600)

    built = attnforge("build", "--source", str(source), "--json", "-q")
    assert built.returncode == 0, built.stderr[-2000:]
    key = json.loads(built.stdout)["cache_key"]
    listed = attnforge("cache", "list", "--json")
    assert key in listed.stdout, listed.stdout
    assert not list((Path(cli_env["ATTNFORGE_HOME"]) / "staging").glob("*/*.whl")), "no staging copy left"
    compiles = sorted(logs.glob("*.log"))
    assert len(compiles) == 1, compiles

    planned = attnforge("plan", "--source", str(source), "--json", "--offline")
    assert planned.returncode == 0, planned.stderr[-2000:]
    doc = json.loads(planned.stdout)
    assert doc["backend"] == "af_ext_fixture", "named by its setup.py, not by its directory"
    assert (doc["chosen"]["kind"], doc["chosen"]["cache_key"]) == ("cache", key)
    assert 0 < doc["expected_s"]["source"] < 600, "this machine's build of it, not the catalog's 30 minutes"

    done = attnforge("install", "--source", str(source), "--no-verify", "--json", "--offline")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert (result["action"], result["cache_key"]) == ("cache-hit", key)
    assert sorted(logs.glob("*.log")) == compiles, "install compiled nothing"

    add = source / "af_ext_fixture" / "add.cpp"
    add.write_text(add.read_text(encoding="utf-8") + "// an edit\n", encoding="utf-8")
    edited = json.loads(attnforge("plan", "--source", str(source), "--json", "--offline").stdout)
    cached = next(c for c in edited["candidates"] if c["kind"] == "cache")
    assert not cached["accepted"] and "another source tree" in cached["reasons"][0], cached
    assert edited["chosen"]["kind"] == "source"

    exported = attnforge("cache", "export", str(tmp_path / "share"))
    assert exported.returncode == 0, exported.stderr
    page = (tmp_path / "share" / "simple" / "af-ext-fixture" / "index.html").read_text(encoding="utf-8")
    assert "af_ext_fixture-0.1.0+" in page
    assert "cxx11abi" in page and ".stable" not in page, "a torch/extension.h build is labelled per torch"
