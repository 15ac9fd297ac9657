"""What ``ATTNFORGE_AUTOTUNE`` says, read without torch (the CLI checks it before any work; the runtime reads it on
every decision through :func:`attnforge.dispatch.autotune.active`).

Values (case and surrounding blanks ignored): unset or empty, the default (measure on first use on CUDA, in the
call); ``0``/``false``/``no``/``off``; ``1``/``true``/``yes``/``on`` (on CPU too); ``background`` (on CUDA, off
the calling thread). Anything else is a mistake: the CLI refuses it (:func:`setting` raises), the runtime warns
once and keeps the default (:func:`lenient`), since ``attention()`` must not fail a forward pass over a setting.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Literal

from attnforge._system.switches import OFF, ON
from attnforge.errors import UsageError

ENV = "ATTNFORGE_AUTOTUNE"
#: the variable's value that measures off the calling thread (opt-in: see :mod:`attnforge.dispatch.autotune`)
BACKGROUND = "background"

Setting = Literal["default", "off", "on", "background"]


def setting(environ: Mapping[str, str] | None = None) -> Setting:
    """The setting ``ATTNFORGE_AUTOTUNE`` names in ``environ`` (``os.environ`` by default).

    Raises:
        UsageError: a value that is none of the above (exit code 2), with the accepted ones in its hint.
    """
    text = (os.environ if environ is None else environ).get(ENV, "").strip().lower()
    if not text:
        return "default"
    if text in OFF:
        return "off"
    if text in ON:
        return "on"
    if text == BACKGROUND:
        return "background"
    raise UsageError(f"{ENV}={text!r} is not a setting",
                     hint="use 0 (never measure), 1 (on CPU too), background (on CUDA, off the calling thread), "
                          "or unset it for the default (on CUDA, in the first call)")


_WARNED: set[str] = set()


def lenient(environ: Mapping[str, str] | None = None) -> Setting:
    """:func:`setting`, with an unknown value read as the default after one ``RuntimeWarning`` per value and
    process (the runtime's reading: a typo must not take a forward pass down)."""
    try:
        return setting(environ)
    except UsageError as exc:
        text = (os.environ if environ is None else environ).get(ENV, "")
        if text not in _WARNED:
            _WARNED.add(text)
            warnings.warn(f"attnforge: {exc.message}; the default is used ({exc.hint})", RuntimeWarning,
                          stacklevel=3)
        return "default"
