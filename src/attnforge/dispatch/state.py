"""The runtime's view of its state under ``$ATTNFORGE_HOME``: records that never take a forward pass down.

:func:`attnforge.attention` must serve from any home (docs/reliability.md, "The runtime's state is optional"):
read-only, owned by another user, missing, or with a damaged ``records.db``. :class:`RuntimeRecords` wraps
:class:`attnforge.records.RecordStore` so that every such failure serves as an empty home would, warns once per
process with the cause and the fix, and never raises.
"""

from __future__ import annotations

import datetime as _dt
import warnings
from collections.abc import Mapping
from dataclasses import replace

from attnforge.errors import CacheError
from attnforge.records import RECOVERY, BenchRecord, RecordStore, VerifyRecord, open_records


class StateWarning(RuntimeWarning):
    """attnforge's state under ``$ATTNFORGE_HOME`` could not be used; the runtime goes on without it."""


#: records.db paths this process has warned about (one warning per file per process)
_WARNED: set[str] = set()
#: how long the runtime waits for another process's lock on records.db (a forward pass must not stall long)
RUNTIME_BUSY_TIMEOUT_S = 2.0


class RuntimeRecords:
    """The records as :func:`attnforge.attention` reads and writes them: never raises.

    Any failure to open, read or write ``records.db`` (a read-only, foreign-owned or missing home, a damaged,
    foreign, newer or locked file) makes it serve as an empty home would: no verify records, and only the bench
    records this process measured itself (kept in memory when they cannot be stored). It warns once per
    process with the cause and the fix (:class:`StateWarning`), then stops touching the file for the rest of
    the process (reads after a failed read, writes after a failed write).
    """

    def __init__(self, store: RecordStore) -> None:
        self.store = store
        self._kept: list[BenchRecord] = []
        self._read_failed = False
        self._write_failed = False

    def latest_verify(self, device_key: str) -> dict[str, VerifyRecord]:
        if not self._read_failed:
            try:
                return self.store.latest_verify(device_key)
            except Exception as exc:  # the runtime's state is optional: anything here degrades it
                self._read_failed = True
                self._warn(exc, "its records are not used")
        return {}

    def bench_records(self, device_key: str) -> list[BenchRecord]:
        stored: list[BenchRecord] = []
        if not self._read_failed:
            try:
                stored = self.store.bench_records(device_key, newest=True)  # all a decision reads of them
            except Exception as exc:  # as above
                self._read_failed = True
                self._warn(exc, "its records are not used")
        return stored + [r for r in self._kept if r.device_key == device_key]

    def add_bench(self, records: list[BenchRecord]) -> None:
        if not self._write_failed:
            try:
                self.store.add_bench(records)
                return
            except Exception as exc:  # as above
                self._write_failed = True
                self._warn(exc, "measurements made on first use are kept in this process only")
        self._kept.extend(replace(r, created_at=r.created_at or _now()) for r in records)

    def _warn(self, exc: Exception, effect: str) -> None:
        path = str(self.store.path)
        if path in _WARNED:
            return
        _WARNED.add(path)
        if isinstance(exc, CacheError):
            what, cause, hint = exc.message, exc.cause, exc.hint
        else:
            what, cause, hint = f"the records database {path} cannot be used", f"{type(exc).__name__}: {exc}", \
                RECOVERY
        warnings.warn(f"attnforge: {what} ({cause}); {effect}: attention() serves as with an empty home (plain "
                      f"SDPA unless this process measured better). Fix: {hint}", StateWarning, stacklevel=2)


def runtime_records(environ: Mapping[str, str] | None = None) -> RuntimeRecords:
    """The records for the runtime (:class:`RuntimeRecords`: never raises, waits at most
    :data:`RUNTIME_BUSY_TIMEOUT_S` for a lock; opening creates nothing)."""
    return RuntimeRecords(RecordStore(open_records(environ).path.parent, busy_timeout_s=RUNTIME_BUSY_TIMEOUT_S))


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
