"""MSVC knowledge beyond the host-compiler window (``catalog/data/msvc.toml``): the STL's own CUDA floor,
the conformance flags nvcc needs on Windows, and Visual Studio release names.

The ``_MSC_VER`` window each nvcc accepts is toolchain data (``toolchain.toml`` ``[[host_compilers]]``);
this file only adds what sits on top of it. Nothing is read at import time: call :func:`load_msvc`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnforge.catalog._check import Collector, Sourced, load_file
from attnforge.types.versions import MajorMinor


@dataclass(frozen=True, slots=True, kw_only=True)
class StlFloor(Sourced):
    """From ``_MSC_VER`` ``msc_min`` on, MSVC's STL refuses nvcc older than ``cuda_min`` with ``error``."""

    msc_min: int
    cuda_min: MajorMinor
    error: str
    override: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConformanceFlag(Sourced):
    """One nvcc argument that makes cl accept torch/CUDA headers, with the versions it applies to."""

    flag: str
    why: str
    cuda_min: MajorMinor | None
    torch_min: MajorMinor | None

    def applies(self, *, cuda: MajorMinor | None, torch: MajorMinor | None) -> bool:
        """Whether the flag is needed for this nvcc and torch (an unknown version counts as new enough)."""
        if self.cuda_min is not None and cuda is not None and cuda < self.cuda_min:
            return False
        return not (self.torch_min is not None and torch is not None and torch < self.torch_min)


@dataclass(frozen=True, slots=True, kw_only=True)
class VsRelease(Sourced):
    msc_min: int
    msc_max: int
    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildRoot(Sourced):
    """Where a Windows build runs: ``<home>\\b\\<key8>`` up to ``max_chars``, else ``<drive>:\\<short_dir>\\<key8>``."""

    short_dir: str
    max_chars: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MsvcCatalog:
    """Everything in ``msvc.toml``."""

    stl_floors: tuple[StlFloor, ...]
    conformance: tuple[ConformanceFlag, ...]
    releases: tuple[VsRelease, ...]
    build_root: BuildRoot

    def release_name(self, msc_ver: int) -> str | None:
        """``1944`` -> ``"VS 2022 17.11-17.14"``; None for a ``_MSC_VER`` no row covers."""
        return next((r.name for r in self.releases if r.msc_min <= msc_ver <= r.msc_max), None)

    def stl_floor(self, msc_ver: int) -> StlFloor | None:
        """The strictest STL floor in force for this ``_MSC_VER`` (None before any)."""
        floors = [f for f in self.stl_floors if msc_ver >= f.msc_min]
        return max(floors, key=lambda f: f.cuda_min, default=None)

    def flags_for(self, *, cuda: MajorMinor | None, torch: MajorMinor | None) -> tuple[ConformanceFlag, ...]:
        return tuple(f for f in self.conformance if f.applies(cuda=cuda, torch=torch))


def load_msvc(path: Path | None = None) -> MsvcCatalog:
    """Load and validate ``msvc.toml``.

    Args:
        path: a data file to read instead of the packaged one.

    Raises:
        CatalogError: the file is missing, not TOML, or has bad fields (each named by its dotted path).
    """
    return load_file("msvc.toml", _parse, path=path,
                     top_keys={"stl_floors", "conformance", "releases", "build_root"})


def _parse(doc: Mapping[str, Any], errors: Collector) -> MsvcCatalog:
    return MsvcCatalog(
        stl_floors=tuple(_stl_floors(doc, errors)),
        conformance=tuple(_conformance(doc, errors)),
        releases=tuple(_releases(doc, errors)),
        build_root=_build_root(doc, errors),
    )


def _build_root(doc: Mapping[str, Any], errors: Collector) -> BuildRoot:
    with errors.table(doc, "build_root", "") as row:
        errors.unknown_keys(row, {"short_dir", "max_chars", "sources"}, "build_root")
        short_dir = errors.get(row, "short_dir", "build_root", str)
        if "short_dir" in row and not re.fullmatch(r"[A-Za-z0-9_]{1,8}", short_dir):
            errors.add("build_root.short_dir", f"expected a short plain directory name, got {short_dir!r}")
        max_chars = errors.get(row, "max_chars", "build_root", int)
        if "max_chars" in row and not 10 <= max_chars <= 200:
            errors.add("build_root.max_chars", f"expected 10..200, got {max_chars}")
        return BuildRoot(short_dir=short_dir, max_chars=max_chars,
                         sources=errors.sources(row, "build_root"))


def _msc(errors: Collector, row: Mapping[str, Any], key: str, path: str) -> int:
    value = errors.get(row, key, path, int)
    if key in row and not 1900 <= value < 2100:
        errors.add(f"{path}.{key}", f"{value} is not an _MSC_VER (19xx)")
    return value


def _optional_mm(errors: Collector, row: Mapping[str, Any], key: str, path: str) -> MajorMinor | None:
    text = errors.get(row, key, path, str)
    if not text:
        return None
    return errors.major_minor(row, key, path)


def _stl_floors(doc: Mapping[str, Any], errors: Collector) -> list[StlFloor]:
    out = []
    for path, row in errors.array_rows(doc, "stl_floors", {"msc_min", "cuda_min", "error", "override", "sources"}):
        out.append(StlFloor(
            msc_min=_msc(errors, row, "msc_min", path),
            cuda_min=errors.major_minor(row, "cuda_min", path),
            error=errors.get(row, "error", path, str),
            override=errors.get(row, "override", path, str),
            sources=errors.sources(row, path),
        ))
    return out


def _conformance(doc: Mapping[str, Any], errors: Collector) -> list[ConformanceFlag]:
    out = []
    for path, row in errors.array_rows(doc, "conformance", {"flag", "why", "cuda_min", "torch_min", "sources"}):
        flag = errors.get(row, "flag", path, str)
        if not flag.startswith("-") or any(c.isspace() for c in flag):
            errors.add(f"{path}.flag", f"expected one nvcc argument starting with '-', got {flag!r}")
        out.append(ConformanceFlag(
            flag=flag,
            why=errors.get(row, "why", path, str),
            cuda_min=_optional_mm(errors, row, "cuda_min", path),
            torch_min=_optional_mm(errors, row, "torch_min", path),
            sources=errors.sources(row, path),
        ))
    return out


def _releases(doc: Mapping[str, Any], errors: Collector) -> list[VsRelease]:
    out = []
    for path, row in errors.array_rows(doc, "releases", {"msc_min", "msc_max", "name", "sources"}):
        lo, hi = _msc(errors, row, "msc_min", path), _msc(errors, row, "msc_max", path)
        if lo > hi:
            errors.add(f"{path}.msc_max", f"{hi} is below msc_min {lo}")
        out.append(VsRelease(msc_min=lo, msc_max=hi, name=errors.get(row, "name", path, str),
                             sources=errors.sources(row, path)))
    return out
