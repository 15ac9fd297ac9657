"""Run every reliability fault and print the table for docs/reliability.md.

Usage (from the repository root; root is needed for the tmpfs and "another user" rows, which are otherwise
reported as skipped)::

    python3 scripts/reliability/run.py [--trials 5] [--seed 1] [--only NAME ...] [--json out.json]

Each fault is injected for real (processes killed, a full tmpfs, a read-only home, tampered archives, a
second user); a trial "survived" when nothing was lost or corrupted and every error was a clean message.
Keep --trials modest on a shared machine: the concurrent-install row starts 8 pip processes per trial.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import edge_faults
import store_faults
from common import Row

FAULTS = {
    "concurrent-stores": store_faults.concurrent_stores,
    "sigkill-stores": store_faults.sigkill_stores,
    "byte-flips": store_faults.byte_flips,
    "relabelled-key": store_faults.relabelled_key,
    "disk-full": store_faults.disk_full,
    "sigkill-builds": edge_faults.sigkill_builds,
    "hostile-imports": edge_faults.hostile_imports,
    "shared-export-dir": edge_faults.shared_export_dir,
    "readonly-home": edge_faults.readonly_home,
    "concurrent-installs": edge_faults.concurrent_installs,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--install-trials", type=int, default=3,
                        help="trials of the 8-concurrent-installs row (each starts 8 pip processes)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", nargs="*", choices=sorted(FAULTS), default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))  # run the finally blocks (umount, rm)
    rng = random.Random(args.seed)  # noqa: S311 - reproducible fault timing, not cryptography
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="attnforge-reliability-") as tmp:
        for name in args.only or list(FAULTS):
            start = time.monotonic()
            work = Path(tmp) / name
            work.mkdir()
            trials = args.install_trials if name == "concurrent-installs" else args.trials
            got = FAULTS[name](work, trials, rng)
            rows.extend(got if isinstance(got, list) else [got])
            print(f"{name}: {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    print("| fault | trials | survived | what was lost |")
    print("|---|---|---|---|")
    for r in rows:
        lost = "nothing" if r.trials and r.survived == r.trials and not r.lost else "; ".join(r.lost)[:400]
        print(f"| {r.fault} | {r.trials} | {r.survived} | {lost} |")
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=2))
    return 0 if all(r.survived == r.trials and not r.lost for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
