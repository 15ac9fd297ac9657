"""Routing a torch-extension build through sccache, and counting its hits and misses.

How the routing works (``torch/utils/cpp_extension.py``): the ninja file's ``cxx`` comes from ``$CXX`` and its
``nvcc`` from ``$PYTORCH_NVCC``, each written as *one* shell word, so each must name a single executable; we
give them two tiny wrapper scripts that ``exec sccache <compiler> "$@"``. ``$CC`` is left alone on purpose:
cpp_extension passes it to nvcc as ``-ccbin``, which must be a plain host compiler. Recent torch also prepends
ccache/sccache itself when it finds one on PATH; ``TORCH_NO_COMPILER_WRAPPER=1`` turns that off so the
compiler is never wrapped twice.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from attnforge import _serde
from attnforge._system.runner import Runner


@dataclass(frozen=True, slots=True, kw_only=True)
class SccacheStats:
    """What sccache did during one build (the difference of ``--show-stats`` before and after).

    Attributes:
        compile_requests: compiler invocations sccache saw.
        hits: results served from the cache.
        misses: results compiled and stored.
    """

    compile_requests: int
    hits: int
    misses: int


def routing_env(*, sccache: Path, cxx: str, nvcc: str | None, wrapper_dir: Path) -> dict[str, str]:
    """Write the wrapper scripts and return the variables that route the build through them.

    Args:
        sccache: the sccache executable.
        cxx: the host C++ compiler the build would use (``$CXX`` or ``c++``).
        nvcc: the nvcc the build would use, None for a C++-only build.
        wrapper_dir: where to write ``af-cxx`` / ``af-nvcc`` (inside the build tree, so a resumed build sees
            the same paths and ninja does not rebuild for a changed command).
    """
    wrapper_dir.mkdir(parents=True, exist_ok=True)
    env = {"TORCH_NO_COMPILER_WRAPPER": "1", "CXX": str(_wrapper(wrapper_dir / "af-cxx", sccache, cxx))}
    if nvcc:
        env["PYTORCH_NVCC"] = str(_wrapper(wrapper_dir / "af-nvcc", sccache, nvcc))
    return env


def _wrapper(path: Path, sccache: Path, compiler: str) -> Path:
    text = f'#!/bin/sh\nexec {shlex.quote(str(sccache))} {compiler} "$@"\n'
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
        path.chmod(0o755)
    return path


def read_counts(runner: Runner, sccache: Path, env: Mapping[str, str]) -> SccacheStats | None:
    """The current counters of the sccache server (it starts one if none runs); None if sccache fails."""
    done = runner.run([str(sccache), "--show-stats", "--stats-format=json"], env=env, timeout_s=60)
    if not done.ok:
        return None
    return parse_stats(done.stdout)


def parse_stats(text: str) -> SccacheStats | None:
    """Parse ``sccache --show-stats --stats-format=json`` (sccache 0.7 and later); None if it does not fit."""
    try:
        stats = _serde.loads(text)["stats"]
        return SccacheStats(
            compile_requests=int(stats["compile_requests"]),
            hits=sum(int(v) for v in stats["cache_hits"]["counts"].values()),
            misses=sum(int(v) for v in stats["cache_misses"]["counts"].values()),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def difference(before: SccacheStats | None, after: SccacheStats | None) -> SccacheStats | None:
    """What happened between two readings; a server restart in between makes ``after`` the whole story."""
    if after is None:
        return None
    if before is None or after.compile_requests < before.compile_requests:
        return after
    return SccacheStats(compile_requests=after.compile_requests - before.compile_requests,
                        hits=after.hits - before.hits, misses=after.misses - before.misses)
