"""Reading a wheel's own ``*.dist-info/`` files (``METADATA``, ``WHEEL``) without installing it."""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass
from email.message import Message
from email.parser import HeaderParser
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from attnforge.errors import InstallError


def read_dist_info(wheel: Path, member: str) -> tuple[list[str], Message]:
    """The wheel's member names, and its ``<name>-<version>.dist-info/<member>`` parsed as RFC 822 headers.

    The ``.dist-info`` directory is the top-level one of the distribution the file name names. Every reader of a
    wheel's own files comes through here (pip's checks, the overlap check, the installer's check of a fetched
    wheel), so a damaged or mislabelled file is told apart the same way everywhere.

    Raises:
        InstallError: not a readable wheel (bad name, not a zip, not UTF-8), or mislabelled (no
            ``<name>-*.dist-info/<member>`` of the project its file name names).
    """
    try:
        name = canonicalize_name(parse_wheel_filename(wheel.name)[0])
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            found = [
                n for n in names
                if n.count("/") == 1 and n.endswith(f".dist-info/{member}")
                and canonicalize_name(n.split("-", 1)[0]) == name
            ]
            if not found:
                raise _mislabelled(wheel, name, member, names)
            text = zf.read(found[0]).decode("utf-8")
    except UNREADABLE as exc:
        raise unreadable(wheel, exc) from None
    return names, HeaderParser().parsestr(text)


#: What reading a damaged zip raises: not a zip or a bad CRC (``BadZipFile``), a broken deflate stream
#: (``zlib.error``), a truncated member (``EOFError``), a bad name or text (``ValueError``, ``UnicodeDecodeError``
#: included), the OS's own errors.
UNREADABLE = (OSError, zipfile.BadZipFile, zlib.error, EOFError, ValueError)


def unreadable(wheel: Path, exc: BaseException) -> InstallError:
    """The error for a wheel file that could not be read (one of :data:`UNREADABLE`)."""
    return InstallError(
        f"{wheel.name} is not a readable wheel", cause=str(exc) or type(exc).__name__,
        hint=f"the file is damaged or not a wheel: remove {wheel.name} from where it came from and fetch it again",
    )


def _mislabelled(wheel: Path, name: str, member: str, names: list[str]) -> InstallError:
    """The error for a wheel whose file name names a project its own ``*.dist-info`` does not."""
    infos = sorted({n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")})
    holds = ", ".join(infos) if infos else "no *.dist-info directory at all"
    return InstallError(
        f"{wheel.name} is mislabelled: it has no {name.replace('-', '_')}-*.dist-info/{member}",
        cause=f"its file name says {name}, but it holds {holds}",
        hint=f"the file was renamed or is another project's wheel: remove {wheel.name} from where it came from "
        "and take the wheel its project published",
    )


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
