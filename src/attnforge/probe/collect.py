"""Build one :class:`SystemSnapshot` from the machine. Never raises: a failed section is None plus a reason."""

from __future__ import annotations

import datetime as _dt
import json
import platform as _platform
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnforge._system.paths import home_dir
from attnforge.probe.backends import collect_backends
from attnforge.probe.context import ProbeContext
from attnforge.probe.gpus import collect_gpus
from attnforge.probe.memo import probe_torch
from attnforge.probe.snapshot import PlatformInfo, ProbeProblem, SystemSnapshot, TorchInfo
from attnforge.probe.toolchain import collect_compilers, collect_tool, collect_toolkits
from attnforge.probe.windows import collect_cl, collect_python_dev, collect_visual_studio

if TYPE_CHECKING:
    from attnforge.catalog import Backend

#: Environment variables that change what a CUDA extension build does (install-anchors.md §1.4, §8).
BUILD_ENV_VARS = (
    "CUDA_HOME", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST", "FLASH_ATTN_CUDA_ARCHS", "MAX_JOBS", "NVCC_THREADS",
    "DISTUTILS_USE_SDK", "CC", "CXX", "NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "FLASH_ATTENTION_FORCE_BUILD",
    "PYTORCH_NVCC", "TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES",
    # An active VS developer prompt (toolchain-facts.md §4.2): torch refuses it without DISTUTILS_USE_SDK.
    "VSCMD_ARG_TGT_ARCH", "VCToolsVersion",
)
_TORCH_SCRIPT = Path(__file__).with_name("_torch_script.py")


def collect_snapshot(ctx: ProbeContext | None = None, *, backends: Iterable[Backend]) -> SystemSnapshot:
    """Read the machine once.

    Args:
        ctx: the seams to read through (the real machine when None).
        backends: which backends to look for, as data (``load_catalog().backends.values()``; ``()`` for none).

    Returns:
        A frozen snapshot; sections that could not be read are None/empty with a reason in ``problems``.
    """
    ctx = ctx or ProbeContext()
    problems: list[ProbeProblem] = []

    torch_raw, torch_info, why = _collect_torch(ctx)
    if why:
        problems.append(ProbeProblem(section="torch", reason=why))

    gpus, gpu_reasons = collect_gpus(ctx, torch_raw)
    if not gpus:
        problems.append(ProbeProblem(section="gpus", reason="; ".join(gpu_reasons)))

    toolkits, tk_reasons = collect_toolkits(ctx)
    if not toolkits:
        problems.append(ProbeProblem(section="cuda_toolkits", reason="; ".join(tk_reasons)))

    compilers = collect_compilers(ctx)
    visual_studio: list[Any] = []
    long_paths: bool | None = None
    python_dev = None
    if ctx.os_name == "windows":
        python_dev, dev_why = collect_python_dev(ctx)
        if dev_why:
            problems.append(ProbeProblem(section="python_dev", reason=dev_why))
        visual_studio, vs_why = collect_visual_studio(ctx)
        if vs_why:
            problems.append(ProbeProblem(section="visual_studio", reason=vs_why))
        cl = collect_cl(ctx)
        if cl is not None:
            compilers.append(cl)
        try:
            value = ctx.registry()
            long_paths = None if value is None else value == 1
        except Exception as exc:  # winreg raises OSError subclasses; anything else is also just "unknown"
            problems.append(ProbeProblem(section="long_paths_enabled", reason=f"{type(exc).__name__}: {exc}"))
    if not compilers:
        problems.append(ProbeProblem(section="compilers", reason="no gcc, g++, clang or cl found on PATH"))

    platform_info = _collect_platform(ctx)
    installed = collect_backends(ctx, backends, torch_ok=torch_info is not None)
    env = {k: ctx.environ[k] for k in BUILD_ENV_VARS if k in ctx.environ}
    return SystemSnapshot(
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        platform=platform_info,
        gpus=tuple(gpus),
        torch=torch_info,
        cuda_toolkits=tuple(toolkits),
        compilers=tuple(compilers),
        visual_studio=tuple(visual_studio),
        ninja=collect_tool(ctx, "ninja"),
        sccache=collect_tool(ctx, "sccache"),
        long_paths_enabled=long_paths,
        python_dev=python_dev,
        env=env,
        backends=tuple(installed),
        problems=tuple(problems),
    )


def _collect_torch(ctx: ProbeContext) -> tuple[dict[str, Any] | None, TorchInfo | None, str | None]:
    res, remembered = probe_torch(
        lambda: ctx.runner.run((ctx.python, str(_TORCH_SCRIPT)), env=ctx.environ, timeout_s=ctx.timeout_s * 4),
        python=ctx.python, script=_TORCH_SCRIPT, environ=dict(ctx.environ), memo=ctx.torch_memo,
    )
    if res.returncode == 124:
        return None, None, f"`import torch` did not finish in {ctx.timeout_s * 4:.0f} s"
    lines = res.stdout.strip().splitlines()
    try:
        raw = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        raw = None
    if not isinstance(raw, dict):
        tail = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
        return None, None, f"the torch probe crashed: {tail}"
    if "error" in raw:
        return raw, None, f"torch is not importable: {raw['error']}"
    info = TorchInfo(
        version=raw["version"],
        cuda_version=raw.get("cuda_version"),
        hip_version=raw.get("hip_version"),
        cxx11_abi=raw.get("cxx11_abi"),
        arch_list=tuple(raw.get("arch_list") or ()),
        cudnn_version=raw.get("cudnn_version"),
        sdpa_flash_available=raw.get("sdpa_flash_available"),
        cuda_available=bool(raw.get("cuda_available")),
        triton_version=raw.get("triton_version"),
        source=f"subprocess: {ctx.python} -c 'import torch'" + (" (remembered: torch's files unchanged)"
                                                                  if remembered else ""),
    )
    return raw, info, None


def _collect_platform(ctx: ProbeContext) -> PlatformInfo:
    import psutil
    from packaging import tags

    cache = ctx.cache_dir or home_dir(ctx.environ)
    # the nearest existing directory of the cache (never the cwd: it may have been deleted under us)
    probe_at = next((p for p in (cache, *cache.parents) if p.exists()), None)
    try:
        free: int | None = shutil.disk_usage(probe_at).free if probe_at is not None else None
    except OSError:
        free = None
    vm = psutil.virtual_memory()
    libc, libc_ver = _platform.libc_ver()
    return PlatformInfo(
        os=ctx.os_name,
        os_release=_platform.release(),
        cpu_arch=_platform.machine(),
        python_version=_platform.python_version(),
        python_implementation=_platform.python_implementation(),
        python_executable=ctx.python,
        wheel_tag=str(next(iter(tags.sys_tags()))),
        glibc=libc_ver if libc == "glibc" else None,
        cores=psutil.cpu_count(logical=True) or 1,
        ram_total_bytes=int(vm.total),
        ram_available_bytes=int(vm.available),
        disk_path=str(cache),
        disk_free_bytes=free,
    )
