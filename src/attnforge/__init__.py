"""attnforge: get the fastest attention kernel working on this NVIDIA machine, prove it, and keep using it.

Importing this package is cheap: no torch, no data files, no environment reads. The runtime API
(``attention``, ``explain``, ``use_backend``, ``patch_sdpa``) is loaded on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "attention": "attnforge.dispatch.runtime",
    "explain": "attnforge.dispatch.runtime",
    "use_backend": "attnforge.dispatch.runtime",
    "patch_sdpa": "attnforge.dispatch.sdpa_patch",
    "autotune": "attnforge.dispatch.autotune",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'attnforge' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    if getattr(value, "__module__", None) == module:
        # held from now on, so the next access is a plain attribute (a ``__getattr__`` call costs a
        # microsecond or more, on every ``attnforge.attention`` call); a stand-in patched onto the module
        # (tests) is not held
        globals()[name] = value
    return value


__all__ = ["__version__", "attention", "autotune", "explain", "patch_sdpa", "use_backend"]
