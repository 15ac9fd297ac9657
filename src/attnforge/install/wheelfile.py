"""Reading a wheel's own ``*.dist-info/`` files (``METADATA``, ``WHEEL``) without installing it."""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from email.message import Message
from email.parser import HeaderParser
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from attnforge.errors import InstallError


def read_dist_info(wheel: Path, member: str) -> tuple[list[str], Message]:
    """The wheel's member names, and its ``<name>-<version>.dist-info/<member>`` parsed as RFC 822 headers.

    The ``.dist-info`` directory is the top-level one of the distribution the file name names.

    Raises:
        InstallError: not a readable wheel (bad name, not a zip, no such member, not UTF-8).
    """
    try:
        name = canonicalize_name(parse_wheel_filename(wheel.name)[0])
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            found = next(
                n for n in names
                if n.count("/") == 1 and n.endswith(f".dist-info/{member}")
                and canonicalize_name(n.split("-", 1)[0]) == name
            )
            text = zf.read(found).decode("utf-8")
    except (OSError, zipfile.BadZipFile, StopIteration, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise InstallError(f"{wheel.name} is not a readable wheel", cause=str(exc) or type(exc).__name__) from None
    return names, HeaderParser().parsestr(text)


@dataclass(frozen=True, slots=True, kw_only=True)
class WheelMetadata:
    """The parts of a wheel's ``METADATA`` that decide whether it may be installed."""

    name: str
    version: str
    requires_dist: tuple[str, ...]


def read_wheel_metadata(wheel: Path) -> WheelMetadata:
    """Read ``*.dist-info/METADATA`` from a wheel.

    Raises:
        InstallError: not a readable wheel.
    """
    _, msg = read_dist_info(wheel, "METADATA")
    name = parse_wheel_filename(wheel.name)[0]
    return WheelMetadata(
        name=str(msg.get("Name", name)), version=str(msg.get("Version", "")),
        requires_dist=tuple(str(r) for r in msg.get_all("Requires-Dist") or ()),
    )
