"""Real, pip-installable pure-Python wheels written directly with zipfile (no build backend, milliseconds).

The layout follows the wheel spec (PEP 427 / the binary distribution format): a package, ``*.dist-info/``
with METADATA, WHEEL and a RECORD that lists every file with its urlsafe-base64 sha256.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from packaging.utils import canonicalize_name


def make_wheel(
    dest: Path,
    *,
    name: str = "af-pure-fixture",
    version: str = "0.1.0",
    requires: Sequence[str] = (),
    value: int = 42,
    tag: str = "py3-none-any",
    padding_bytes: int = 0,
    extra_files: Mapping[str, bytes] | None = None,
) -> Path:
    """Write ``<name>-<version>-<tag>.whl`` into ``dest`` and return its path.

    The wheel holds one module ``<name as identifier>`` with ``VALUE = value``; ``padding_bytes`` adds an
    incompressible data file to make the wheel bigger (for interruption tests); ``extra_files`` adds files at
    the given paths (e.g. a ``.pth`` at the top level).
    """
    dest.mkdir(parents=True, exist_ok=True)
    module = canonicalize_name(name).replace("-", "_")
    dist = f"{module}-{version}"
    files: dict[str, bytes] = {
        f"{module}/__init__.py": f'VALUE = {value}\nVERSION = "{version}"\n'.encode(),
    }
    files.update(extra_files or {})
    if padding_bytes:
        files[f"{module}/padding.bin"] = hashlib.shake_256(name.encode()).digest(padding_bytes)
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    files[f"{dist}.dist-info/METADATA"] = ("\n".join(meta) + "\n").encode()
    files[f"{dist}.dist-info/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: attnforge-tests\nRoot-Is-Purelib: true\nTag: {tag}\n"
    ).encode()
    record_lines = [f"{path},sha256={_b64(data)},{len(data)}" for path, data in files.items()]
    record_lines.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record_lines) + "\n").encode()
    path = dest / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in files.items():
            zf.writestr(arcname, data)
    return path


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def flip_byte(path: Path, offset: int | None = None) -> None:
    """Flip every bit of one byte (the middle one unless ``offset`` is given)."""
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))
