"""Faults at the edges: killed builds, hostile imports, a second user on a shared export dir, concurrent
installs into one venv."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import venv
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
from common import (
    REPO,
    SRC,
    Row,
    Store,
    clean_error,
    cli,
    fresh,
    is_root_with_setpriv,
    make_wheel,
    store_with,
)

from attnforge.cache._files import sha256_file
from attnforge.cache._provenance import MAX_PROVENANCE_BYTES, MAX_WHEEL_BYTES
from attnforge.cache.share import export

_TREE = """
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(3)]
open(sys.argv[1], "w").write(" ".join(str(k.pid) for k in kids))
time.sleep(120)
"""
_BUILD = textwrap.dedent(
    """
    import os, sys
    sys.path[:0] = [{src!r}]
    from pathlib import Path
    from attnforge.build.progress import NullReporter
    from attnforge.build.stream import run_streamed
    with open(sys.argv[2], "w") as log:
        run_streamed([sys.executable, "-c", {tree!r}, sys.argv[1]], cwd=Path.cwd(), env=dict(os.environ),
                     log=log, reporter=NullReporter())
    """
)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def sigkill_builds(work: Path, trials: int, rng: random.Random) -> Row:
    row = Row("SIGKILL of a build at a random time (a compiler tree of 3 processes running)")
    for t in range(trials):
        pids = fresh(work / f"kb{t}") / "pids"
        code = _BUILD.format(src=str(SRC), tree=_TREE)
        proc = subprocess.Popen([sys.executable, "-c", code, str(pids), str(work / f"kb{t}" / "log")])
        while not (pids.exists() and pids.read_text().strip()):
            time.sleep(0.05)
        time.sleep(rng.uniform(0.2, 1.5))
        proc.kill()
        proc.wait()
        kids = [int(p) for p in pids.read_text().split()]
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in kids) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [p for p in kids if _alive(p)]
        for p in left:
            os.kill(p, signal.SIGKILL)
        row.record(not left, f"{len(left)} orphaned compiler processes")
    return row


def _export(work: Path, name: str) -> tuple[Path, Path]:
    store, _ = store_with(fresh(work / f"{name}-src"), work / f"{name}-dist", ["1.0"])
    out = work / f"{name}-out"
    shutil.rmtree(out, ignore_errors=True)
    export(store, out)
    (entry,) = (out / "artifacts").iterdir()
    return out, entry


def _hostile(entry: Path, kind: str, secret: Path) -> None:
    wheel = next(entry.glob("*.whl"))
    doc_path = entry / "provenance.json"
    if kind == "symlinked build.log":
        (entry / "build.log").symlink_to(secret)
    elif kind == "symlinked wheel":
        real = entry.parent.parent / "real.whl"
        shutil.move(wheel, real)
        wheel.symlink_to(real)
    elif kind == "symlinked entry dir":
        real = entry.parent.parent / "real-entry"
        shutil.move(entry, real)
        entry.symlink_to(real)
    elif kind == "../ file name":
        doc = json.loads(doc_path.read_text())
        doc["filename"] = "../../evil.whl"
        doc_path.write_text(json.dumps(doc))
    elif kind == "../ zip member":
        with zipfile.ZipFile(wheel, "a") as zf:
            zf.writestr("../../evil.pth", "import os\n")
        doc = json.loads(doc_path.read_text())
        doc["sha256"] = sha256_file(wheel)
        doc_path.write_text(json.dumps(doc))
    elif kind == "huge sparse wheel":
        with wheel.open("r+b") as f:
            f.truncate(MAX_WHEEL_BYTES + 1)
    elif kind == "huge provenance.json":
        with doc_path.open("ab") as f:
            f.truncate(MAX_PROVENANCE_BYTES + 1)
    elif kind == "bad JSON":
        doc_path.write_text("{not json")


HOSTILE = ["symlinked build.log", "symlinked wheel", "symlinked entry dir", "../ file name", "../ zip member",
           "huge sparse wheel", "huge provenance.json", "bad JSON"]


def hostile_imports(work: Path, trials: int, rng: random.Random) -> Row:
    row = Row("hostile imports: " + ", ".join(HOSTILE))
    secret = work / "secret"
    secret.write_text("private key\n")
    os.chmod(secret, 0o600)
    for t in range(trials):
        for kind in HOSTILE:
            out, entry = _export(work, f"hi{t}")
            _hostile(entry, kind, secret)
            home = fresh(work / f"hi{t}-home")
            done = cli(home, "cache", "import", str(out))
            leaked = any("private key" in p.read_text(errors="replace") for p in home.rglob("*")
                         if p.is_file() and p.stat().st_size < 1 << 20)
            ok = (done.returncode == 1 and "rejected" in done.stdout and Store(home).list() == [] and not leaked
                  and "Traceback" not in done.stdout + done.stderr)
            row.record(ok, f"{kind}: rc {done.returncode} leaked={leaked} {done.stdout[-200:]}")
    return row


def shared_export_dir(work: Path, trials: int, rng: random.Random) -> Row:
    row = Row("second user on a shared export dir: planted symlinks (old temp names, index, simple/) and a "
              "stale lock of another user")
    for t in range(trials):
        store, _ = store_with(fresh(work / f"se{t}"), work / f"se{t}-dist", ["1.0"])
        victim = work / f"se{t}-bashrc"
        victim.write_text("mine\n")
        dest = fresh(work / f"se{t}-shared")
        (dest / "simple").mkdir()
        (dest / "simple" / "index.html").symlink_to(victim)
        for pid in range(os.getpid(), os.getpid() + 2000):
            (dest / "simple" / f".index.html.tmp-{pid}").symlink_to(victim)
        first = cli(store.root, "cache", "export", str(dest))
        ok = first.returncode == 0 and victim.read_text() == "mine\n"
        dest2 = fresh(work / f"se{t}-shared2")
        (dest2 / "simple").symlink_to(victim.parent)
        second = cli(store.root, "cache", "export", str(dest2))
        ok = ok and clean_error(second) and victim.read_text() == "mine\n"
        if is_root_with_setpriv():
            dest3 = fresh(work / f"se{t}-shared3")
            lock = dest3 / ".attnforge-export.lock"
            lock.write_text("")
            os.chown(lock, 65534, 65534)
            os.chmod(lock, 0o600)
            third = cli(store.root, "cache", "export", str(dest3), unprivileged=True, timeout=60)
            ok = ok and clean_error(third) and "lock" in third.stderr
        row.record(ok, f"rc {first.returncode}/{second.returncode}; victim {victim.read_text()!r}")
    return row


_INSTALL = textwrap.dedent(
    """
    import sys
    sys.path[:0] = [{src!r}, {repo!r}]
    from pathlib import Path
    from attnforge._system.runner import SubprocessRunner
    from attnforge.cache import Store
    from attnforge.install.flow import install
    from attnforge.probe.snapshot import SystemSnapshot
    from attnforge.resolve.types import Request
    from tests.install.helpers import OrderedPlanner, pip_wheel_builder
    snap = SystemSnapshot.load(Path({repo!r}) / "tests/fixtures/snapshots/cpu_dev_torch2.13_cpu.json")
    install(Request(backend="af-pure-fixture"), snapshot=snap, store=Store(Path(sys.argv[1])),
            planner=OrderedPlanner(find_links=Path(sys.argv[3])), builder=pip_wheel_builder, verifier=None,
            runner=SubprocessRunner(), python=sys.argv[2])
    """
)


def concurrent_installs(work: Path, trials: int, rng: random.Random) -> Row:
    row = Row("8 concurrent installs into one venv")
    code = _INSTALL.format(src=str(SRC), repo=str(REPO))
    for t in range(trials):
        base = fresh(work / f"ci{t}")
        links = base / "links"
        make_wheel(links, value=t + 5)
        venv.EnvBuilder(system_site_packages=True, with_pip=False).create(base / "venv")
        python = str(base / "venv" / "bin" / "python")

        def one(_: int, python: str = python, base: Path = base, links: Path = links) -> int:
            return subprocess.run([sys.executable, "-c", code, str(base / "home"), python, str(links)],
                                  capture_output=True, timeout=600, check=False).returncode

        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(one, range(8)))
        value = subprocess.run([python, "-c", "import af_pure_fixture as m; print(m.VALUE)"], capture_output=True,
                               text=True, check=False).stdout.strip()
        row.record(codes == [0] * 8 and value == str(t + 5), f"exit codes {codes}, imported {value!r}")
    return row


def readonly_home(work: Path, trials: int, rng: random.Random) -> Row:
    row = Row("read-only ATTNFORGE_HOME (another user): list, export, verify work; prune says why not")
    if not is_root_with_setpriv():
        row.lost.append("skipped: needs root and setpriv")
        return row
    for t in range(trials):
        store, _ = store_with(fresh(work / f"ro{t}"), work / f"ro{t}-dist", ["1.0", "2.0"])
        paths = [store.root, *store.root.rglob("*")]
        for p in paths:
            os.chmod(p, 0o555 if p.is_dir() else 0o444)
        try:
            listed = cli(store.root, "cache", "list", "--json", unprivileged=True)
            exported = cli(store.root, "cache", "export", str(work / f"ro{t}-out"), unprivileged=True)
            verified = cli(store.root, "cache", "verify", unprivileged=True)
            pruned = cli(store.root, "cache", "prune", "--max-size", "0B", unprivileged=True)
        finally:
            for p in paths:
                os.chmod(p, 0o755 if p.is_dir() else 0o644)
        ok = (listed.returncode == 0 and len(json.loads(listed.stdout)["entries"]) == 2
              and exported.returncode == 0 and verified.returncode == 0 and clean_error(pruned)
              and len(Store(store.root).list()) == 2)
        row.record(ok, f"rc list {listed.returncode} export {exported.returncode} verify {verified.returncode} "
                       f"prune {pruned.returncode}")
    return row
