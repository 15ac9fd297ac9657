"""Wheel tags a snapshot's interpreter accepts, computed from the snapshot (not from the running interpreter).

``packaging.tags.sys_tags()`` describes the Python attnforge runs in; a plan for a saved H200 snapshot must use
that machine's Python, ABI and glibc instead. The order is pip's: most specific first, ``manylinux`` before plain
``linux`` (pypa/packaging ``tags.py``; toolchain-facts.md §6.1).
"""

from __future__ import annotations

from packaging.tags import Tag, compatible_tags, cpython_tags, parse_tag

from attnforge.probe.snapshot import PlatformInfo

_MANYLINUX_LEGACY = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
_ARCH = {"amd64": "x86_64", "x86_64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def platform_tags(platform: PlatformInfo) -> list[str]:
    """Platform tags in preference order: ``manylinux_2_39_x86_64`` ... ``manylinux_2_5_x86_64``, ``linux_x86_64``
    on glibc Linux; the snapshot's own platform tag elsewhere (``win_amd64``)."""
    best = _best_tag(platform)
    own = best.platform if best is not None else ""
    if platform.os != "linux":
        return [own] if own else ([f"win_{platform.cpu_arch.lower()}"] if platform.os == "windows" else [])
    arch = _ARCH.get(platform.cpu_arch.lower(), platform.cpu_arch.lower())
    out: list[str] = []
    if platform.glibc:
        major, _, minor = platform.glibc.partition(".")
        if major == "2" and minor.isdigit():
            for m in range(int(minor), 4, -1):
                out.append(f"manylinux_2_{m}_{arch}")
                if m in _MANYLINUX_LEGACY:
                    out.append(f"{_MANYLINUX_LEGACY[m]}_{arch}")
    if own and own not in out:
        out.insert(0, own)
    out.append(f"linux_{arch}")
    return out


def supported_tags(platform: PlatformInfo) -> list[Tag]:
    """Every tag the snapshot's interpreter accepts, most preferred first."""
    parts = platform.python_version.split(".")
    version = (int(parts[0]), int(parts[1])) if len(parts) >= 2 and parts[1].isdigit() else (3, 0)
    plats = platform_tags(platform)
    best = _best_tag(platform)
    tags: list[Tag] = []
    if platform.python_implementation == "CPython":
        abis = [best.abi] if best is not None and best.abi not in ("abi3", "none") else None
        tags.extend(cpython_tags(version, abis=abis, platforms=plats))
    interpreter = best.interpreter if best is not None else None
    tags.extend(compatible_tags(version, interpreter=interpreter, platforms=plats))
    seen: set[Tag] = set()
    return [t for t in tags if not (t in seen or seen.add(t))]  # type: ignore[func-returns-value]


def _best_tag(platform: PlatformInfo) -> Tag | None:
    try:
        return next(iter(parse_tag(platform.wheel_tag)))
    except (ValueError, StopIteration):
        return None
