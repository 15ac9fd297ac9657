"""What a built binary needs of the machine that loads it: the one value cache keys, wheel labels, the resolver's
fit check and the fleet's wheel keys read.

A torch extension is bound to torch in one of a few ways (its :class:`AbiKind`), and each says which torch serves
it:

- ``torch``: compiled against ``torch/extension.h``; its ``c10``/``at`` C++ symbols tie it to one torch minor
  and one C++11 ABI (``torch.compiled_with_cxx11_abi()``).
- ``torch-stable``: the libtorch stable ABI (``torch/csrc/stable/``; C shims ``aoti_torch_*`` and
  ``torch_call_dispatcher``, no C++ symbol of torch): any torch at or above its minimum (``TORCH_TARGET_VERSION``,
  e.g. ``0x0209000000000000`` = 2.9). Source: torch's ``torch/csrc/stable/version.h``, and FlashAttention-3's
  hopper/setup.py (https://github.com/Dao-AILab/flash-attention/blob/main/hopper/setup.py, "Targets minimum
  runtime version torch 2.9.0").
- ``tvm-ffi``: Apache TVM FFI modules (CuTe DSL ahead-of-time kernels): no torch symbol at all.
- ``pure``: no native code.

With ``py_limited_api`` the Python side is ``abi3`` too (wheel tag ``cp310-abi3``: any CPython >= 3.10), which
the wheel's own tags already say and ``packaging.tags`` accepts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from attnforge._compat import StrEnum
from attnforge.types.cc import ComputeCapability
from attnforge.types.versions import MajorMinor


class AbiKind(StrEnum):
    """How a binary is bound to torch (see the module docstring)."""

    TORCH = "torch"
    TORCH_STABLE = "torch-stable"
    TVM_FFI = "tvm-ffi"
    PURE = "pure"


_TARGET_RE = re.compile(r"TORCH_TARGET_VERSION=(0x[0-9a-fA-F]{1,16})")


def target_version(text: str) -> MajorMinor | None:
    """The torch ``(major, minor)`` a ``-DTORCH_TARGET_VERSION=0x0209000000000000`` in ``text`` (a build's flags or
    log) targets: major in the top byte, minor in the next (torch's ``torch/csrc/stable/version.h``); the last one
    wins, None when there is none."""
    found = _TARGET_RE.findall(text)
    if not found:
        return None
    value = int(found[-1], 16)
    return (value >> 56 & 0xFF, value >> 48 & 0xFF)


@dataclass(frozen=True, slots=True, kw_only=True)
class BinaryTarget:
    """What a built binary needs of a machine.

    Attributes:
        abi: how it is bound to torch.
        torch: ``torch``: the torch version it was built against (``2.11.0+cu130``); ``torch-stable``: the minimum
            torch as ``MAJOR.MINOR`` (``2.9``); None otherwise (or without torch).
        cxx11_abi: ``torch`` only: the C++11 ABI it was built with; None for every other kind.
        cuda: the CUDA ``MAJOR.MINOR`` it was built with (torch's: ``13.0``), None for a CPU build.
        archs: the compute capabilities it holds code for.
        python_tag / platform_tag: its wheel's tags (``cp310``, ``cp310-abi3`` compresses to python ``cp310``).
    """

    abi: AbiKind
    torch: str | None = None
    cxx11_abi: bool | None = None
    cuda: str | None = None
    archs: tuple[ComputeCapability, ...] = ()
    python_tag: str = ""
    platform_tag: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "archs", tuple(sorted(set(self.archs))))
        if self.abi is not AbiKind.TORCH and self.cxx11_abi is not None:
            raise ValueError(f"a {self.abi} binary has no C++11 ABI of torch's")
        if self.abi is AbiKind.TORCH_STABLE and (self.torch is None or not re.fullmatch(r"\d+\.\d+", self.torch)):
            raise ValueError(f"a stable-ABI binary names its minimum torch as MAJOR.MINOR, got {self.torch!r}")

    def describe(self) -> str:
        """``torch 2.11.0+cu130 cxx11abi=true`` / ``torch >= 2.9 (stable ABI)`` / ``tvm-ffi`` / ``pure Python``."""
        if self.abi is AbiKind.TORCH_STABLE:
            return f"torch >= {self.torch} (stable ABI)"
        if self.abi is AbiKind.TORCH:
            abi = "" if self.cxx11_abi is None else f" cxx11abi={str(self.cxx11_abi).lower()}"
            return f"torch {self.torch}{abi}"
        return "pure Python" if self.abi is AbiKind.PURE else str(self.abi)


__all__ = ["AbiKind", "BinaryTarget", "target_version"]
