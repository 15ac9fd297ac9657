"""Verify in a fresh interpreter: ``python -m attnforge.verify.child BACKEND...`` prints one JSON line.

``attnforge install`` checks what it just installed in a new process (so the new files are what loads); that
process calls the library (:func:`verify_here`), never the command line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from attnforge.errors import AttnforgeError
from attnforge.verify.run import VerifyReport


def verify_here(names: Sequence[str], *, device: str | None = None, seed: int = 0) -> VerifyReport:
    """Verify ``names`` (all that run here when empty) on this machine with the packaged catalog, tolerances and
    adapters, and store the verdicts in ``$ATTNFORGE_HOME`` (what ``attnforge verify`` does, without printing).

    Raises:
        UsageError: an unknown backend or device.
    """
    from attnforge.backends.registry import adapters
    from attnforge.catalog import load_catalog
    from attnforge.catalog.tolerances import load_tolerances
    from attnforge.records import open_records
    from attnforge.verify.device import current_device
    from attnforge.verify.run import run_verify

    return run_verify(list(names), adapters=adapters(), catalog=load_catalog(), device=current_device(device),
                      tolerances=load_tolerances(), store=open_records(), python=sys.executable,
                      seed=seed)


def main(argv: Sequence[str]) -> int:
    """Print ``{"ok": ..., "results": [{"backend", "ok", "summary"}]}``; exit 0 when every backend passed."""
    try:
        report = verify_here(argv)
    except AttnforgeError as exc:
        print(json.dumps({"ok": False, "error": exc.message, "hint": exc.hint, "results": []}))
        return exc.exit_code
    print(json.dumps({"ok": report.ok, "results": [
        {"backend": r.backend, "ok": r.ok, "summary": r.summary} for r in report.results]}))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
