"""Numbers and paths the command line reads: option types and the numeric environment variables, checked at the door.

``click.FloatRange(min=1)`` lets ``nan`` through (every comparison with NaN is false) and ``inf`` too; they then
surfaced deep inside as ``ValueError: cannot convert float NaN to integer`` (issue 31, item 9). Every numeric
option and variable is parsed here, so a bad value is a usage error naming the option, never an internal error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:  # click >= 8.2 makes ParamType generic (value, input); 8.1, which we admit, does not
    _FloatParam = click.ParamType[float, Any]
else:
    _FloatParam = click.ParamType

#: The longest ``--timeout`` accepted: a week is longer than any build, verify or bench, and far below where the
#: OS timers overflow (``poll()`` takes a C int of milliseconds: about 24.8 days).
MAX_TIMEOUT_S = 7 * 24 * 3600.0


class FiniteFloat(_FloatParam):
    """A finite float in ``[min_value, max_value]``: ``nan``, ``inf`` and out-of-range values are usage errors.

    Args:
        min_value: the smallest value accepted.
        max_value: the largest value accepted.
        unit: named in the error ("seconds").
    """

    name = "float"

    def __init__(self, *, min_value: float, max_value: float, unit: str) -> None:
        self.min_value = min_value
        self.max_value = max_value
        self.unit = unit

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float | int) and not isinstance(value, bool):
            number = float(value)
        else:
            try:
                number = float(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not a number of {self.unit}", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of {self.unit}", param, ctx)
        if not self.min_value <= number <= self.max_value:
            self.fail(f"{value!r} is outside {self.min_value:g}..{self.max_value:g} {self.unit}", param, ctx)
        return number

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "SECONDS" if self.unit == "seconds" else "NUMBER"

    def __repr__(self) -> str:
        return f"FiniteFloat({self.min_value:g}..{self.max_value:g} {self.unit})"


def timeout_type(min_s: float = 1.0) -> FiniteFloat:
    """The type of every ``--timeout``: finite seconds, at least ``min_s``, at most :data:`MAX_TIMEOUT_S`."""
    return FiniteFloat(min_value=min_s, max_value=MAX_TIMEOUT_S, unit="seconds")


def columns_from_env(environ: Mapping[str, str]) -> tuple[int | None, str | None]:
    """``COLUMNS`` as a width: ``(width, None)``, ``(None, None)`` when unset or empty, or ``(None, why)`` when it
    is not a positive integer (``abc``, ``-5``, ``1e9``): the caller then uses its default width and says
    why once. Rich reads it the same way (only digits count: ``rich/console.py``, ``Console.__init__``).
    """
    raw = environ.get("COLUMNS", "").strip()
    if not raw or raw == "0":  # 0: no width asked for, as an unset variable
        return None, None
    if raw.isdigit() and 0 < int(raw) <= 10_000:
        return int(raw), None
    return None, f"COLUMNS={raw!r} is not a width in columns (1..10000); ignored"


class NamedPath(click.Path):
    """``click.Path`` that refuses an empty or blank value: click reads ``""`` as ``Path("")``, the current directory,
    so ``attnforge cache export ""`` wrote ``artifacts/`` and ``simple/`` into wherever the shell stood, exit 0
    (a CLI fuzz, 2026-12-03). ``.`` still names the current directory."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail(f"{value!r} names no path (use . for the current directory)", param, ctx)
        return super().convert(value, param, ctx)
