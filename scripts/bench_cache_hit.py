"""Where the seconds of a cache-hit ``attnforge install`` go, against plain pip installing the same wheel.

Usage (from the repository root)::

    python3 scripts/bench_cache_hit.py [--runs 5] [--python VENV_PYTHON] [--work DIR]

Without ``--python`` it makes a venv (``python3 -m venv`` plus ``pip install torch`` and attnforge's own
dependencies, from whatever index pip is configured for) under ``--work``. attnforge runs *in* that venv (with
``PYTHONPATH=src``), as ``attnforge install`` installs into the interpreter it runs in.

The stand-in for the GPU machine's environment: pure-Python wheels whose modules ``import torch`` as the real
ones do (so probing them costs what it costs there): the requested ``flash-attn-4`` (``flash_attn.cute``) and two
installed neighbours (``sageattention`` 1.x, ``xformers``). The first install (``--find-links``) puts the wheel in
a fresh ``ATTNFORGE_HOME``; then, ``--runs`` times, as the H200 run did (``scripts/gpu/13-verify-bench.sh``, now
``scripts/gpu/run.sh cachehit``):

* ``attnforge``: ``pip uninstall -y flash-attn-4`` (not timed), then ``attnforge install flash-attn-4 --arch 9.0
  --offline --no-verify --json`` (timed; asserted to be a ``cache-hit``);
* ``pip``: ``pip uninstall -y flash-attn-4`` (not timed), then ``pip install --no-deps --no-index
  --force-reinstall <the cached wheel>`` (timed);
* ``pip (over it)``: the same pip command with the wheel installed (timed).

It prints the medians as a Markdown table, attnforge's own step timings, and every subprocess of one traced
cache-hit install (argv and seconds, through the runner seam).
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
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from tests.cache.wheelmaker import make_wheel  # noqa: E402

IMPORTS_TORCH = b"import torch\n"
#: Run in the venv instead of ``-m attnforge``: the same CLI, with every runner subprocess timed on stderr.
TRACE = """
import sys, time
from attnforge._system import runner
real = runner.SubprocessRunner.run
def run(self, argv, **kw):
    start = time.perf_counter()
    done = real(self, argv, **kw)
    text = " ".join(str(a) for a in argv).replace(chr(10), " ")
    print(f"TRACE {time.perf_counter() - start:.3f} {text[:110]}", file=sys.stderr)
    return done
runner.SubprocessRunner.run = run
from attnforge.cli import run as main
sys.argv[0] = "attnforge"
main()
"""


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{done.stdout}\n{done.stderr}")
    return elapsed, done


def make_venv(work: Path) -> str:
    python = work / "venv" / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(work / "venv")], check=True)
        deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
        subprocess.run([str(python), "-m", "pip", "install", "-q", "torch", *deps], check=True)
    return str(python)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--python", default=None, help="a venv interpreter with torch and attnforge's deps")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="af-cache-hit-"))
    work.mkdir(parents=True, exist_ok=True)
    python = args.python or make_venv(work)
    wheels = work / "wheels"
    make_wheel(wheels, name="flash-attn-4", version="4.0.0b36", padding_bytes=300_000,
               extra_files={"flash_attn/cute/__init__.py": IMPORTS_TORCH})
    neighbours = [
        make_wheel(work / "others", name="sageattention", version="1.0.6",
                   extra_files={"sageattention/__init__.py": IMPORTS_TORCH}),
        make_wheel(work / "others", name="xformers", version="0.0.30",
                   extra_files={"xformers/__init__.py": IMPORTS_TORCH, "xformers/ops.py": IMPORTS_TORCH}),
    ]
    home = work / "home"
    env = dict(os.environ, ATTNFORGE_HOME=str(home), PYTHONPATH=str(REPO / "src"), PYTHONWARNINGS="ignore")
    pip = [python, "-m", "pip"]
    uninstall = [*pip, "uninstall", "-y", "-q", "flash-attn-4"]
    timed([*pip, "install", "-q", "--no-deps", "--no-index", *map(str, neighbours)], env)
    timed(uninstall, env)  # a leftover install would be "already installed", not a fetch into the cache
    first = [python, "-m", "attnforge", "install", "flash-attn-4", "--arch", "9.0", "--offline", "--no-verify",
             "--json"]
    doc = json.loads(timed([*first, "--find-links", str(wheels)], env)[1].stdout)
    cached = doc["artifact"]
    again = [python, "-c", TRACE, *first[3:]]
    pip_cmd = [*pip, "install", "--no-deps", "--no-index", "--force-reinstall", "--quiet", cached]
    rows: dict[str, list[float]] = {"pip install (after uninstall)": [], "pip install --force-reinstall (over it)": [],
                                    "attnforge install (cache hit, after uninstall)": []}
    steps: dict[str, list[float]] = {}
    trace: list[str] = []
    for _ in range(args.runs):
        timed(uninstall, env)
        rows["pip install (after uninstall)"].append(timed(pip_cmd, env)[0])
        rows["pip install --force-reinstall (over it)"].append(timed(pip_cmd, env)[0])
        timed(uninstall, env)
        elapsed, done = timed(again, env)
        rows["attnforge install (cache hit, after uninstall)"].append(elapsed)
        doc = json.loads(done.stdout)
        assert doc["action"] == "cache-hit", doc["action"]
        for k, v in doc["timings_s"].items():
            steps.setdefault(k, []).append(v)
        trace = [ln.removeprefix("TRACE ") for ln in done.stderr.splitlines() if ln.startswith("TRACE ")]
    torch = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                           text=True, env=env, check=False).stdout.strip()
    print(f"python: {python}, torch {torch}, runs: {args.runs}, cores: {os.cpu_count()}, "
          f"load average: {os.getloadavg()[0]:.1f}")
    print("| what | median s | min s | max s |")
    print("|---|---|---|---|")
    table = [*rows.items(), *((f"- attnforge step `{k}`", v) for k, v in steps.items())]
    for label, values in table:
        print(f"| {label} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")
    over = statistics.median(rows["attnforge install (cache hit, after uninstall)"]) - statistics.median(
        rows["pip install (after uninstall)"])
    print(f"| **attnforge over pip** | **{over:.2f}** | | |")
    print(f"\nsubprocesses of the last cache-hit install ({len(trace)}), seconds and argv:")
    for line in trace:
        print(f"    {line}")


if __name__ == "__main__":
    main()
