"""What each attention backend is: package and import names, native modules, supported hardware and inputs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from attnforge.catalog._check import Collector, Sourced
from attnforge.types.cc import ComputeCapability, format_cc, parse_cc

_NO_CC = ComputeCapability(0, 0)
FAMILIES = ("sdpa", "flex", "flash-attn", "sageattention", "xformers")
DTYPES = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn")
_FIELDS = {
    "display_name", "family", "distributions", "version_spec", "import_name", "native_modules", "min_cc",
    "max_cc", "dtypes", "max_head_dim", "quantized", "needs_build", "install", "priority", "sources",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Support:
    """What a kernel serves: the compute capabilities (an inclusive range), the dtypes and the largest head dim.

    The catalog's row states it (:attr:`Backend.support`); the runtime capabilities carry the same value, narrowed
    by what a slim build left out.
    """

    min_cc: ComputeCapability
    max_cc: ComputeCapability
    dtypes: tuple[str, ...]
    max_head_dim: int

    def supports_cc(self, cc: ComputeCapability) -> bool:
        return self.min_cc <= cc <= self.max_cc

    def cc_range_text(self) -> str:
        return f"{format_cc(self.min_cc)}-{format_cc(self.max_cc)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Backend(Sourced):
    """One attention backend as the catalog describes it (``catalog/data/backends.toml``); ``support`` holds its
    ``min_cc``, ``max_cc``, ``dtypes`` and ``max_head_dim``."""

    id: str
    display_name: str
    family: str
    distributions: tuple[str, ...]
    version_spec: SpecifierSet
    import_name: str
    native_modules: tuple[str, ...]
    support: Support
    quantized: bool
    needs_build: bool
    install: str
    priority: int

    @property
    def builtin(self) -> bool:
        """True for backends that ship inside torch (SDPA, FlexAttention)."""
        return not self.distributions


def parse_backends(doc: Mapping[str, Any], errors: Collector) -> dict[str, Backend]:
    """Read the ``[backends.*]`` tables, recording every bad field in ``errors``."""
    out: dict[str, Backend] = {}
    for bid, raw, path in errors.rows(doc, "backends", _FIELDS):
        family = errors.get(raw, "family", path, str)
        if family and family not in FAMILIES:
            errors.add(f"{path}.family", f"expected one of {FAMILIES}, got {family!r}")
        dtypes = errors.str_list(raw, "dtypes", path, allow_empty=False)
        for i, d in enumerate(dtypes):
            if d not in DTYPES:
                errors.add(f"{path}.dtypes[{i}]", f"unknown dtype {d!r}")
        spec_text = errors.get(raw, "version_spec", path, str, default="")
        spec = errors.parsed(spec_text, f"{path}.version_spec", _specifier, SpecifierSet())
        min_cc = errors.parsed(errors.get(raw, "min_cc", path, str), f"{path}.min_cc", parse_cc, _NO_CC)
        max_cc = errors.parsed(errors.get(raw, "max_cc", path, str), f"{path}.max_cc", parse_cc, _NO_CC)
        if min_cc > max_cc:
            errors.add(f"{path}.min_cc", f"{format_cc(min_cc)} is above max_cc {format_cc(max_cc)}")
        head = errors.get(raw, "max_head_dim", path, int)
        if head is not None and head <= 0:
            errors.add(f"{path}.max_head_dim", "must be positive")
        out[bid] = Backend(
            id=bid,
            display_name=errors.get(raw, "display_name", path, str),
            family=family,
            distributions=errors.str_list(raw, "distributions", path),
            version_spec=spec,
            import_name=errors.get(raw, "import_name", path, str),
            native_modules=errors.str_list(raw, "native_modules", path),
            support=Support(min_cc=min_cc, max_cc=max_cc, dtypes=dtypes, max_head_dim=head),
            quantized=errors.get(raw, "quantized", path, bool),
            needs_build=errors.get(raw, "needs_build", path, bool),
            install=errors.get(raw, "install", path, str),
            priority=errors.get(raw, "priority", path, int),
            sources=errors.sources(raw, path),
        )
    return out


def _specifier(text: str) -> SpecifierSet:
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise ValueError(f"not a PEP 440 version specifier: {text!r}") from None
