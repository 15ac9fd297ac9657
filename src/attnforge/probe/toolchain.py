"""CUDA toolkits, host compilers, ninja and sccache."""

from __future__ import annotations

import os
import re
import sysconfig
from collections.abc import Mapping
from pathlib import Path

from attnforge._system.runner import which
from attnforge.probe import parsers
from attnforge.probe.context import ProbeContext
from attnforge.probe.snapshot import Compiler, CudaToolkit, Tool
from attnforge.types.versions import loose_version

_NVCC = {"windows": "nvcc.exe"}
_CUDA_PATH_V = re.compile(r"CUDA_PATH_V\d+_\d+")


def toolkit_candidates(ctx: ProbeContext) -> list[tuple[Path, str]]:
    """Toolkit roots to look at, each with how it was found, in the order torch's cpp_extension prefers.

    Source: torch/utils/cpp_extension.py ``_find_cuda_home`` (CUDA_HOME, CUDA_PATH, then nvcc on PATH, then
    /usr/local/cuda); docs/research/install-anchors.md §8.1.
    """
    out: list[tuple[Path, str]] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if ctx.environ.get(var):
            out.append((Path(ctx.environ[var]), var))
    nvcc = which("nvcc", ctx.environ)
    if nvcc is not None:
        out.append((nvcc.resolve().parent.parent, "PATH"))
    if ctx.os_name == "windows":
        out.extend(windows_toolkit_candidates(ctx.environ))
    else:
        for pattern in ("usr/local/cuda*", "opt/cuda*"):
            out.extend((p, "glob") for p in sorted(ctx.fs_root.glob(pattern)) if p.is_dir())
    return out


def windows_toolkit_candidates(environ: Mapping[str, str]) -> list[tuple[Path, str]]:
    """Toolkits a Windows machine has besides ``CUDA_PATH``: the installer's per-version ``CUDA_PATH_V12_8``
    variables, then every ``%ProgramFiles%\\NVIDIA GPU Computing Toolkit\\CUDA\\v*`` folder, newest first.

    The installer sets ``CUDA_PATH`` to whichever toolkit was installed last and one
    ``CUDA_PATH_V<major>_<minor>`` per toolkit; it never sets ``CUDA_HOME`` (toolchain-facts.md §4.4).
    Folders are ordered by version, not by name (torch's own glob takes the lexically first, which is why
    attnforge lists them all).
    """
    out: list[tuple[Path, str]] = []
    per_version = [(k, v) for k, v in environ.items() if _CUDA_PATH_V.fullmatch(k) and v]
    for key, value in sorted(per_version, key=lambda kv: loose_version(kv[0]), reverse=True):
        out.append((Path(value), key))
    pf = environ.get("ProgramFiles", r"C:\Program Files")
    base = Path(pf) / "NVIDIA GPU Computing Toolkit" / "CUDA"
    if base.is_dir():
        folders = [p for p in base.glob("v*") if p.is_dir()]
        out.extend((p, "glob") for p in sorted(folders, key=lambda p: loose_version(p.name), reverse=True))
    return out


def collect_toolkits(ctx: ProbeContext) -> tuple[list[CudaToolkit], list[str]]:
    seen: set[str] = set()
    toolkits: list[CudaToolkit] = []
    reasons: list[str] = []
    for root, via in toolkit_candidates(ctx):
        nvcc = root / "bin" / _NVCC.get(ctx.os_name, "nvcc")
        key = os.path.realpath(nvcc)
        if key in seen:
            continue
        seen.add(key)
        if not nvcc.exists():
            if via != "glob":
                reasons.append(f"{via}={root} has no bin/{nvcc.name}")
            continue
        res = ctx.runner.run((str(nvcc), "--version"), env=ctx.environ, timeout_s=ctx.timeout_s)
        parsed = parsers.nvcc_release(res.stdout) if res.ok else None
        if parsed is None:
            reasons.append(f"{nvcc}: `nvcc --version` gave no release line (exit {res.returncode})")
            continue
        toolkits.append(CudaToolkit(path=str(root), nvcc=str(nvcc), version=parsed[0], build=parsed[1],
                                    found_via=via, has_headers=(root / "include" / "cuda_runtime.h").exists()))
    if not toolkits and not reasons:
        reasons.append("no nvcc on PATH, in CUDA_HOME/CUDA_PATH or in the usual install locations")
    return toolkits, reasons


def collect_compilers(ctx: ProbeContext) -> list[Compiler]:
    found: list[Compiler] = []
    for kind in ("gcc", "g++", "clang"):
        exe = which(kind, ctx.environ)
        if exe is None:
            continue
        res = ctx.runner.run((str(exe), "--version"), env=ctx.environ, timeout_s=ctx.timeout_s)
        parsed = parsers.clang_version(res.stdout) if kind == "clang" else parsers.gnu_version(res.stdout)
        if res.ok and parsed:
            found.append(Compiler(kind=kind, path=str(exe), version=parsed[0], banner=parsed[1]))
    return found


def collect_tool(ctx: ProbeContext, name: str) -> Tool | None:
    exe = which(name, ctx.environ)
    if exe is None:
        return None
    res = ctx.runner.run((str(exe), "--version"), env=ctx.environ, timeout_s=ctx.timeout_s)
    version = parsers.first_version(res.output) if res.ok else None
    scripts = sysconfig.get_path("scripts")
    in_interp = Path(exe).parent.resolve() == Path(scripts).resolve() if scripts else None
    return Tool(name=name, path=str(exe), version=version, in_interpreter=in_interp)
