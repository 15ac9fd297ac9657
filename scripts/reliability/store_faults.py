"""Faults of the store itself: concurrent writers, SIGKILL mid-store, byte flips, a full disk."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from common import (
    SRC,
    Row,
    Store,
    can_mount,
    clean_error,
    cli,
    consistent,
    flip,
    fresh,
    inputs_for,
    make_wheel,
    no_traceback,
    store_with,
)

from attnforge.errors import CacheError

_WRITER = """
import sys
sys.path[:0] = [{src!r}, {repo!r}]
from pathlib import Path
from attnforge.cache import Store
from tests.cache.conftest import inputs_for
from tests.cache.wheelmaker import make_wheel
home, dist, version, padding = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
wheel = make_wheel(dist / version, version=version, padding_bytes=padding)
print("ready", flush=True)
Store(home).put(wheel, inputs_for(wheel))
print("stored", flush=True)
"""


def _writer(home: Path, dist: Path, version: str, padding: int) -> subprocess.Popen[str]:
    code = _WRITER.format(src=str(SRC), repo=str(SRC.parent))
    return subprocess.Popen([sys.executable, "-c", code, str(home), str(dist), version, str(padding)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def concurrent_stores(work: Path, trials: int, rng: random.Random) -> Row:
    row = Row("4 processes store into one cache at once (2 of them the same wheel)")
    for t in range(trials):
        home = fresh(work / f"cs{t}")
        versions = ["1.0", "1.0", "2.0", "3.0"]
        procs = [_writer(home, work / f"cs{t}-dist{i}", v, 1 << 16) for i, v in enumerate(versions)]
        outs = [p.communicate(timeout=300) for p in procs]
        failed = [e[-300:] for (o, e), p in zip(outs, procs, strict=True) if p.returncode != 0]
        store = Store(home)
        names = sorted(e.version for e in store.list())
        problem = consistent(store)
        row.record(not failed and names == ["1.0", "2.0", "3.0"] and problem is None,
                   f"failed: {failed}; entries {names}; {problem}")
    return row


def sigkill_stores(work: Path, trials: int, rng: random.Random) -> Row:
    row = Row("SIGKILL of a store at a random time (0-300 ms after start, 4 MiB wheel)")
    for t in range(trials):
        home = fresh(work / f"ks{t}")
        proc = _writer(home, work / f"ks{t}-dist", "1.0", 4 << 20)
        assert proc.stdout is not None
        proc.stdout.readline()
        time.sleep(rng.uniform(0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        store = Store(home)
        problem = consistent(store)
        entries = store.list()
        ok = problem is None and all(store.get(e.key).is_file() for e in entries)
        # the next writer clears the debris and stores normally
        again = make_wheel(work / f"ks{t}-again", version="2.0")
        store.put(again, inputs_for(again))
        ok = ok and consistent(store) is None
        row.record(ok, f"{problem}; entries {len(entries)}")
    return row


def byte_flips(work: Path, trials: int, rng: random.Random) -> list[Row]:
    wheels = Row("one flipped bit in a cached wheel")
    prov = Row("one flipped bit in provenance.json")
    db = Row("one flipped bit in cache.db")
    for t in range(trials):
        store, keys = store_with(fresh(work / f"bf{t}"), work / f"bf{t}-dist", ["1.0", "2.0"])
        entry = store.show(keys[0])
        flip(Path(entry.path), rng)
        try:
            store.get(keys[0])
            wheels.record(False, "a flipped wheel was returned by get()")
        except CacheError:
            wheels.record(consistent(store) is None and len(store.list()) == 1, "store inconsistent after")
        store2, keys2 = store_with(fresh(work / f"bp{t}"), work / f"bp{t}-dist", ["1.0"])
        flip(Path(store2.show(keys2[0]).path).parent / "provenance.json", rng)
        exported = cli(store2.root, "cache", "export", str(work / f"bp{t}-out"))
        doc_ok = True
        try:
            json.loads((Path(store2.show(keys2[0]).path).parent / "provenance.json").read_text())
        except (ValueError, UnicodeDecodeError):
            doc_ok = False
        verified = cli(store2.root, "cache", "verify")
        harmless = doc_ok and verified.returncode == 0  # e.g. a flip inside a free-text value
        prov.record(no_traceback(exported) and no_traceback(verified)
                    and (harmless or (exported.returncode == 1 and verified.returncode == 1)),
                    f"export rc {exported.returncode}, verify rc {verified.returncode}")
        home = fresh(work / f"bd{t}")
        store3, _ = store_with(home, work / f"bd{t}-dist", ["1.0", "2.0"])
        flip(store3.db_path, rng, start=100)
        results = [cli(home, "cache", "list"), cli(home, "cache", "verify")]
        ok = all(no_traceback(d) and d.returncode in (0, 1) for d in results)
        try:
            for e in Store(home).list():
                Store(home).get(e.key)  # must be intact if returned at all
        except CacheError:
            pass
        db.record(ok, "; ".join(f"rc {d.returncode}: {(d.stdout + d.stderr)[-200:]}" for d in results))
    return [wheels, prov, db]


def disk_full(work: Path, trials: int, rng: random.Random) -> Row:
    row = Row("disk full at every free-space level (tmpfs 1 MiB; 0-96 KiB free in 8 KiB steps): put, list, rm, prune")
    if not can_mount():
        row.lost.append("skipped: needs root to mount a tmpfs")
        return row
    mount = fresh(work / "tmpfs")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=False).returncode:
        row.lost.append("skipped: mount failed")
        return row
    try:
        for free_kib in range(0, 97, 8):  # every level, whatever --trials says
            home = mount / "home"
            store, keys = store_with(home, work / f"df{free_kib}", ["1.0", "2.0"], padding=48 << 10)
            filler = mount / "filler"
            with filler.open("wb") as f:
                try:
                    while os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize > free_kib * 1024:
                        f.write(b"\0" * 4096)
                        f.flush()
                except OSError:
                    pass
            big = make_wheel(work / f"df{free_kib}-big", version="3.0", padding_bytes=96 << 10)
            try:
                store.put(big, inputs_for(big))
                put_ok = True
            except CacheError as exc:
                put_ok = "disk space" in exc.message or "could not be written" in exc.message
            listed = cli(home, "cache", "list")
            removed = cli(home, "cache", "rm", keys[0])
            pruned = cli(home, "cache", "prune", "--max-size", "0B")
            filler.unlink()
            ok = (put_ok and listed.returncode == 0 and removed.returncode == 0 and pruned.returncode == 0
                  and consistent(Store(home)) is None and Store(home).list() == [])
            bad = [d for d in (listed, removed, pruned) if d.returncode != 0]
            row.record(ok, f"{free_kib} KiB free: " + "; ".join(
                (d.stdout + d.stderr)[-200:] for d in bad) + ("" if put_ok else " put raised unclean"))
            for d in bad:
                if not clean_error(d):
                    row.lost.append(f"{free_kib} KiB: unclean output")
            shutil.rmtree(home, ignore_errors=True)
    finally:
        subprocess.run(["umount", str(mount)], check=False)
    return row


def relabelled_key(work: Path, trials: int, rng: random.Random) -> Row:
    row = Row("cache.db edited to relabel a torch 2.12 build as 2.13 (key no longer matches inputs)")
    for t in range(trials):
        store, keys = store_with(fresh(work / f"rk{t}"), work / f"rk{t}-dist", ["1.0"])
        with sqlite3.connect(store.db_path) as conn:
            conn.execute("UPDATE artifacts SET inputs = replace(inputs, '2.13.0', '2.12.0')")
        try:
            store.get(keys[0])
            row.record(False, "a relabelled entry was returned for install")
        except CacheError:
            row.record(store.list() == [], "still listed after refusal")
    return row
