"""Which ABI a built wheel really uses, read from the binary and the build's flags, never from the project's name.

The undefined dynamic symbols of its native modules (read with pyelftools) say how it is bound to torch:
``_ZN3c10``/``_ZN2at``/``_ZN5torch`` (mangled C++ of ``c10::``, ``at::``, ``torch::``) tie it to one torch minor and
C++11 ABI; the libtorch stable ABI's C shims (``aoti_torch_*``, ``torch_call_dispatcher``) without any of those
make it a stable-ABI binary, whose minimum torch is the ``-DTORCH_TARGET_VERSION=0x...`` of its build (in the build
log's compile lines; FlashAttention-3's hopper/setup.py passes ``0x0209000000000000``), else the torch it was built
against; ``TVMFFI``/``tvm_ffi`` symbols and nothing of torch's make it a TVM FFI module. A wheel with no native
module is pure Python. See :mod:`attnforge.types.binary`.
"""

from __future__ import annotations

import dataclasses
import io
import zipfile
from collections.abc import Iterable
from pathlib import Path

from packaging.utils import parse_wheel_filename

from attnforge.probe.snapshot import SystemSnapshot
from attnforge.types.binary import AbiKind, BinaryTarget, target_version
from attnforge.types.cc import ComputeCapability
from attnforge.types.versions import format_major_minor, parse_major_minor

_CXX_TORCH = ("_ZN3c10", "_ZN2at", "_ZN5torch", "_ZNK3c10", "_ZNK2at", "_ZNK5torch")
_STABLE = ("aoti_torch_", "torch_call_dispatcher")
_TVM = ("TVMFFI", "tvm_ffi")
_NATIVE = (".so", ".pyd")


def wheel_tags(filename: str) -> tuple[str, str]:
    """``(python tag, platform tag)`` of a wheel file name; compressed tag sets are joined with ``.``."""
    _, _, _, tags = parse_wheel_filename(filename)
    interpreters = ".".join(sorted({t.interpreter for t in tags}))
    platforms = ".".join(sorted({t.platform for t in tags}))
    return interpreters, platforms


def abi_of_symbols(undefined: Iterable[str]) -> AbiKind:
    """The ABI the undefined symbols of a binary's native modules show (see the module docstring)."""
    names = tuple(undefined)
    if any(n.startswith(_CXX_TORCH) for n in names):
        return AbiKind.TORCH
    if any(n.startswith(_STABLE) for n in names):
        return AbiKind.TORCH_STABLE
    if any(n.startswith(_TVM) for n in names):
        return AbiKind.TVM_FFI
    return AbiKind.TORCH


def wheel_abi(wheel: Path) -> AbiKind:
    """The ABI of ``wheel``'s native modules: ``pure`` without any; a module that is not ELF (a Windows ``.pyd``)
    reads as per-torch (its imports are not read here), the safe answer."""
    symbols: list[str] = []
    native = False
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if not info.filename.endswith(_NATIVE) and ".so." not in info.filename:
                continue
            native = True
            data = zf.read(info)
            if data[:4] != b"\x7fELF":
                return AbiKind.TORCH
            symbols.extend(_undefined(data))
    return abi_of_symbols(symbols) if native else AbiKind.PURE


def _undefined(data: bytes) -> list[str]:
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    try:
        section = ELFFile(io.BytesIO(data)).get_section_by_name(".dynsym")
    except ELFError:
        return ["_ZN3c10"]  # unreadable: assume the strictest binding
    if not isinstance(section, SymbolTableSection):
        return []
    return [s.name for s in section.iter_symbols() if s.name and s["st_shndx"] == "SHN_UNDEF"]


def built_target(wheel: Path, *, snapshot: SystemSnapshot, archs: tuple[ComputeCapability, ...],
                 build_flags: str = "") -> BinaryTarget:
    """What the wheel a build produced on ``snapshot`` needs: its ABI from its binary, its minimum torch (stable
    ABI) from ``build_flags`` (the build log or its compile flags) else the building torch's major.minor.

    Raises:
        OSError / zipfile.BadZipFile: the wheel cannot be read.
    """
    python_tag, platform_tag = wheel_tags(wheel.name)
    torch = snapshot.torch
    abi = wheel_abi(wheel)
    base = BinaryTarget(abi=AbiKind.PURE, cuda=torch.cuda_version if torch is not None else None, archs=archs,
                        python_tag=python_tag, platform_tag=platform_tag)
    if torch is None:  # nothing of torch's to bind to here: its kind alone
        return dataclasses.replace(base, abi=AbiKind.TORCH if abi is AbiKind.TORCH_STABLE else abi)
    if abi in (AbiKind.PURE, AbiKind.TVM_FFI):
        return dataclasses.replace(base, abi=abi)
    if abi is AbiKind.TORCH_STABLE:
        minimum = target_version(build_flags)
        if minimum is None:
            minimum = parse_major_minor(torch.version)
        return dataclasses.replace(base, abi=abi, torch=format_major_minor(minimum))
    return dataclasses.replace(base, abi=AbiKind.TORCH, torch=torch.version, cxx11_abi=torch.cxx11_abi)
