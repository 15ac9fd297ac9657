"""CUDA toolchain knowledge (``catalog/data/toolchain.toml``): GPUs, nvcc targets, drivers, host compilers.

The predicates here answer the questions the resolver asks (can this nvcc emit ``sm_120``? does an ``sm_90a``
cubin run on a ``(9, 0)`` GPU? which gcc does nvcc 12.4 accept?) from the data file, not from if/elif chains.
Sources: docs/research/toolchain-facts.md §1-§5 (each row of the data file names its own).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from attnforge._compat import StrEnum
from attnforge.catalog._check import Collector, Sourced
from attnforge.catalog.torch import TorchRelease, TorchStack, cu_tag, parse_torch_releases, parse_torch_stack
from attnforge.types.cc import ComputeCapability, format_cc, parse_cc
from attnforge.types.versions import MajorMinor, format_major_minor, parse_major_minor


class TargetKind(StrEnum):
    """What an nvcc target produces, and so which GPUs can run it (toolchain-facts.md §1.1)."""

    SASS = "sass"  # sm_90: a cubin for one compute capability
    ARCH_SPECIFIC = "arch_specific"  # sm_90a: a cubin that runs on exactly that compute capability
    FAMILY = "family"  # sm_100f: a cubin for a family (10.0 and 10.3)
    PTX = "ptx"  # compute_90: PTX, JIT-compiled by the driver for any newer GPU


class RunsOn(StrEnum):
    SAME_MAJOR_MINOR_AT_LEAST = "same-major-minor-at-least"
    AT_LEAST = "at-least"
    EXACT = "exact"


_TARGET_RE = re.compile(r"^(sm|compute)_(\d{1,2})(\d)([af]?)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """One nvcc code target, e.g. ``sm_90a`` (cubin for exactly 9.0) or ``compute_120`` (PTX)."""

    cc: ComputeCapability
    kind: TargetKind

    @classmethod
    def parse(cls, text: str) -> Target:
        """``"sm_90"``, ``"sm_90a"``, ``"sm_100f"``, ``"compute_120"``; a bare ``"9.0"`` means ``sm_90``.

        Raises:
            ValueError: not an nvcc target.
        """
        t = text.strip().lower()
        m = _TARGET_RE.match(t)
        if m is None:
            if re.match(r"^\d+\.\d+$", t):
                return cls(cc=parse_cc(t), kind=TargetKind.SASS)
            raise ValueError(f"not an nvcc target: {text!r} (expected e.g. sm_90, sm_90a, compute_120)")
        prefix, major, minor, suffix = m.groups()
        cc = ComputeCapability(int(major), int(minor))
        if prefix == "compute":
            if suffix:
                raise ValueError(f"attnforge only models plain PTX targets, got {text!r}")
            return cls(cc=cc, kind=TargetKind.PTX)
        kind = {"": TargetKind.SASS, "a": TargetKind.ARCH_SPECIFIC, "f": TargetKind.FAMILY}[suffix]
        return cls(cc=cc, kind=kind)

    def __str__(self) -> str:
        digits = f"{self.cc[0]}{self.cc[1]}"
        if self.kind is TargetKind.PTX:
            return f"compute_{digits}"
        suffix = {TargetKind.SASS: "", TargetKind.ARCH_SPECIFIC: "a", TargetKind.FAMILY: "f"}[self.kind]
        return f"sm_{digits}{suffix}"

    @property
    def sass_name(self) -> str:
        """The ``sm_*`` name nvcc support is recorded under (PTX ``compute_120`` needs what ``sm_120`` needs).
        """
        return str(Target(cc=self.cc, kind=TargetKind.SASS)) if self.kind is TargetKind.PTX else str(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuModel(Sourced):
    cc: ComputeCapability
    arch: str
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetSupport(Sourced):
    """The CUDA releases whose nvcc can emit a target: ``first_cuda`` through
    ``last_cuda`` (None: still supported).
    """

    name: str
    first_cuda: MajorMinor
    last_cuda: MajorMinor | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DriverFloor(Sourced):
    cuda: MajorMinor
    linux_min: str
    windows_min: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class HostCompilerRange(Sourced):
    """What ``include/crt/host_config.h`` of CUDA ``cuda_min``..``cuda_max`` accepts.

    Attributes:
        gcc_min / gcc_max: accepted GCC majors (inclusive).
        clang_max: highest accepted clang major.
        msc_min / msc_end: accepted ``_MSC_VER`` window ``[msc_min, msc_end)``.
    """

    cuda_min: MajorMinor
    cuda_max: MajorMinor
    gcc_min: int
    gcc_max: int
    clang_max: int
    msc_min: int
    msc_end: int

    def covers(self, cuda: MajorMinor) -> bool:
        return self.cuda_min <= cuda <= self.cuda_max

    def cuda_text(self) -> str:
        lo, hi = format_major_minor(self.cuda_min), format_major_minor(self.cuda_max)
        return lo if lo == hi else f"{lo}-{hi}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Toolchain:
    """The toolchain tables and the predicates the resolver uses."""

    gpus: tuple[GpuModel, ...]
    targets: Mapping[str, TargetSupport]
    compat: Mapping[TargetKind, RunsOn]
    drivers: tuple[DriverFloor, ...]
    driver_families: Mapping[int, str]
    host_compilers: tuple[HostCompilerRange, ...]
    torch_releases: tuple[TorchRelease, ...]
    torch_stack: TorchStack
    extension_major_must_match: bool

    def cc_for_gpu_name(self, name: str) -> ComputeCapability | None:
        """The compute capability of a GPU by marketing name (longest matching catalog name wins)."""
        lowered = name.lower()
        best: tuple[int, ComputeCapability] | None = None
        for gpu in self.gpus:
            for n in gpu.names:
                if re.search(rf"(?<![a-z0-9]){re.escape(n.lower())}(?![a-z0-9])", lowered) and (
                    best is None or len(n) > best[0]
                ):
                    best = (len(n), gpu.cc)
        return None if best is None else best[1]

    def target_support(self, target: Target) -> TargetSupport | None:
        return self.targets.get(target.sass_name)

    def nvcc_can_emit(self, cuda: MajorMinor, target: Target) -> str | None:
        """None when nvcc of CUDA ``cuda`` can emit ``target``, else the reason it cannot."""
        support = self.target_support(target)
        if support is None:
            return f"{target} is not a target attnforge knows any nvcc for"
        if cuda < support.first_cuda:
            return f"{target} needs nvcc >= {format_major_minor(support.first_cuda)}"
        if support.last_cuda is not None and cuda > support.last_cuda:
            return f"{target} was dropped after CUDA {format_major_minor(support.last_cuda)}"
        return None

    def runs_on(self, target: Target, cc: ComputeCapability) -> bool:
        """Whether code for ``target`` runs on a GPU of compute capability ``cc``
        (toolchain-facts.md §1.1)."""
        rule = self.compat[target.kind]
        if rule is RunsOn.EXACT:
            return cc == target.cc
        if rule is RunsOn.AT_LEAST:
            return cc >= target.cc
        return cc[0] == target.cc[0] and cc[1] >= target.cc[1]

    def host_range(self, cuda: MajorMinor) -> HostCompilerRange | None:
        return next((r for r in self.host_compilers if r.covers(cuda)), None)

    def torch_release(self, version: MajorMinor) -> TorchRelease | None:
        return next((t for t in self.torch_releases if t.version == version), None)

    def default_torch_cuda(self) -> MajorMinor:
        """The CUDA of ``pip install torch`` for the newest torch release the catalog knows: the variant to
        suggest when nothing on the machine says otherwise."""
        newest = max(self.torch_releases, key=lambda t: t.version)
        return newest.pypi_default or max(newest.cuda)

    def torch_index_url(self, cuda: MajorMinor | None) -> str:
        """The PyTorch wheel index of one CUDA variant (``.../whl/cu130``); ``.../whl/cpu`` for None."""
        return f"{self.torch_stack.index_url}/{cu_tag(cuda) if cuda else 'cpu'}"

    def driver_floor(self, cuda: MajorMinor) -> DriverFloor | None:
        return next((d for d in self.drivers if d.cuda == cuda), None)


_SECTIONS = {
    "schema_version",
    "gpus",
    "targets",
    "compat",
    "drivers",
    "driver_families",
    "host_compilers",
    "torch",
    "torch_stack",
    "rules",
}


def parse_toolchain(doc: Mapping[str, Any], errors: Collector) -> Toolchain:
    """Read ``toolchain.toml``, recording every bad field in ``errors`` under its dotted path."""
    errors.unknown_keys(doc, _SECTIONS, "")
    return Toolchain(
        gpus=tuple(_gpus(doc, errors)),
        targets=_targets(doc, errors),
        compat=_compat(doc, errors),
        drivers=tuple(_drivers(doc, errors)),
        driver_families=_families(doc, errors),
        host_compilers=tuple(_host_compilers(doc, errors)),
        torch_releases=tuple(parse_torch_releases(doc, errors)),
        torch_stack=parse_torch_stack(doc, errors),
        extension_major_must_match=_rules(doc, errors),
    )


def _mm(errors: Collector, row: Mapping[str, Any], key: str, path: str) -> MajorMinor:
    return errors.major_minor(row, key, path)



def _gpus(doc: Mapping[str, Any], errors: Collector) -> list[GpuModel]:
    out = []
    for path, row in errors.array_rows(doc, "gpus", {"cc", "arch", "names", "sources"}):
        out.append(
            GpuModel(
                cc=errors.parsed(errors.get(row, "cc", path, str), f"{path}.cc", parse_cc, ComputeCapability(0, 0)),
                arch=errors.get(row, "arch", path, str),
                names=errors.str_list(row, "names", path, allow_empty=False),
                sources=errors.sources(row, path),
            )
        )
    return out


def _targets(doc: Mapping[str, Any], errors: Collector) -> dict[str, TargetSupport]:
    out: dict[str, TargetSupport] = {}
    for path, row in errors.array_rows(doc, "targets", {"names", "first_cuda", "last_cuda", "sources"}):
        first = _mm(errors, row, "first_cuda", path)
        last = _mm(errors, row, "last_cuda", path) if "last_cuda" in row else None
        if last is not None and last < first:
            errors.add(f"{path}.last_cuda", "is before first_cuda")
        sources = errors.sources(row, path)
        for i, name in enumerate(errors.str_list(row, "names", path, allow_empty=False)):
            try:
                target = Target.parse(name)
            except ValueError as exc:
                errors.add(f"{path}.names[{i}]", str(exc))
                continue
            if target.kind is TargetKind.PTX or str(target) != name:
                errors.add(f"{path}.names[{i}]", f"write the canonical sm_ name, got {name!r}")
            elif name in out:
                errors.add(f"{path}.names[{i}]", f"{name} is listed twice")
            out[name] = TargetSupport(name=name, first_cuda=first, last_cuda=last, sources=sources)
    return out


def _compat(doc: Mapping[str, Any], errors: Collector) -> dict[TargetKind, RunsOn]:
    out: dict[TargetKind, RunsOn] = {}
    with errors.table(doc, "compat", "") as table:
        errors.unknown_keys(table, {k.value for k in TargetKind}, "compat")
        for kind in TargetKind:
            path = f"compat.{kind.value}"
            with errors.table(table, kind.value, "compat") as row:
                if not row:
                    continue
                errors.unknown_keys(row, {"runs_on", "sources"}, path)
                errors.sources(row, path)
                rule = errors.get(row, "runs_on", path, str)
                try:
                    out[kind] = RunsOn(rule)
                except ValueError:
                    errors.add(
                        f"{path}.runs_on", f"expected one of {[r.value for r in RunsOn]}, got {rule!r}"
                    )
    return out


def _drivers(doc: Mapping[str, Any], errors: Collector) -> list[DriverFloor]:
    out = []
    for path, row in errors.array_rows(doc, "drivers", {"cuda", "linux_min", "windows_min", "sources"}):
        out.append(
            DriverFloor(
                cuda=_mm(errors, row, "cuda", path),
                linux_min=_driver_version(errors, row, "linux_min", path),
                windows_min=_driver_version(errors, row, "windows_min", path)
                if "windows_min" in row
                else None,
                sources=errors.sources(row, path),
            )
        )
    return out


def _driver_version(errors: Collector, row: Mapping[str, Any], key: str, path: str) -> str:
    text = errors.get(row, key, path, str)
    if text and not re.match(r"^\d+(\.\d+)*$", text):
        errors.add(f"{path}.{key}", f"not a driver version: {text!r}")
    return text


def _families(doc: Mapping[str, Any], errors: Collector) -> dict[int, str]:
    out = {}
    for path, row in errors.array_rows(doc, "driver_families", {"cuda_major", "min_driver", "sources"}):
        errors.sources(row, path)
        out[errors.get(row, "cuda_major", path, int)] = _driver_version(errors, row, "min_driver", path)
    return out


def _host_compilers(doc: Mapping[str, Any], errors: Collector) -> list[HostCompilerRange]:
    out = []
    fields = {"cuda_min", "cuda_max", "gcc_min", "gcc_max", "clang_max", "msc_min", "msc_end", "sources"}
    for path, row in errors.array_rows(doc, "host_compilers", fields):
        r = HostCompilerRange(
            cuda_min=_mm(errors, row, "cuda_min", path),
            cuda_max=_mm(errors, row, "cuda_max", path),
            gcc_min=errors.get(row, "gcc_min", path, int),
            gcc_max=errors.get(row, "gcc_max", path, int),
            clang_max=errors.get(row, "clang_max", path, int),
            msc_min=errors.get(row, "msc_min", path, int),
            msc_end=errors.get(row, "msc_end", path, int),
            sources=errors.sources(row, path),
        )
        if r.cuda_max < r.cuda_min:
            errors.add(f"{path}.cuda_max", "is below cuda_min")
        if r.gcc_max < r.gcc_min:
            errors.add(f"{path}.gcc_max", "is below gcc_min")
        if r.msc_end <= r.msc_min:
            errors.add(f"{path}.msc_end", "must be above msc_min")
        out.append(r)
    return out


def _rules(doc: Mapping[str, Any], errors: Collector) -> bool:
    with errors.table(doc, "rules", "") as rules, errors.table(rules, "extension_cuda", "rules") as row:
        if not row:
            return True
        path = "rules.extension_cuda"
        errors.unknown_keys(row, {"major_must_match", "minor_mismatch_warns", "sources"}, path)
        errors.sources(row, path)
        errors.get(row, "minor_mismatch_warns", path, bool)
        return errors.get(row, "major_must_match", path, bool)


__all__ = [
    "GpuModel",
    "HostCompilerRange",
    "MajorMinor",
    "Target",
    "TargetKind",
    "Toolchain",
    "TorchRelease",
    "format_cc",
    "format_major_minor",
    "parse_major_minor",
    "parse_toolchain",
]
