"""Moved to :mod:`attnforge.backends.registry` (issue 13); this name stays for code written against it.

Import from ``attnforge.backends.registry`` in new code (verify and bench must not import dispatch).
"""

from attnforge.backends.registry import FALLBACK, adapters, fallback, make_adapter

__all__ = ["FALLBACK", "adapters", "fallback", "make_adapter"]
