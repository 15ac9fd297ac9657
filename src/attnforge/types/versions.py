"""Version strings compared the one right way: :class:`packaging.version.Version` (PEP 440).

Never sort versions by splitting on dots: ``2.8.3rc1`` is older than ``2.8.3``, and ``2.8`` vs ``2.8.3`` must not
compare an int with a tuple.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TypeVar

from packaging.version import InvalidVersion, Version

T = TypeVar("T")
_DIGITS = re.compile(r"\d+")


def parse_version(text: str) -> Version | None:
    """The PEP 440 version of ``text``; None when it is not one."""
    try:
        return Version(text.strip())
    except InvalidVersion:
        return None


def loose_version(text: str) -> Version:
    """A version for sorting tool versions that are not always PEP 440 (``"v12.8"``, ``"17.14.36310.24"``,
    ``"CUDA_PATH_V12_8"``, a folder name): the PEP 440 reading when there is one, else every run of digits
    joined by dots (``12.8``), else ``0``."""
    v = parse_version(text)
    if v is not None:
        return v
    digits = _DIGITS.findall(text)
    return Version(".".join(digits)) if digits else Version("0")


def major_minor(text: str) -> str:
    """``"12.8.1"`` -> ``"12.8"``; ``"14.44.35207"`` -> ``"14.44"``; a single number stays as it is."""
    return ".".join(text.strip().split(".")[:2])


def newest_first(items: Iterable[T], version: Callable[[T], Version],
                 tiebreak: Callable[[T], tuple[object, ...]] | None = None) -> list[T]:
    """``items`` with the newest version first (a final release before its pre-releases); equal versions keep
    the order of ``tiebreak`` (ascending), else their input order."""
    out = list(items)
    if tiebreak is not None:
        out.sort(key=tiebreak)
    out.sort(key=version, reverse=True)
    return out


#: ``"12.8"`` -> ``(12, 8)``: CUDA and torch release numbers compared as integer pairs.
MajorMinor = tuple[int, int]
_MAJOR_MINOR = re.compile(r"^\s*(\d+)\.(\d+)")


def parse_major_minor(text: str) -> MajorMinor:
    """``"12.8"``, ``"12.8.1"``, ``"2.11.0+cu130"`` -> ``(12, 8)`` / ``(2, 11)``.

    Raises:
        ValueError: not ``MAJOR.MINOR[...]``.
    """
    m = _MAJOR_MINOR.match(text)
    if m is None:
        raise ValueError(f"not a MAJOR.MINOR version: {text!r}")
    return (int(m.group(1)), int(m.group(2)))


def format_major_minor(v: MajorMinor) -> str:
    """``(12, 8)`` -> ``"12.8"``."""
    return f"{v[0]}.{v[1]}"
