"""Verify repairs what an interrupted compile broke: an empty artifact in the Inductor cache is removed and the
case runs once more (issue 31 item 5). The compile is a fake at the adapter seam that loads and writes an
artifact the way Inductor does (a real CPU compile takes 10-30 s on this machine: too slow for a unit test)."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from attnforge.catalog import load_catalog
from attnforge.catalog.tolerances import load_tolerances
from attnforge.verify.cases import generate_cases
from attnforge.verify.check import CaseStatus
from attnforge.verify.device import current_device
from attnforge.verify.repair import compile_cache_dirs, empty_artifacts, remove_empty_artifacts
from attnforge.verify.run import run_verify
from tests.verify.adapters import SdpaMathAdapter, sdpa_math

CPU = current_device("cpu")
CASES = generate_cases(dtypes=("float32",), head_dims=(32,), max_seqlen=32, seed=9)[:3]
HOUR_AGO = time.time() - 3600


def _touch(path: Path, data: bytes = b"", *, old: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if old:
        os.utime(path, (HOUR_AGO, HOUR_AGO))
    return path


@dataclass
class CachedCompileAdapter(SdpaMathAdapter):
    """Loads its "compiled kernel" from ``artifact`` as Inductor loads a cached ``.so``: an empty file fails to
    load (the message glibc's dlopen gives: "file too short"); a missing one is compiled (written) first."""

    name: str = "cached-compile"
    artifact: Path = Path()
    loads: list[int] = field(default_factory=list)

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
        if not self.artifact.exists():
            _touch(self.artifact, b"\x7fELF compiled", old=False)
        size = self.artifact.stat().st_size
        self.loads.append(size)
        if size == 0:
            raise ImportError(f"{self.artifact}: file too short")
        return sdpa_math(q, k, v, causal=causal, scale=scale)


@dataclass
class AlwaysFails(SdpaMathAdapter):
    name: str = "always-fails"

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
        raise RuntimeError("CUDA error: no kernel image is available")


def test_only_old_empty_artifacts_are_found_never_locks_or_fresh_files(tmp_path: Path) -> None:
    root = tmp_path / "inductor"
    broken = _touch(root / "ab" / "cabcdef.so")
    entry = _touch(root / "fxgraph" / "yb" / "fyb123" / "hdri456")
    empty_py = _touch(root / "ui" / "cui789.py")
    _touch(root / "ab" / "cgood.so", b"\x7fELF")  # whole
    _touch(root / "locks" / "cabcdef.lock")  # empty by design
    _touch(root / "ab" / "cabcdef.cpp")  # not a loaded artifact
    _touch(root / "cd" / "cbeing-written.so", old=False)  # another process may be compiling it now
    assert empty_artifacts([root, tmp_path / "missing"]) == sorted([broken, entry, empty_py])
    assert remove_empty_artifacts([root]) == sorted([broken, entry, empty_py])
    assert not broken.exists() and (root / "ab" / "cgood.so").exists() and (root / "locks" / "cabcdef.lock").exists()


def test_the_cache_dirs_are_read_from_the_environment_not_chosen(tmp_path: Path) -> None:
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind"), "TRITON_CACHE_DIR": str(tmp_path / "tri")}
    assert compile_cache_dirs(env) == (tmp_path / "ind", tmp_path / "tri")
    default = compile_cache_dirs({})
    assert default[0].name.startswith("torchinductor_")  # torch's own default
    assert default[1] == Path.home() / ".triton" / "cache"


@pytest.mark.slow
def test_the_inductor_default_is_torchs_own_and_a_passing_verify_never_imports_inductor(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The folder is torch's own answer (its helper), for this user and for a user name torch sanitizes; it is
    looked up only once a case failed, so a verify where every case passes runs with ``torch._inductor``
    unimportable (importing it costs about 1.2 s per verify)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    assert compile_cache_dirs({})[0] == Path(default_cache_dir()).absolute()
    with monkeypatch.context() as m:
        m.setattr(getpass, "getuser", lambda: "DOMAIN\\a:b*c")
        assert compile_cache_dirs({})[0] == Path(default_cache_dir()).absolute()
        assert str(compile_cache_dirs({})[0]).endswith("torchinductor_DOMAIN_a_b_c")
    script = (
        "import sys\n"
        "from attnforge.catalog import load_catalog\n"
        "from attnforge.catalog.tolerances import load_tolerances\n"
        "from attnforge.verify.device import current_device\n"
        "from attnforge.verify.run import run_verify\n"
        "from tests.verify.adapters import SdpaMathAdapter\n"
        "report = run_verify(['sdpa-math'], adapters={'sdpa-math': SdpaMathAdapter()}, catalog=load_catalog(),\n"
        "                    device=current_device('cpu'), tolerances=load_tolerances(), environ={})\n"
        "print(report.results[0].ok, 'torch._inductor' in sys.modules)\n"
    )
    env = {**os.environ, "ATTNFORGE_HOME": str(tmp_path / "home")}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300,
                          cwd=Path(__file__).resolve().parents[2], check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "False"]  # verified, and torch._inductor never imported


def test_verify_removes_an_empty_so_left_in_the_inductor_cache_and_passes_on_the_retry(tmp_path: Path) -> None:
    cache = tmp_path / "inductor"
    artifact = _touch(cache / "ab" / "cabcdef.so")  # what a verify killed mid-compile left behind
    adapter = CachedCompileAdapter(artifact=artifact)
    report = run_verify(["cached-compile"], adapters={"cached-compile": adapter}, catalog=load_catalog(),
                        device=CPU, tolerances=load_tolerances(), environ={"TORCHINDUCTOR_CACHE_DIR": str(cache)})
    [result] = report.results
    assert result.ok, result.summary
    assert adapter.loads[:2] == [0, len(b"\x7fELF compiled")]  # failed once, recompiled, loaded
    assert artifact.read_bytes() == b"\x7fELF compiled"
    assert result.cases[0].status is CaseStatus.PASSED
    assert result.cases[0].repaired == (str(artifact),)
    assert all(not c.repaired for c in result.cases[1:])
    assert "repaired: 1 empty compile artifact(s)" in result.summary and str(artifact) in result.summary


def test_a_backends_own_failure_is_not_retried_and_the_cache_is_scanned_once(tmp_path: Path,
                                                                             monkeypatch: Any) -> None:
    from attnforge.verify import repair

    scans: list[object] = []
    real = repair.remove_empty_artifacts
    monkeypatch.setattr(repair, "remove_empty_artifacts", lambda roots, **kw: scans.append(roots) or real(roots))
    report = run_verify(["always-fails"], adapters={"always-fails": AlwaysFails()}, catalog=load_catalog(),
                        device=CPU, tolerances=load_tolerances(),
                        environ={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    [result] = report.results
    assert not result.ok
    assert all(c.status is CaseStatus.ERROR and not c.repaired for c in result.cases if c.status is not
               CaseStatus.SKIPPED)
    assert len(scans) == 1  # nothing found the first time: the other failures are the backend's own
    assert "repaired" not in result.summary
