"""End to end with the real fixture extension (``af_ext_fixture``, a torch C++ extension compiled here).

build -> cache -> ``cache export`` -> plain ``pip install --index-url file://...`` into a fresh venv ->
import; 8 concurrent ``attnforge install`` processes; 8 concurrent cold installs that build once; a tampered
wheel.
One real compile per cold store (about 30 s on 2 cores).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from attnforge.cache import Entry, Store
from attnforge.cache.share import export, import_
from tests.cache.wheelmaker import flip_byte
from tests.conftest import REPO, SRC
from tests.install.fixture_build import EXT_PKG, build_fixture_into
from tests.venvs import nested_venv

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    # attnforge.build.stream.run_streamed leaves the build's stdout pipe for the GC to close (reported to the
    # build owner); that ResourceWarning is not what these tests are about.
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]

CHECK = "import torch, af_ext_fixture as m; print(m.add(torch.ones(3), torch.ones(3)).tolist())"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, Entry, Path]:
    """A store holding one real build of the fixture, and its export."""
    root = tmp_path_factory.mktemp("e2e")
    store = Store(root / "home")
    entry = build_fixture_into(store)
    export(store, root / "share")
    return store, entry, root / "share"


def make_venv(path: Path) -> str:
    return nested_venv(path)


def imports_fixture(python: str) -> bool:
    done = subprocess.run([python, "-c", CHECK], capture_output=True, text=True)
    return done.returncode == 0 and done.stdout.strip() == "[2.0, 2.0, 2.0]"


def env_for(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env["ATTNFORGE_HOME"] = str(home)
    return env


def test_built_entry_records_what_it_was_built_against(built: tuple[Store, Entry, Path]) -> None:
    store, entry, _ = built
    import torch

    assert entry.inputs.torch_version == torch.__version__
    assert entry.inputs.python_tag == f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert entry.log_path is not None
    assert "af_ext_fixture" in Path(entry.log_path).read_text(errors="replace")
    assert store.get(entry.key).name.startswith("af_ext_fixture-0.1.0-")


def test_plain_pip_installs_the_export_into_a_fresh_venv(
    built: tuple[Store, Entry, Path], tmp_path: Path
) -> None:
    _, _, share = built
    python = make_venv(tmp_path / "venv")
    done = subprocess.run(
        [python, "-m", "pip", "install", "--no-cache-dir", "--no-deps", "--index-url",
         (share / "simple").as_uri(), "af-ext-fixture"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert imports_fixture(python)


def test_uv_installs_the_export_too(built: tuple[Store, Entry, Path], tmp_path: Path) -> None:
    # the dev extras install uv next to this interpreter, which need not be on PATH (pyenv shims, venvs)
    uv = shutil.which("uv") or shutil.which("uv", path=sysconfig.get_path("scripts"))
    if uv is None:
        pytest.skip("uv is not installed on this machine")
    _, _, share = built
    python = make_venv(tmp_path / "venv")
    done = subprocess.run(
        [uv, "pip", "install", "--python", python, "--no-deps", "--index-url", (share / "simple").as_uri(),
         "af-ext-fixture"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert imports_fixture(python)


def test_eight_concurrent_cli_installs_share_one_entry(
    built: tuple[Store, Entry, Path], tmp_path: Path
) -> None:
    """A team member imports the export, then 8 `attnforge install` processes run at once."""
    _, entry, share = built
    home = tmp_path / "home"
    assert import_(Store(home), share).imported == (entry.key,)
    pythons = [make_venv(tmp_path / f"venv{i}") for i in range(8)]

    def one(python: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [python, "-m", "attnforge", "install", "af-ext-fixture", "--source", str(EXT_PKG), "--json"],
            capture_output=True, text=True, env=env_for(home), timeout=600,
        )

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, pythons))
    for done in results:
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        assert doc["action"] == "cache-hit"
        assert doc["cache_key"] == entry.key
    assert [e.key for e in Store(home).list()] == [entry.key]
    assert all(imports_fixture(p) for p in pythons)


_COLD_DRIVER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    sys.path[:0] = [{src!r}, {repo!r}]
    from attnforge._system.runner import SubprocessRunner
    from attnforge.cache import Store
    from attnforge.install.defaults import source_builder
    from attnforge.install.flow import install
    from attnforge.probe.snapshot import SystemSnapshot
    from attnforge.resolve.types import Request
    from tests.install.helpers import OrderedPlanner

    home, python, snapshot = Path(sys.argv[1]), sys.argv[2], SystemSnapshot.load(Path(sys.argv[3]))
    result = install(Request(backend="af-ext-fixture", from_source=True), snapshot=snapshot,
                     store=Store(home), planner=OrderedPlanner(source=Path({ext!r})), builder=source_builder,
                     verifier=None, runner=SubprocessRunner(), python=python)
    print(json.dumps({{"action": result.action, "key": result.cache_key}}))
    """
)


def test_eight_concurrent_cold_installs_build_once(tmp_path: Path) -> None:
    """No cache yet: the per-job lock makes one process build; the other seven find its entry."""
    from attnforge.probe import collect_snapshot

    snapshot = tmp_path / "snapshot.json"
    snapshot.write_text(collect_snapshot(backends=()).to_json())
    home = tmp_path / "home"
    code = _COLD_DRIVER.format(src=str(SRC), repo=str(REPO), ext=str(EXT_PKG))
    pythons = [make_venv(tmp_path / f"venv{i}") for i in range(8)]

    def one(python: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", code, str(home), python, str(snapshot)],
                              capture_output=True, text=True, timeout=900)

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, pythons))
    docs = []
    for done in results:
        assert done.returncode == 0, done.stderr[-3000:]
        docs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert sorted(d["action"] for d in docs) == ["built"] + ["cache-hit"] * 7
    assert len({d["key"] for d in docs}) == 1
    assert len(Store(home).list()) == 1
    assert all(imports_fixture(p) for p in pythons)


def test_a_tampered_cached_wheel_is_refused_with_a_clear_error(
    built: tuple[Store, Entry, Path], tmp_path: Path
) -> None:
    _, entry, share = built
    home = tmp_path / "home"
    store = Store(home)
    import_(store, share)
    flip_byte(Path(store.show(entry.key).path))
    python = make_venv(tmp_path / "venv")
    # no C++ compiler on PATH: the fixture is a C++-only extension, which a CPU torch would otherwise rebuild
    env = {**env_for(home), "PATH": os.pathsep.join([str(Path(python).parent), str(Path(sys.executable).parent)])}
    done = subprocess.run(
        [python, "-m", "attnforge", "install", "af-ext-fixture", "--source", str(EXT_PKG)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert done.returncode == 1
    assert "is corrupt and was not used" in done.stderr
    assert "sha256" in done.stderr
    assert "Traceback" not in done.stderr
    assert not imports_fixture(python)
    assert store.list() == []
    assert len(list(store.quarantine_dir.iterdir())) == 1


def test_a_uv_venv_installs_attnforge_then_a_cached_backend(
    built: tuple[Store, Entry, Path], tmp_path: Path
) -> None:
    """`uv venv && uv pip install attnforge && attnforge install <cached backend>`: no pip anywhere in that env."""
    from attnforge.build.frontend import find_uv
    from tests.venvs import inherit_outer_without_pip, uv_venv

    _, entry, share = built
    python = uv_venv(tmp_path / "uvenv")
    inherit_outer_without_pip(python, tmp_path)  # torch and attnforge's dependencies, offline; still no pip
    repo = tmp_path / "attnforge-src"  # what `uv pip install attnforge` would build: the project, not this tree
    repo.mkdir()
    shutil.copy2(REPO / "pyproject.toml", repo)
    shutil.copy2(REPO / "README.md", repo)
    shutil.copytree(REPO / "src", repo / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    uv = find_uv()
    assert uv is not None
    done = subprocess.run([uv, "pip", "install", "--python", python, "--offline", "--no-deps",
                           "--no-build-isolation", str(repo)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    home = tmp_path / "home"
    assert import_(Store(home), share).imported == (entry.key,)
    env = {k: v for k, v in env_for(home).items() if k != "PYTHONPATH"}  # the attnforge installed in the uv venv
    attnforge = str(Path(python).parent / "attnforge")
    done = subprocess.run([attnforge, "install", "af-ext-fixture", "--source", str(EXT_PKG), "--json",
                           "--no-verify"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert (doc["action"], doc["cache_key"]) == ("cache-hit", entry.key)
    assert imports_fixture(python)
    assert subprocess.run([python, "-c", "import pip"], capture_output=True).returncode != 0
