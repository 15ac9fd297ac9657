"""Small shims so attnforge runs on Python 3.10 (``enum.StrEnum`` and ``tomllib`` arrived in 3.11)."""

from __future__ import annotations

import enum
import sys

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - exercised on Python 3.10 only

    class StrEnum(str, enum.Enum):
        """``enum.StrEnum`` for Python 3.10: members are strings and print as their value."""

        def __str__(self) -> str:
            return str(self.value)


__all__ = ["StrEnum"]
