"""The torch stack as data (``toolchain.toml`` ``[[torch]]`` and ``[torch_stack]``): the CUDA variants of each
torch release, the PyTorch wheel index they live on, and the distributions attnforge never replaces.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from attnforge.catalog._check import Collector, Sourced
from attnforge.types.versions import MajorMinor, format_major_minor, parse_major_minor


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchRelease(Sourced):
    version: MajorMinor
    cuda: tuple[MajorMinor, ...]
    pypi_default: MajorMinor | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchStack(Sourced):
    """Where CUDA builds of torch come from, and the distributions an install must never replace.

    Attributes:
        index_url: the PyTorch wheel index root (``https://download.pytorch.org/whl``); a variant is a subdir.
        protected: canonical names of the torch stack (torch, its vision/audio siblings, its triton).
    """

    index_url: str
    protected: frozenset[str]


def cu_tag(version: MajorMinor) -> str:
    """``(12, 8)`` -> ``cu128`` (the PyTorch index name)."""
    return f"cu{version[0]}{version[1]}"


def parse_torch_releases(doc: Mapping[str, Any], errors: Collector) -> list[TorchRelease]:
    out = []
    for path, row in errors.array_rows(doc, "torch", {"version", "cuda", "pypi_default", "sources"}):
        cudas = tuple(
            errors.parsed(c, f"{path}.cuda[{i}]", parse_major_minor, (0, 0))
            for i, c in enumerate(errors.str_list(row, "cuda", path, allow_empty=False))
        )
        default = errors.major_minor(row, "pypi_default", path) if "pypi_default" in row else None
        if default is not None and default not in cudas:
            errors.add(
                f"{path}.pypi_default", f"{format_major_minor(default)} is not one of the cuda variants"
            )
        out.append(
            TorchRelease(
                version=errors.major_minor(row, "version", path),
                cuda=cudas,
                pypi_default=default,
                sources=errors.sources(row, path),
            )
        )
    return out


def parse_torch_stack(doc: Mapping[str, Any], errors: Collector) -> TorchStack:
    """Read ``[torch_stack]``, recording every bad field in ``errors``."""
    from packaging.utils import canonicalize_name

    with errors.table(doc, "torch_stack", "") as row:
        errors.unknown_keys(row, {"index_url", "protected", "sources"}, "torch_stack")
        url = errors.get(row, "index_url", "torch_stack", str)
        if "index_url" in row and not url.startswith("https://"):
            errors.add("torch_stack.index_url", f"expected an https:// URL, got {url!r}")
        protected = errors.str_list(row, "protected", "torch_stack", allow_empty=False)
        return TorchStack(index_url=url.rstrip("/"), protected=frozenset(canonicalize_name(n) for n in protected),
                          sources=errors.sources(row, "torch_stack"))
