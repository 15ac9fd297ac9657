"""The runtime: ``attention()`` picks the fastest verified kernel for each call and falls back to SDPA.

Submodules: ``policy`` (the pure choice), ``runtime`` (``attention``, ``explain``, ``use_backend``),
``features`` (the feature path of ``attention``), ``sdpa_patch``. The adapters, capability tables and the
registry live in :mod:`attnforge.backends`. Importing this package loads no torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

_LAZY = {
    "attention": "attnforge.dispatch.runtime",
    "explain": "attnforge.dispatch.runtime",
    "use_backend": "attnforge.dispatch.runtime",
    "refresh": "attnforge.dispatch.runtime",
    "Explanation": "attnforge.dispatch.explanation",
    "patch_sdpa": "attnforge.dispatch.sdpa_patch",
}


def lazy_attribute(package: str, table: Mapping[str, str], name: str, namespace: dict[str, Any]) -> Any:
    """``name`` of ``package`` from the module ``table`` maps it to, imported on first use.

    The one lazy loader of this package and of the root package (``attnforge.attention``): each module's
    ``__getattr__`` calls it with its own ``globals()`` as ``namespace``.

    Raises:
        AttributeError: ``table`` does not name ``name``.
    """
    module = table.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    if getattr(value, "__module__", None) == module:
        # held from now on, so the next access is a plain attribute (a ``__getattr__`` call costs a
        # microsecond or more, on every ``attnforge.attention`` call); a stand-in patched onto the module
        # (tests) is not held
        namespace[name] = value
    return value


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _LAZY, name, globals())


__all__ = ["Explanation", "attention", "explain", "patch_sdpa", "refresh", "use_backend"]
