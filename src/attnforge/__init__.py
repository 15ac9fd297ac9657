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
    "autotune": "attnforge.dispatch.runtime",
}


def __getattr__(name: str) -> Any:
    from attnforge.dispatch import lazy_attribute

    return lazy_attribute(__name__, _LAZY, name, globals())


__all__ = ["__version__", "attention", "autotune", "explain", "patch_sdpa", "use_backend"]
