"""The runtime: ``attention()`` picks the fastest verified kernel for each call and falls back to SDPA.

Submodules: ``policy`` (the pure choice), ``runtime`` (``attention``, ``explain``, ``use_backend``),
``features`` (the feature path of ``attention``), ``sdpa_patch``. The adapters, capability tables and the
registry live in :mod:`attnforge.backends`. Importing this package loads no torch.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "attention": "attnforge.dispatch.runtime",
    "explain": "attnforge.dispatch.runtime",
    "use_backend": "attnforge.dispatch.runtime",
    "refresh": "attnforge.dispatch.runtime",
    "Explanation": "attnforge.dispatch.explanation",
    "patch_sdpa": "attnforge.dispatch.sdpa_patch",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'attnforge.dispatch' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    if getattr(value, "__module__", None) == module:
        # held from now on, so the next access is a plain attribute (a ``__getattr__`` call costs a
        # microsecond or more, on every ``attnforge.attention`` call); a stand-in patched onto the module
        # (tests) is not held
        globals()[name] = value
    return value


__all__ = ["Explanation", "attention", "explain", "patch_sdpa", "refresh", "use_backend"]
