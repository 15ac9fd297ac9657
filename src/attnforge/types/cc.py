"""A GPU's compute capability, spelled the ways people and tools write it ("9.0", "90", "sm_90", "sm_90a")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class ComputeCapability(NamedTuple):
    """``(major, minor)``; a tuple, so it compares, sorts and unpacks like ``(9, 0)``.

    ``str(cc)`` is ``"9.0"`` and :meth:`parse` reads that back (and every other spelling).
    """

    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> ComputeCapability:
        """``"9.0"``, ``"90"``, ``"sm_90"``, ``"sm_90a"``, ``"compute_120f"`` -> ``ComputeCapability(9, 0)``.

        Raises:
            ValueError: not a compute capability.
        """
        t = text.strip().lower().removeprefix("sm_").removeprefix("compute_").rstrip("af")
        if "." in t:
            major, _, minor = t.partition(".")
        elif t.isdigit() and len(t) in (2, 3):
            major, minor = t[:-1], t[-1]
        else:
            raise ValueError(f"not a compute capability: {text!r} (expected e.g. 9.0, 90 or sm_90)")
        if not (major.isdigit() and minor.isdigit()):
            raise ValueError(f"not a compute capability: {text!r} (expected e.g. 9.0, 90 or sm_90)")
        return cls(int(major), int(minor))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def sm(self) -> str:
        """``"sm_90"`` (nvcc's ``-arch`` / cuobjdump's spelling)."""
        return f"sm_{self.major}{self.minor}"


def parse_cc(text: str) -> ComputeCapability:
    """:meth:`ComputeCapability.parse` as a function."""
    return ComputeCapability.parse(text)


def format_cc(cc: tuple[int, int]) -> str:
    """``(9, 0)`` -> ``"9.0"`` (the way TORCH_CUDA_ARCH_LIST and people write it); takes a plain tuple too."""
    return f"{cc[0]}.{cc[1]}"


def parse_cc_list(values: Iterable[str]) -> tuple[ComputeCapability, ...]:
    """``("9.0,12.0",)`` or ``("9.0", "sm_120")`` -> ``((9, 0), (12, 0))``: the one arch-list parser of every verb.

    Commas and semicolons separate entries (``TORCH_CUDA_ARCH_LIST`` style); duplicates are dropped, order kept.

    Raises:
        ValueError: an entry is not a compute capability.
    """
    out: list[ComputeCapability] = []
    for value in values:
        for item in value.replace(";", ",").split(","):
            if item.strip() and (cc := ComputeCapability.parse(item)) not in out:
                out.append(cc)
    return tuple(out)
