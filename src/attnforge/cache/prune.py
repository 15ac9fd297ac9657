"""Making room in the store: entries unused for a while, then the least recently used, and the debris of
writers that died (``attnforge cache prune``, through :func:`attnforge.provision.cache.prune`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnforge.cache.entry import Entry

if TYPE_CHECKING:
    from attnforge.cache.store import Store


@dataclass(frozen=True, slots=True, kw_only=True)
class PruneResult:
    removed: tuple[Entry, ...]
    freed_bytes: int
    kept_bytes: int
    debris_removed: tuple[str, ...] = ()  # staging dirs of dead writers and dirs without a row


def prune(store: Store, *, older_than_s: float | None = None, max_size_bytes: int | None = None) -> PruneResult:
    """Remove entries of ``store`` unused for ``older_than_s``, then least recently used ones until it holds
    at most ``max_size_bytes``; also clears the debris of writers that died.
    """
    with store.writer():
        debris = store.remove_debris_locked()
        entries = sorted(store.list(), key=lambda e: e.last_used_at_s)
        doomed: list[Entry] = []
        if older_than_s is not None:
            cutoff = store.now() - older_than_s
            doomed = [e for e in entries if e.last_used_at_s < cutoff]
        kept = [e for e in entries if e not in doomed]
        total = sum(e.size_bytes for e in kept)
        if max_size_bytes is not None:
            while kept and total > max_size_bytes:
                victim = kept.pop(0)
                doomed.append(victim)
                total -= victim.size_bytes
        store.delete_locked(doomed)
    return PruneResult(
        removed=tuple(doomed), freed_bytes=sum(e.size_bytes for e in doomed), kept_bytes=total,
        debris_removed=tuple(debris),
    )
