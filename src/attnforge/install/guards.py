"""The install's guards around pip: one install per environment at a time, and built wheels pinned to the
torch they were built against (see :mod:`attnforge.cache.label`)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import filelock

from attnforge.cache import Store
from attnforge.cache.capabilities import capabilities_file
from attnforge.cache.label import LocalLabel, label_wheel
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.types import BuildSpec
from attnforge.types.binary import AbiKind, BinaryTarget
from attnforge.types.versions import parse_major_minor


@contextmanager
def interpreter_lock(store: Store, python: str) -> Iterator[None]:
    """Hold the install lock of the environment ``python`` belongs to, across processes.

    Keyed by the interpreter's directory with directory symlinks resolved but not the interpreter file
    itself (every venv's ``bin/python`` links to the same base interpreter, yet each venv is its own
    target). Kept in ``<home>/locks``, or in a per-user directory under the temp dir when the home is
    read-only (a shared cache).
    """
    env_dir = Path(python).absolute().parent.resolve()
    digest = hashlib.sha256(str(env_dir).encode()).hexdigest()[:32]
    locks = store.root / "locks"
    if store.read_only:
        locks = Path(tempfile.gettempdir()) / f"attnforge-locks-{os.getuid() if hasattr(os, 'getuid') else 0}"
    locks.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(locks / f"interpreter-{digest}.lock"), timeout=-1):
        yield


def scratch_dir(store: Store) -> Path:
    return Path(tempfile.gettempdir()) if store.read_only else store.root / "tmp"


def pinned_to_torch(wheel: Path, spec: BuildSpec, snapshot: SystemSnapshot, target: BinaryTarget | None = None,
                    ) -> Path:
    """The built wheel with a local label naming the torch/CUDA/ABI/archs it was built for,
    ``Requires-Dist: torch==X.Y.*`` (see :mod:`attnforge.cache.label`) and, for a slim build, its capabilities
    in the ``.dist-info`` (:mod:`attnforge.cache.capabilities`), written next to it; unchanged when
    there is no torch, the wheel is pure Python (platform ``any``: it links nothing of torch's), the binary is
    bound to no torch (``target`` pure or TVM FFI), or the project set its own local label.

    A libtorch stable-ABI ``target`` is labelled with its minimum torch and ``stable``
    (``cu130torch2.9.stable.sm90``) and requires ``torch>=2.9``: one wheel for every torch it serves."""
    torch = snapshot.torch
    if torch is None or "+" in wheel.name.split("-")[1] or wheel.name.endswith("-any.whl"):
        return wheel
    if target is not None and target.abi in (AbiKind.PURE, AbiKind.TVM_FFI):
        return wheel
    if target is not None and target.abi is AbiKind.TORCH_STABLE and target.torch is not None:
        label = LocalLabel(torch=parse_major_minor(target.torch), cuda=torch.cuda_version, archs=spec.archs,
                           stable_abi=True)
    else:
        label = LocalLabel.for_torch(torch.version, torch.cuda_version, torch.cxx11_abi, spec.archs)
    extra = capabilities_file(spec.capabilities) if spec.capabilities is not None else None
    return label_wheel(wheel, label, wheel.parent, dist_info_files=extra)
