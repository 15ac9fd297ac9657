#!/usr/bin/env python3
"""fresh_home.py SRC_HOME DEST_HOME [--drop BACKEND...]: an ATTNFORGE_HOME for the no-bench check (issue 25 item 2).

DEST gets SRC's ``records.db`` with its verify records and no bench or first-use measurements (the ``bench``
table emptied), so ``attnforge.attention`` there knows which backends are verified and has measured nothing:
the check sees what a user who ran only ``install`` and ``verify`` gets. The artifact cache stays behind.
``--drop BACKEND...`` also deletes those backends' verify records (a home where, say, ``flex`` was never verified).
"""

from __future__ import annotations

import shutil
import sqlite3
import sys
from pathlib import Path


def main() -> int:
    src, dest = Path(sys.argv[1]), Path(sys.argv[2])
    drop = sys.argv[4:] if sys.argv[3:4] == ["--drop"] else []
    dest.mkdir(parents=True, exist_ok=True)
    db = src / "records.db"
    if not db.exists():
        print(f"no {db}: the check starts with no verify records either")
        return 1
    with sqlite3.connect(db) as conn:  # a consistent copy even while another process writes
        conn.backup(out := sqlite3.connect(dest / "records.db"))
    with out:
        tables = [r[0] for r in out.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        counts = {t: out.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables}  # noqa: S608 (names from sqlite_master)
        for t in tables:
            if t != "verify":
                out.execute(f"DELETE FROM {t}")  # noqa: S608 (names from sqlite_master)
        for backend in drop:
            out.execute("DELETE FROM verify WHERE backend = ?", (backend,))
    out.close()
    print(f"{dest / 'records.db'}: kept verify ({counts.get('verify', 0)} rows; dropped {drop or 'none'}), emptied "
          + ", ".join(f"{t} ({n})" for t, n in counts.items() if t != "verify"))
    shutil.copy2(src / "config.toml", dest) if (src / "config.toml").exists() else None
    return 0


if __name__ == "__main__":
    sys.exit(main())
