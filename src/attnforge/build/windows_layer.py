"""The executor's Windows layer: a Windows snapshot and a BuildSpec in, the build's complete environment out.

:mod:`attnforge.resolve.msvc` decides the toolset and toolkit (asked with the BuildSpec's answers, so the plan's
decision comes out), :mod:`attnforge.build.windows_env` sets the variables and captures ``vcvars64``; this module
applies that to one :class:`~attnforge.resolve.types.BuildSpec` for :func:`attnforge.build.execute.execute`.
The environment the build process gets is layered, later layers winning, names compared case-insensitively
(Windows' ``Path`` is ``PATH``)::

    os.environ  <  vcvars64 (captured)  <  windows_build_env  <  spec.env  <  implied by the spec's fields

with the chosen toolkit's ``bin`` first on ``PATH``. Nothing here ran on a real Windows machine; it is tested
with a Windows snapshot fixture and a recorded ``set`` output (``tests/build/test_execute_windows.py``).
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath

from attnforge._system.runner import Runner
from attnforge.build.windows_env import WindowsBuildEnv, capture_vcvars, merge_env, windows_build_env
from attnforge.catalog.msvc import MsvcCatalog
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.msvc import MsvcWindow, choose_windows_toolchain
from attnforge.resolve.types import BuildSpec

_KEY8 = re.compile(r"[0-9a-f]{8}")


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowsBuild:
    """A prepared Windows build.

    Attributes:
        plan: the toolset / toolkit / variable choices (:func:`windows_build_env`).
        captured: the environment ``vcvars64.bat`` left (INCLUDE, LIB, LIBPATH, Path, VCToolsVersion, ...).
        env: the complete environment of the build process.
    """

    plan: WindowsBuildEnv
    captured: dict[str, str]
    env: dict[str, str]

    def log_lines(self) -> list[str]:
        """What the build log says about the Windows environment (no values of the user's variables)."""
        plan = self.plan
        lines = [f"windows: vcvars {plan.vcvars_command}",
                 f"windows: MSVC {self.captured.get('VCToolsVersion', '?')} from {plan.visual_studio.display_name}",
                 f"windows: CUDA_HOME={self.env.get('CUDA_HOME')} TMP={plan.temp_dir}",
                 f"windows: NVCC_APPEND_FLAGS={plan.env.get('NVCC_APPEND_FLAGS', '')}"]
        lines += [f"windows: note {n}" for n in plan.notes]
        return lines


def builds_on_windows(snapshot: object | None) -> bool:
    """The build targets Windows: the snapshot says so, or there is no snapshot and this is Windows."""
    if isinstance(snapshot, SystemSnapshot):
        return snapshot.platform.os == "windows"
    return sys.platform == "win32"


def key8_of(spec: BuildSpec) -> str:
    """The 8 hex digits naming this build: the resolver's build-root leaf (``C:\\afb\\9f0fb2a6``), else a
    hash of what is built."""
    leaf = PureWindowsPath(spec.build_root).name if spec.build_root else ""
    if _KEY8.fullmatch(leaf):
        return leaf
    text = "|".join([spec.name, spec.version or "", spec.source.location, spec.source.ref or ""])
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def prepare_windows_build(
    spec: BuildSpec,
    snapshot: SystemSnapshot,
    *,
    base: Mapping[str, str],
    build_root: str,
    runner: Runner,
    scratch_dir: Path,
    windows: Sequence[MsvcWindow] | None = None,
    msvc: MsvcCatalog | None = None,
) -> WindowsBuild:
    """Choose the toolset and toolkit, run ``vcvars64.bat`` through ``runner``, and layer the environment.

    Args:
        spec: the build; ``msvc_toolset`` selects ``-vcvars_ver``, ``toolkit`` is tried first,
            ``allow_unsupported_compiler`` permits ``-allow-unsupported-compiler``.
        snapshot: the Windows machine (Visual Studio instances, CUDA toolkits, torch).
        base: the user's environment.
        build_root: the directory the executor builds under (TMP/TEMP go to ``<build_root>\\t``).
        runner: runs ``cmd /d /c <scratch_dir>\\vcvars_capture.cmd``.
        scratch_dir: where the capture batch file is written (removed with the build's scratch).
        windows: nvcc's host-compiler rows (default: the packaged catalog's).
        msvc: the MSVC catalog (default: the packaged one).

    Raises:
        BuildError: no usable Visual Studio or CUDA toolkit, an MSVC nvcc refuses with no fix to apply,
            a Python that cannot compile extensions, or vcvars64 failed (see :func:`windows_build_env` and
            :func:`capture_vcvars`).
    """
    if windows is None:
        from attnforge.catalog import load_catalog

        windows = load_catalog().tools.host_compilers
    if msvc is None:
        from attnforge.catalog.msvc import load_msvc

        msvc = load_msvc()
    toolchain = choose_windows_toolchain(  # the plan's answers in, so the same decision comes out
        snapshot, windows=windows, msvc=msvc, msvc_toolset=spec.msvc_toolset, toolkit=spec.toolkit,
        allow_unsupported_compiler=spec.allow_unsupported_compiler)
    plan = windows_build_env(snapshot, key8=key8_of(spec), toolchain=toolchain, msvc=msvc, build_root=build_root)
    captured = capture_vcvars(runner, plan.visual_studio, scratch_dir, plan.vcvars_ver)
    return WindowsBuild(plan=plan, captured=captured, env=windows_environment(spec, base, plan, captured))


def windows_environment(
    spec: BuildSpec, base: Mapping[str, str], plan: WindowsBuildEnv, captured: Mapping[str, str]
) -> dict[str, str]:
    """The layers, in order: ``base`` < ``captured`` < ``plan.env`` < ``spec.env`` < implied by the spec.

    Two exceptions keep the Windows choices from being undone by the resolver's generic ``spec.env``:
    ``CUDA_HOME``/``CUDA_PATH`` follow the toolkit :func:`windows_build_env` settled on when it moved to
    another installed toolkit, and ``NVCC_APPEND_FLAGS`` is joined, not replaced (the conformance flags are
    needed whatever else is asked for). ``MAX_JOBS``/``NVCC_THREADS`` and ``CUDA_HOME`` are implied by the
    spec's fields unless ``spec.env`` sets them, as on Linux.
    """
    toolkit = plan.toolkit.path
    spec_env = dict(spec.env)
    moved = spec.toolkit is not None and spec.toolkit.path != toolkit
    if moved:
        spec_env.update({k: toolkit for k in ("CUDA_HOME", "CUDA_PATH") if k in spec_env})
    ours = plan.env.get("NVCC_APPEND_FLAGS", "").split()
    if "NVCC_APPEND_FLAGS" in spec_env:
        theirs = spec_env["NVCC_APPEND_FLAGS"].split()
        spec_env["NVCC_APPEND_FLAGS"] = " ".join(ours + [f for f in theirs if f not in ours])
    implied = {**spec.job_env(), "CUDA_HOME": toolkit}
    implied = {k: v for k, v in implied.items() if k not in spec_env}
    env = merge_env(plan.full_env(base, captured), spec_env, implied)
    env.setdefault("PYTHONUNBUFFERED", "1")  # setup.py prints reach the log as they happen
    return env
