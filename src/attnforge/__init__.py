"""attnforge: get the fastest attention kernel working on this NVIDIA machine, prove it, and keep using it.

Importing this package is cheap: no torch, no data files, no environment reads. The runtime API
(``attention``, ``explain``, ``use_backend``, ``patch_sdpa``) is loaded on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "attention": "attnforge.dispatch",
    "explain": "attnforge.dispatch",
    "use_backend": "attnforge.dispatch",
    "patch_sdpa": "attnforge.dispatch",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'attnforge' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = ["__version__", "attention", "explain", "patch_sdpa", "use_backend"]
