"""Time a cache-hit ``attnforge install`` of the fixture extension against pip's own time for the same wheel.

Usage (from the repository root)::

    python3 scripts/bench_cache_install.py [--runs 7] [--home DIR]

It builds ``tests/fixtures/ext_pkg`` once into a cache (or reuses ``--home`` if it already holds it), makes a
fresh venv (``--system-site-packages``, so the system torch is used), then alternates, ``--runs`` times:

* ``pip``: ``python -m pip install --no-deps --no-index --force-reinstall --quiet <cached wheel>``
* ``attnforge``: ``python -m attnforge install af-ext-fixture --source tests/fixtures/ext_pkg --no-verify
  --json`` (probe, plan, hash check, the same pip command, torch before/after checks)

and prints the medians and attnforge's overhead on top of pip as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from tests.install.fixture_build import EXT_PKG, build_fixture_into  # noqa: E402

from attnforge.cache import Store  # noqa: E402


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{done.stdout}\n{done.stderr}")
    return elapsed, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--home", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="af-bench-"))
    home = args.home or work / "home"
    store = Store(home)
    entries = [e for e in store.list() if e.name == "af-ext-fixture"]
    if entries:
        entry = entries[0]
    else:
        start = time.perf_counter()
        entry = build_fixture_into(store)
        print(f"built the fixture in {time.perf_counter() - start:.1f} s")
    wheel = store.get(entry.key)
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(work / "venv")
    python = str(work / "venv" / "bin" / "python")
    env = dict(os.environ, ATTNFORGE_HOME=str(home), PYTHONPATH=str(REPO / "src"))
    pip_cmd = [python, "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall",
               "--disable-pip-version-check", "--no-input", "--quiet", str(wheel)]
    af_cmd = [python, "-m", "attnforge", "install", "af-ext-fixture", "--source", str(EXT_PKG), "--no-verify",
              "--json"]
    timed(af_cmd, env)  # warm the page cache and the venv's bytecode
    pip_s: list[float] = []
    af_s: list[float] = []
    steps: dict[str, list[float]] = {}
    for _ in range(args.runs):
        pip_s.append(timed(pip_cmd, env)[0])
        elapsed, out = timed(af_cmd, env)
        af_s.append(elapsed)
        doc = json.loads(out)
        assert doc["action"] == "cache-hit", doc["action"]
        for k, v in doc["timings_s"].items():
            steps.setdefault(k, []).append(v)
    med_pip, med_af = statistics.median(pip_s), statistics.median(af_s)
    print(f"wheel: {entry.filename} ({entry.size_bytes / 1e6:.2f} MB), runs: {args.runs}, "
          f"cores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}")
    print("| what | median s | min s | max s |")
    print("|---|---|---|---|")
    rows = [("pip install of the cached wheel", pip_s), ("attnforge install (cache hit, --no-verify)", af_s)]
    rows += [(f"- step `{k}` (inside attnforge)", v) for k, v in steps.items()]
    for label, values in rows:
        print(f"| {label} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")
    print(f"| **overhead on top of pip** | **{med_af - med_pip:.2f}** | | |")


if __name__ == "__main__":
    main()
