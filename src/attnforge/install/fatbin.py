"""Which GPU code a wheel really carries: the SASS and PTX inside the fatbins of its native modules.

A filename says what a wheel was *meant* to cover; the fatbin says what it holds. Each CUDA binary embeds one
or more fatbin containers (ELF section ``.nv_fatbin``, read with pyelftools; in a Windows ``.pyd`` the
containers are found by their magic). A container is a 16-byte header (magic ``0xBA55ED50``, version, header
size, payload size) followed by entries, each with its kind (1 PTX, 2 cubin/SASS), header size, payload size,
and at byte 28 the arch (``80`` = sm_80). The layout is the one CUDA's ``fatbinary_section.h`` declares and
``cuobjdump`` reads; ``cuobjdump --list-elf/--list-ptx`` is used instead when it is installed.

SASS is reported as plain ``sm_XY``: the container does not mark ``sm_90a``-style arch-specific code, so an
``sm_120a`` cubin reads as ``sm_120``.
"""

from __future__ import annotations

import io
import re
import shutil
import struct
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from attnforge._system.runner import SubprocessRunner
from attnforge.catalog.toolchain import Target, TargetKind
from attnforge.types.cc import ComputeCapability, format_cc

MAGIC = 0xBA55ED50
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_NATIVE = (".so", ".pyd", ".dll")
CUOBJDUMP = "/usr/local/cuda/bin/cuobjdump"


def fatbin_targets(blob: bytes) -> list[Target]:
    """Every SASS/PTX target in the fatbin containers found in ``blob`` (sorted, unique)."""
    found: set[Target] = set()
    start = blob.find(_MAGIC_BYTES)
    while start != -1:
        end = _read_container(blob, start, found)
        start = blob.find(_MAGIC_BYTES, max(end, start + 4))
    return sorted(found, key=lambda t: (t.cc, t.kind.value))


def _read_container(blob: bytes, at: int, found: set[Target]) -> int:
    if at + 16 > len(blob):
        return at + 4
    _, _, header_size, payload = struct.unpack_from("<IHHQ", blob, at)
    end = int(at + header_size + payload)
    if header_size < 16 or end > len(blob):
        return at + 4  # a stray match of the magic
    off = at + header_size
    while off + 32 <= end:
        kind, _, entry_header, size = struct.unpack_from("<HHIQ", blob, off)
        arch = int(struct.unpack_from("<I", blob, off + 28)[0])
        if entry_header < 32 or kind not in (1, 2):
            break
        if 10 <= arch < 1000:
            cc = ComputeCapability(arch // 10, arch % 10)
            found.add(Target(cc=cc, kind=TargetKind.PTX if kind == 1 else TargetKind.SASS))
        off += entry_header + size
    return end


def binary_targets(data: bytes) -> list[Target]:
    """The targets of one native module: its ELF fatbin sections when it is ELF, else a scan of the file."""
    if data[:4] == b"\x7fELF":
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile

        try:
            elf = ELFFile(io.BytesIO(data))
            sections = [s for s in elf.iter_sections() if s.name in (".nv_fatbin", "__nv_relfatbin")]
            if sections:
                return sorted(
                    {t for s in sections for t in fatbin_targets(s.data())}, key=lambda t: (t.cc, t.kind.value)
                )
        except ELFError:
            pass
    return fatbin_targets(data)


def cuobjdump_targets(path: Path, *, tool: str = CUOBJDUMP) -> list[Target] | None:
    """``cuobjdump --list-elf`` and ``--list-ptx`` of one file; None when the tool is absent or fails."""
    if shutil.which(tool) is None:
        return None
    found: set[Target] = set()
    for flag, kind in (("--list-elf", TargetKind.SASS), ("--list-ptx", TargetKind.PTX)):
        done = SubprocessRunner().run([tool, flag, str(path)], timeout_s=120)
        if done.returncode in (124, 126, 127):  # timed out, not executable, not found
            return None
        for m in re.finditer(r"\.sm_(\d+)([af]?)\.(?:cubin|ptx)", done.stdout):
            digits, suffix = m.group(1), m.group(2)
            cc = ComputeCapability(int(digits[:-1]), int(digits[-1]))
            special = {"a": TargetKind.ARCH_SPECIFIC, "f": TargetKind.FAMILY}
            k = kind if kind is TargetKind.PTX or not suffix else special[suffix]
            found.add(Target(cc=cc, kind=k))
    return sorted(found, key=lambda t: (t.cc, t.kind.value))


def wheel_targets(wheel: Path, *, use_cuobjdump: bool = True) -> dict[str, list[Target]]:
    """``{member: targets}`` for every native module in the wheel that holds GPU code.

    Raises:
        OSError / zipfile.BadZipFile / zlib.error / EOFError: the wheel cannot be read (callers turn these into
            :func:`attnforge.install.wheelfile.unreadable`).
    """
    out: dict[str, list[Target]] = {}
    with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory(prefix="attnforge-fatbin-") as tmp:
        for info in zf.infolist():
            if not info.filename.endswith(_NATIVE) and ".so." not in info.filename:
                continue
            data = zf.read(info)
            targets: list[Target] | None = None
            if use_cuobjdump and shutil.which(CUOBJDUMP):
                member = Path(tmp) / Path(info.filename).name
                member.write_bytes(data)
                targets = cuobjdump_targets(member)
            if not targets:
                targets = binary_targets(data)
            if targets:
                out[info.filename] = targets
    return out


def arch_problems(
    modules: dict[str, list[Target]],
    ccs: Sequence[ComputeCapability],
    runs_on: Callable[[Target, ComputeCapability], bool],
) -> list[str]:
    """Why the wheel's GPU code cannot run on ``ccs``: one line per GPU code module and GPU lacking code."""
    out = []
    for member, targets in sorted(modules.items()):
        for cc in ccs:
            if not any(runs_on(t, cc) for t in targets):
                has = ", ".join(str(t) for t in targets)
                out.append(
                    f"{member} has no SASS or compatible PTX for compute capability {format_cc(cc)}: it holds {has}"
                )
    return out
