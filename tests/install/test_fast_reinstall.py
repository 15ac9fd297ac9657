"""A cache-hit reinstall does only what it needs (issue 18 item 8): no ``import torch`` when torch's files are
unchanged, no import probe of the other installed backends, no known-source listing; and the torch probe's memo
is keyed so that a changed torch, interpreter or environment is probed again.

The end-to-end test runs the real CLI in a fresh venv and counts the subprocesses it starts through the runner
seam; the memo tests use a stand-in ``torch`` package on ``sys.path`` and a counting ``run``.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge._system.runner import Completed
from attnforge.probe.memo import probe_torch
from tests.cache.wheelmaker import make_wheel
from tests.conftest import REPO
from tests.venvs import nested_venv

#: The CLI, with every subprocess it starts through the runner seam printed on stderr as ``RAN argv``.
COUNTING_CLI = """
import sys
from attnforge._system import runner
real = runner.SubprocessRunner.run
def run(self, argv, **kw):
    print("RAN " + " ".join(str(a) for a in argv).replace(chr(10), " "), file=sys.stderr)
    return real(self, argv, **kw)
runner.SubprocessRunner.run = run
from attnforge.cli import run as main
sys.argv[0] = "attnforge"
main()
"""
IMPORTS_TORCH = {"flash_attn/cute/__init__.py": b"import torch\n"}


def started(stderr: str, what: str) -> int:
    return sum(1 for line in stderr.splitlines() if line.startswith("RAN ") and what in line)


@pytest.mark.integration
@pytest.mark.slow
def test_a_cache_hit_reinstall_imports_torch_in_the_target_at_most_once(tmp_path: Path) -> None:
    python = nested_venv(tmp_path / "venv")
    wheels = tmp_path / "wheels"
    make_wheel(wheels, name="flash-attn-4", version="4.0.0b36", extra_files=IMPORTS_TORCH)
    neighbour = make_wheel(tmp_path / "others", name="sageattention", version="1.0.6",
                           extra_files={"sageattention/__init__.py": b"import torch\n"})
    env = dict(os.environ, ATTNFORGE_HOME=str(tmp_path / "home"), PYTHONPATH=str(REPO / "src"))
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(neighbour)], env=env,
                   check=True, capture_output=True)
    cli = [python, "-c", COUNTING_CLI, "install", "flash-attn-4", "--arch", "9.0", "--offline", "--no-verify",
           "--json"]

    def install(*extra: str) -> tuple[dict[str, object], str]:
        done = subprocess.run([*cli, *extra], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout), done.stderr

    first, ran = install("--find-links", str(wheels))
    assert first["action"] == "wheel"
    assert started(ran, "_torch_script.py") == 1
    assert started(ran, "_backend_script.py") == 0  # sageattention is installed, but not what was asked for
    subprocess.run([python, "-m", "pip", "uninstall", "-y", "-q", "flash-attn-4"], env=env, check=True)

    again, ran = install()
    assert again["action"] == "cache-hit"
    assert started(ran, "_torch_script.py") == 0  # remembered: torch's files did not change
    assert started(ran, "_backend_script.py") == 0
    assert started(ran, " pip install ") == 1
    assert again["pip"]["torch_version"] is not None  # type: ignore[index]  # the real check still ran

    # another CUDA_VISIBLE_DEVICES is another answer: probed again
    env["CUDA_VISIBLE_DEVICES"] = "7"
    subprocess.run([python, "-m", "pip", "uninstall", "-y", "-q", "flash-attn-4"], env=env, check=True)
    third, ran = install()
    assert third["action"] == "cache-hit"
    assert started(ran, "_torch_script.py") == 1


ANSWER = json.dumps({"version": "2.13.0+cu130", "cuda_version": "13.0", "cxx11_abi": True})


@pytest.fixture
def fake_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``torch`` package that ``importlib.util.find_spec`` finds on ``sys.path`` (it is never imported)."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('never imported')\n")
    (site / "torch" / "version.py").write_text("__version__ = '2.13.0+cu130'\n")
    (site / "torch-2.13.0.dist-info").mkdir()
    (site / "torch-2.13.0.dist-info" / "RECORD").write_text("torch/__init__.py,,\n")
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    return site / "torch"


class CountingProbe:
    def __init__(self, stdout: str = ANSWER, returncode: int = 0) -> None:
        self.calls = 0
        self.stdout, self.returncode = stdout, returncode

    def __call__(self) -> Completed:
        self.calls += 1
        return Completed(argv=("python", "probe"), returncode=self.returncode, stdout=self.stdout + "\n")


def ask(run: CountingProbe, memo: Path, *, python: str = sys.executable,
        environ: dict[str, str] | None = None) -> tuple[str, bool]:
    done, remembered = probe_torch(run, python=python, script=Path(__file__), environ=environ or dict(os.environ),
                                   memo=memo)
    return done.stdout.strip(), remembered


def test_the_answer_is_remembered_until_torch_changes(fake_torch: Path, tmp_path: Path) -> None:
    run, memo = CountingProbe(), tmp_path / "memo"
    assert ask(run, memo) == (ANSWER, False)
    assert ask(run, memo) == (ANSWER, True)
    assert run.calls == 1
    (fake_torch / "version.py").write_text("__version__ = '2.14.0+cu130'\n")  # a reinstall rewrites it
    os.utime(fake_torch / "version.py", ns=(1, 1))
    assert ask(run, memo) == (ANSWER, False)
    assert run.calls == 2


def test_a_changed_cuda_library_wheel_beside_torch_is_probed_again(fake_torch: Path, tmp_path: Path) -> None:
    run, memo = CountingProbe(), tmp_path / "memo"
    ask(run, memo)
    cudnn = fake_torch.parent / "nvidia_cudnn_cu12-9.1.0.dist-info"
    cudnn.mkdir()
    (cudnn / "RECORD").write_text("nvidia/cudnn/lib/libcudnn.so.9,,\n")
    assert ask(run, memo)[1] is False
    assert ask(run, memo)[1] is True
    assert run.calls == 2


def test_an_environment_that_steers_torch_is_another_key(fake_torch: Path, tmp_path: Path) -> None:
    run, memo = CountingProbe(), tmp_path / "memo"
    ask(run, memo)
    assert ask(run, memo, environ={**os.environ, "LD_LIBRARY_PATH": "/elsewhere"})[1] is False
    assert run.calls == 2


def test_a_failed_probe_and_another_interpreter_are_never_remembered(fake_torch: Path, tmp_path: Path) -> None:
    memo = tmp_path / "memo"
    broken = CountingProbe(stdout=json.dumps({"error": "ImportError: libcudart.so.13"}))
    ask(broken, memo)
    ask(broken, memo)
    assert broken.calls == 2
    other = CountingProbe()
    ask(other, memo, python=str(tmp_path / "other" / "python"))
    ask(other, memo, python=str(tmp_path / "other" / "python"))
    assert other.calls == 2
    assert not list(memo.glob("torch-*.json"))


def test_a_memo_that_is_a_link_or_garbage_is_not_read(fake_torch: Path, tmp_path: Path) -> None:
    run, memo = CountingProbe(), tmp_path / "memo"
    ask(run, memo)
    (kept,) = memo.glob("torch-*.json")
    kept.write_text("not json\n")
    assert ask(run, memo)[1] is False
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(ANSWER + "\n")
    kept.unlink()
    kept.symlink_to(elsewhere)
    assert ask(run, memo)[1] is False
    assert run.calls == 3
    assert elsewhere.read_text() == ANSWER + "\n"  # the link was replaced, never written through
