"""attnforge's own local version label of a built wheel: the torch (major.minor), CUDA, C++11 ABI and arch set
it was built for, e.g. ``cu130torch2.11.cxx11abitrue.sm80sm90``; for a libtorch stable-ABI build, its minimum torch
and ``stable``, e.g. ``cu130torch2.9.stable.sm90`` (any torch >= 2.9; :mod:`attnforge.types.binary`).

Written by :mod:`attnforge.cache.label` when a build is cached (with ``Requires-Dist: torch==X.Y.*``), and read
back by :mod:`attnforge.resolve.wheels` when such a wheel is offered by a find-links page, an index or a team's
GitHub releases: one grammar, one room, below both. The grammar (PEP 440 local version: lowercase alphanumerics
separated by periods)::

    label   = variant "torch" MAJOR "." MINOR [ ".cxx11abi" ("true" | "false") | ".stable" ] [ "." archs ]
    variant = "cu" DIGITS        (torch's CUDA, 13.0 -> cu130)  |  "cpu"
    archs   = ( "sm" DIGITS )+   (compute capabilities, 8.0 and 9.0 -> sm80sm90)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import Version

from attnforge.types.cc import ComputeCapability

_LABEL_RE = re.compile(
    r"(?:cu(?P<cu>\d+)|(?P<cpu>cpu))torch(?P<major>\d+)\.(?P<minor>\d+)"
    r"(?:\.cxx11abi(?P<abi>true|false)|\.(?P<stable>stable))?(?:\.(?P<archs>(?:sm\d+)+))?"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalLabel:
    """What a built wheel is bound to. ``str()`` and :meth:`parse` round-trip."""

    torch: tuple[int, int]  # torch's (major, minor); with ``stable_abi`` the minimum torch
    cuda: str | None  # torch's CUDA ("13.0"), None for a CPU torch
    cxx11_abi: bool | None = None
    archs: tuple[ComputeCapability, ...] = ()
    stable_abi: bool = False  # the libtorch stable ABI: any torch >= ``torch`` (no C++11 ABI of torch's)

    def __post_init__(self) -> None:
        object.__setattr__(self, "archs", tuple(sorted(set(self.archs))))
        if self.stable_abi and self.cxx11_abi is not None:
            raise ValueError("a stable-ABI build has no C++11 ABI of torch's")
        if self.cuda is not None and not re.fullmatch(r"\d+\.\d", self.cuda):
            raise ValueError(f"CUDA version {self.cuda!r} is not like '13.0'")

    @classmethod
    def for_torch(cls, torch_version: str, cuda: str | None, cxx11_abi: bool | None,
                  archs: tuple[ComputeCapability, ...]) -> LocalLabel:
        release = Version(torch_version).release
        return cls(torch=(release[0], release[1] if len(release) > 1 else 0), cuda=cuda, cxx11_abi=cxx11_abi,
                   archs=archs)

    def __str__(self) -> str:
        variant = "cpu" if self.cuda is None else "cu" + self.cuda.replace(".", "")
        text = f"{variant}torch{self.torch[0]}.{self.torch[1]}"
        if self.cxx11_abi is not None:
            text += f".cxx11abi{str(self.cxx11_abi).lower()}"
        if self.stable_abi:
            text += ".stable"
        if self.archs:
            text += "." + "".join(f"sm{major}{minor}" for major, minor in self.archs)
        return text

    @classmethod
    def parse(cls, text: str) -> LocalLabel:
        """Raises ValueError for text outside the grammar (a CUDA of two digits or more: ``cu130`` is 13.0)."""
        match = _LABEL_RE.fullmatch(text.strip().lower())
        if match is None:
            raise ValueError(f"not an attnforge local version label: {text!r}")
        cu = match["cu"]
        cuda = None if cu is None else f"{cu[:-1]}.{cu[-1]}"
        abi = None if match["abi"] is None else match["abi"] == "true"
        archs = tuple(ComputeCapability(int(a[:-1]), int(a[-1])) for a in re.findall(r"sm(\d+)", match["archs"] or ""))
        return cls(torch=(int(match["major"]), int(match["minor"])), cuda=cuda, cxx11_abi=abi, archs=archs,
                   stable_abi=match["stable"] is not None)

    @property
    def torch_requirement(self) -> str:
        """``torch==2.11.*`` (one minor), ``torch>=2.9`` (stable ABI)."""
        if self.stable_abi:
            return f"torch>={self.torch[0]}.{self.torch[1]}"
        return f"torch=={self.torch[0]}.{self.torch[1]}.*"


def stable_abi_of_version(version: str | None) -> bool | None:
    """Whether an installed version's attnforge local label says the libtorch stable ABI
    (``3.0.0+cu130torch2.9.stable`` True, ``3.0.0+cu130torch2.11.cxx11abitrue.sm90`` False); None where the version
    has no such label (a wheel attnforge did not label: its ABI is not known from its version)."""
    local = version.partition("+")[2] if version else ""
    try:
        return LocalLabel.parse(local).stable_abi if local else None
    except ValueError:
        return None


__all__ = ["LocalLabel", "stable_abi_of_version"]
