"""The content-addressed artifact store: build once, install in seconds, share as a PEP 503 index.

Nothing is read at import time; open a store with ``Store(home_dir(os.environ))`` or :func:`open_store`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from attnforge._system.paths import home_dir
from attnforge.cache.entry import Entry, PutResult
from attnforge.cache.key import ArtifactKind, CacheKey, CacheKeyInputs
from attnforge.cache.prune import PruneResult
from attnforge.cache.share import ExportResult, ImportResult
from attnforge.cache.store import Store


def open_store(environ: Mapping[str, str] | None = None) -> Store:
    """The store under ``$ATTNFORGE_HOME`` (else the platformdirs user cache)."""
    return Store(home_dir(os.environ if environ is None else environ))


__all__ = [
    "ArtifactKind",
    "CacheKey",
    "CacheKeyInputs",
    "Entry",
    "ExportResult",
    "ImportResult",
    "PruneResult",
    "PutResult",
    "Store",
    "open_store",
]
