"""The torch section of a probe, remembered per interpreter for as long as torch's files stay as they are.

``import torch`` is nearly all of a probe's time (1.3 s on a 2-core machine with a CPU torch; about 5 s with CUDA
on the H200), and an install asks it on every run although what it reports (version, CUDA, C++11 ABI, arch
list, devices) changes only when torch's files, the interpreter, the NVIDIA driver or the environment that
steers torch's start change. ``attnforge install`` therefore passes ``ProbeContext(torch_memo=<home>/probe)``
and the answer is kept in ``torch-<key>.json``. The key is read without importing torch, in this process:

- the probe script's bytes, and the interpreter (the path given, its real path, size and mtime);
- torch's package directory as ``importlib.util.find_spec`` finds it (it does not run ``torch/__init__.py``):
  size and mtime of ``__init__.py``, ``version.py`` (written anew by every torch build and install), every
  ``_C*`` extension and of ``lib/``; the names and ``RECORD`` size/mtime of the ``torch``, ``triton``,
  ``pytorch_triton`` and ``nvidia*`` (the CUDA libraries torch loads) ``.dist-info`` directories beside it;
- the environment variables that change what importing torch sees (:data:`ENV_KEYS`);
- the NVIDIA driver: ``/proc/driver/nvidia/version`` and the names of ``/dev/nvidia*`` (Linux; on Windows the
  driver is not part of the key).

Not in the key on purpose: the site-packages directory's mtime (every install into the environment changes
it, so a reinstall would never hit). Only the interpreter this process runs in is remembered (there
``find_spec`` answers for it); another interpreter is probed every time, and so is a torch that did not import.
Nothing here decides whether a wheel may be installed: the install reads torch's version again, for real,
before and after pip (:mod:`attnforge.install.pip`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from attnforge._system.files import open_nofollow, write_atomic
from attnforge._system.runner import Completed
from attnforge.errors import CacheError

#: Environment variables that change what ``import torch`` finds or reports.
ENV_KEYS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "LD_LIBRARY_PATH", "LD_PRELOAD", "PATH", "PYTHONPATH",
            "PYTHONHOME", "PYTHONNOUSERSITE", "PYTORCH_NVML_BASED_CUDA_CHECK", "HIP_VISIBLE_DEVICES")
#: dist-infos beside torch whose change changes what ``import torch`` does: torch, triton, and the CUDA libraries
#: torch loads from wheels (``nvidia-cudnn-cu12``, ``nvidia-cuda-runtime-cu12``, ...)
_DIST_PREFIXES = ("torch-", "triton-", "pytorch_triton", "nvidia_", "nvidia-")


def probe_torch(
    run: Callable[[], Completed], *, python: str, script: Path, environ: dict[str, str], memo: Path | None,
) -> tuple[Completed, bool]:
    """The torch probe's outcome, and whether it was remembered rather than run.

    ``run`` runs the probe for real; its output is kept when it is one JSON object with a torch version.
    """
    key = _key(python, script, environ) if memo is not None else None
    path = memo / f"torch-{key}.json" if memo is not None and key is not None else None
    if path is not None:
        stdout = _recall(path)
        if stdout is not None:
            return Completed(argv=(python, str(script)), returncode=0, stdout=stdout), True
    done = run()
    if path is not None and done.ok and _is_torch_answer(done.stdout):
        _keep(path, done.stdout.strip().splitlines()[-1])
    return done, False


def _key(python: str, script: Path, environ: dict[str, str]) -> str | None:
    """The memo key, or None when this interpreter's torch cannot be fingerprinted from here."""
    if python != sys.executable or any(environ.get(k) != os.environ.get(k) for k in ("PYTHONPATH", "PYTHONHOME")):
        return None
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    torch_dir = Path(next(iter(spec.submodule_search_locations)))
    parts: list[object] = [hashlib.sha256(script.read_bytes()).hexdigest(), python, _stat(Path(python).resolve()),
                           str(torch_dir.resolve())]
    parts += [(str(p), _stat(p)) for p in _torch_files(torch_dir)]
    parts += [(k, environ.get(k)) for k in ENV_KEYS]
    parts += [_driver()]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]


def _torch_files(torch_dir: Path) -> Iterator[Path]:
    yield from (torch_dir / "__init__.py", torch_dir / "version.py", torch_dir / "lib")
    yield from sorted(torch_dir.glob("_C*"))
    site = torch_dir.parent
    try:
        names = sorted(n for n in os.listdir(site) if n.startswith(_DIST_PREFIXES) and n.endswith(".dist-info"))
    except OSError:
        return
    for name in names:
        yield site / name / "RECORD"


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _driver() -> tuple[str, tuple[str, ...]]:
    try:
        version = Path("/proc/driver/nvidia/version").read_text(errors="replace")
    except OSError:
        version = ""
    try:
        devices = tuple(sorted(n for n in os.listdir("/dev") if n.startswith("nvidia")))
    except OSError:
        devices = ()
    return version, devices


def _is_torch_answer(stdout: str) -> bool:
    lines = stdout.strip().splitlines()
    try:
        doc = json.loads(lines[-1]) if lines else None
    except ValueError:
        return False
    return isinstance(doc, dict) and isinstance(doc.get("version"), str) and "error" not in doc


def _recall(path: Path) -> str | None:
    """The remembered line; None when absent, unreadable, a link, or not a torch answer (then it is ignored)."""
    try:
        with open_nofollow(path) as f:
            text = f.read(1 << 20).decode("utf-8", errors="replace")
    except OSError:
        return None
    return text.strip() if _is_torch_answer(text) else None


def _keep(path: Path, line: str) -> None:
    """Write atomically through an exclusively created temp file; a read-only home (or a probe directory that
    is a symlink) just keeps nothing."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, (line + "\n").encode())
    except (OSError, CacheError):
        return
