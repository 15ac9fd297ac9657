"""Moved to :mod:`attnforge.backends.adapter` (issue 13); this name stays for code written against it.

Import from ``attnforge.backends.adapter`` in new code (verify and bench must not import dispatch).
"""

from attnforge.backends.adapter import FEATURES, AttentionCall, BackendAdapter, reference_attention

__all__ = ["FEATURES", "AttentionCall", "BackendAdapter", "reference_attention"]
