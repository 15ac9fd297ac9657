"""``attnforge install`` of a source shows the build's progress, as ``attnforge build`` does.

On the H200 (2026-12-02, docs/benchmarks.md "thirty-eighth session") ``attnforge install sageattention-2 --source``
ran 315 s and 560 s without printing a line before its time limit cut it: nobody could tell a slow compile from a
hung one, nor how far it got. A source build inside ``install`` now reports its phases, ninja's ``[n/N]`` steps and
the heartbeats of a silent compiler on stderr (:func:`attnforge.cli.build.build_progress`), and stdout keeps the
JSON alone.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

pytestmark = [
    # attnforge.build.stream.run_streamed leaves the build's stdout pipe for the GC to close (as in
    # tests/install/test_e2e_fixture.py); that ResourceWarning is not what this test is about.
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]


@pytest.mark.integration
@pytest.mark.slow  # 20-30 s: a real compile of the C++ fixture extension
def test_a_source_install_reports_its_build_on_stderr(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """The real command in a fresh venv, a cold cache: the compile's phases reach stderr while it runs, in order,
    the last one ``done``; stdout is the JSON result (a build), and the module imports."""
    from tests.venvs import nested_venv

    python = nested_venv(tmp_path / "venv")
    source = tmp_path / "src"
    shutil.copytree(FIXTURES / "ext_pkg", source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    done = subprocess.run([python, "-m", "attnforge", "install", "--source", str(source), "--no-verify", "--json",
                           "--offline"], capture_output=True, text=True, env=cli_env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)  # nothing but the JSON on stdout
    assert result["action"] == "built", result["action"]
    phases = [line.split(":")[1].strip() for line in done.stderr.splitlines() if line.startswith("attnforge: ")
              and line.split(":")[1].strip() in ("fetch", "unpack", "build", "stage", "done")]
    assert "build" in phases and phases[-1] == "done", done.stderr[-2000:]
    assert phases.index("build") < phases.index("done")
    imported = subprocess.run([python, "-c", "import af_ext_fixture"], capture_output=True, text=True,
                              env=cli_env, cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr[-2000:]


def test_a_cache_hit_install_draws_no_progress(tmp_path: Path) -> None:
    """The live bar starts at a build's first event, not when ``install`` starts: an install served from the cache
    (no build events) leaves the terminal as it was."""
    import io

    from rich.console import Console

    from attnforge.build.progress import Phase, PhaseEvent
    from attnforge.cli.build import RichReporter

    out = io.StringIO()
    quiet = RichReporter(Console(file=out, force_terminal=True, width=100), "flash-attn-3")
    with quiet:
        pass
    assert out.getvalue() == ""
    shown = RichReporter(Console(file=out, force_terminal=True, width=100), "flash-attn-3")
    with shown:
        shown.report(PhaseEvent(phase=Phase.BUILD, detail="pip wheel"))
    assert "flash-attn-3" in out.getvalue() and "pip wheel" in out.getvalue()
