"""Cache keys: the ``sha256:`` of everything that changes a built binary.

Two builds share a key exactly when they were made from the same source bytes, for the same compute
capabilities and flags, against the same torch (version, CUDA, C++11 ABI), for the same interpreter and
platform (Python tag, platform tag, glibc), with the same toolchain. Anything left out of
:class:`CacheKeyInputs` could let the cache hand a binary to a machine it was not built for, so when in
doubt a field belongs here.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packaging.utils import canonicalize_name

from attnforge._compat import StrEnum
from attnforge.types.binary import AbiKind
from attnforge.types.cc import ComputeCapability

#: Bump when the meaning of a field of :class:`CacheKeyInputs` changes; it is part of every key.
KEY_SCHEMA = 1

_KEY_RE = re.compile(r"sha256:([0-9a-f]{64})")
_HEX_RE = re.compile(r"[0-9a-f]{64}")


class ArtifactKind(StrEnum):
    """What file an entry holds."""

    WHEEL = "wheel"  # a Python wheel, installable with pip
    STATIC_LIB = "static-lib"  # a static library linked by another build (candle's libflashattention.a)


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheKeyInputs:
    """Everything that changes the bytes of a built artifact.

    Attributes:
        name: distribution or library name; normalised with PEP 503 rules (``flash_attn`` -> ``flash-attn``).
        version: the version built (``2.8.3.post2``).
        kind: wheel or static library.
        source_sha256: hex sha256 of the source archive or tree that was built (for a prebuilt wheel taken as
            is, the wheel's own sha256).
        archs: target compute capabilities, e.g. ``((8, 0), (9, 0))``; kept sorted and unique.
        flags: build flags and environment that change the output (``FLASH_ATTENTION_DISABLE_DROPOUT=TRUE``);
            kept sorted and unique.
        torch_version: ``torch.__version__`` the extension was built against (``2.11.0+cu130``), None if none.
        cuda_version: torch's CUDA (``13.0``), None for a CPU build.
        cxx11_abi: ``torch.compiled_with_cxx11_abi()``, None when torch is not involved.
        python_tag: interpreter tag (``cp311``).
        platform_tag: wheel platform tag (``linux_x86_64``, ``win_amd64``).
        glibc: glibc version of the build machine (``2.36``), None off glibc.
        toolchain: tool name -> version (``{"nvcc": "13.0", "gcc": "12.2.0"}``).
        abi: how the binary is bound to torch (:class:`~attnforge.types.binary.AbiKind`). For ``torch-stable``,
            ``torch_version`` is the minimum torch (``2.9``) and ``cxx11_abi`` is None, so one key serves every
            torch from that minimum up. Left out of the canonical JSON when it is ``torch`` (every key made before
            it existed is per-torch, and keeps its value).
    """

    name: str
    version: str
    kind: ArtifactKind = ArtifactKind.WHEEL
    source_sha256: str
    archs: tuple[ComputeCapability, ...] = ()
    flags: tuple[str, ...] = ()
    torch_version: str | None = None
    cuda_version: str | None = None
    cxx11_abi: bool | None = None
    python_tag: str
    platform_tag: str
    glibc: str | None = None
    toolchain: tuple[tuple[str, str], ...] = ()
    abi: AbiKind = AbiKind.TORCH

    def __post_init__(self) -> None:
        if not _HEX_RE.fullmatch(self.source_sha256):
            raise ValueError(f"source_sha256 must be 64 lowercase hex digits, got {self.source_sha256!r}")
        object.__setattr__(self, "name", canonicalize_name(self.name))
        object.__setattr__(self, "archs", tuple(sorted(set(self.archs))))
        object.__setattr__(self, "flags", tuple(sorted(set(self.flags))))
        object.__setattr__(self, "toolchain", tuple(sorted(dict(self.toolchain).items())))

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values; the canonical form of the key."""
        extra = {} if self.abi is AbiKind.TORCH else {"abi": self.abi.value}
        return {
            **extra,
            "key_schema": KEY_SCHEMA,
            "name": self.name,
            "version": self.version,
            "kind": self.kind.value,
            "source_sha256": self.source_sha256,
            "archs": [f"{major}.{minor}" for major, minor in self.archs],
            "flags": list(self.flags),
            "torch_version": self.torch_version,
            "cuda_version": self.cuda_version,
            "cxx11_abi": self.cxx11_abi,
            "python_tag": self.python_tag,
            "platform_tag": self.platform_tag,
            "glibc": self.glibc,
            "toolchain": dict(self.toolchain),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CacheKeyInputs:
        """Rebuild from :meth:`to_json`.

        Raises:
            ValueError: a field is missing, unknown or malformed, or the key schema is not this one.
        """
        fields = dict(data)
        schema = fields.pop("key_schema", None)
        if schema != KEY_SCHEMA:
            raise ValueError(f"key_schema {schema!r} is not {KEY_SCHEMA}")
        try:
            archs = tuple(_parse_arch(a) for a in fields.pop("archs", []))
            toolchain = tuple((str(k), str(v)) for k, v in dict(fields.pop("toolchain", {})).items())
            kind = ArtifactKind(fields.pop("kind", "wheel"))
            abi = AbiKind(fields.pop("abi", AbiKind.TORCH.value))
            flags = tuple(str(f) for f in fields.pop("flags", ()))
            return cls(**fields, kind=kind, archs=archs, flags=flags, toolchain=toolchain, abi=abi)
        except TypeError as exc:
            raise ValueError(f"bad cache key inputs: {exc}") from None

    def canonical_json(self) -> str:
        """Sorted keys, no whitespace, ASCII only: the exact text that is hashed."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _parse_arch(text: object) -> ComputeCapability:
    if not isinstance(text, str) or not re.fullmatch(r"\d+\.\d+", text):
        raise ValueError(f"bad arch {text!r} (expected e.g. '9.0')")
    major, _, minor = text.partition(".")
    return ComputeCapability(int(major), int(minor))


@dataclass(frozen=True, slots=True)
class CacheKey:
    """A content address: ``sha256:<64 hex>`` of :meth:`CacheKeyInputs.canonical_json`.

    ``str(key)`` and :meth:`parse` round-trip. ``digest`` alone names the entry's directory.
    """

    digest: str

    def __post_init__(self) -> None:
        if not _HEX_RE.fullmatch(self.digest):
            raise ValueError(f"a cache key digest is 64 lowercase hex digits, got {self.digest!r}")

    @classmethod
    def of(cls, inputs: CacheKeyInputs) -> CacheKey:
        """The key of these inputs."""
        return cls(hashlib.sha256(inputs.canonical_json().encode("ascii")).hexdigest())

    @classmethod
    def parse(cls, text: str) -> CacheKey:
        """``"sha256:ab12..."`` -> key.

        Raises:
            ValueError: not ``sha256:`` followed by 64 lowercase hex digits.
        """
        match = _KEY_RE.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"not a cache key: {text!r} (expected 'sha256:' and 64 hex digits)")
        return cls(match.group(1))

    @property
    def short(self) -> str:
        """The first 12 hex digits, for tables."""
        return self.digest[:12]

    def __str__(self) -> str:
        return f"sha256:{self.digest}"
