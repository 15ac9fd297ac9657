"""Every failure pattern runs in linear time: a 200k-character log line without spaces is read in milliseconds.

Python's ``re`` backtracks: ``[^\\s:()]+\\.cu`` tried from every character of one long run rescans the run each
time (quadratic), and ``attnforge diagnose`` (or a failed build diagnosing its own log) hung on such a line. The
searches run in a child process with a deadline, so a regression fails the test instead of hanging it: ``re``
holds the GIL for a whole search, so no thread or signal could stop it here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.diagnose.test_diagnose import EXAMPLES

LINE_CHARS = 200_000
#: Runs of one unit each: letters, slashes, colons and the mixes a path or a compiler location is made of.
UNITS = ("a", "/", "a/", ":", "a:", "a.", "a:/", "a:\\", " ", "\t", "=/", "(", "'", "a.cu", "a.cu:1", "a.cu(",
         "x.cu(1)", "C:/a b", "a.cu:1: ", "aaaa/bbbb:cccc ")
#: Seconds for all of it; before the fix one pattern took minutes on one such line.
BOUND_S = 2.0
DEADLINE_S = 120

_CHILD = """
import json, sys, time
from attnforge.catalog.failures import load_failures
units, n = json.load(sys.stdin)
lines = [(u * (n // len(u) + 1))[:n] for u in units]
times = []
for sig in load_failures().signatures:
    for pattern in (*sig.patterns, *sig.context):
        for unit, line in zip(units, lines):
            start = time.perf_counter()
            pattern.search(line)
            times.append((time.perf_counter() - start, sig.id, pattern.pattern, unit))
times.sort(reverse=True)
print(json.dumps({"total_s": sum(t[0] for t in times), "worst": times[:5], "searches": len(times)}))
"""


def _search_all(units: list[str], n: int, env: dict[str, str]) -> dict[str, object]:
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps([units, n]), capture_output=True,
                              text=True, env=env, timeout=DEADLINE_S, check=True)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a failure pattern backtracks catastrophically: {len(units)} lines of {n} characters took "
                    f"over {DEADLINE_S} s")
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_every_catalog_pattern_reads_a_long_line_in_linear_time(cli_env: dict[str, str]) -> None:
    result = _search_all(list(UNITS), LINE_CHARS, cli_env)
    assert result["searches"] > 60 * len(UNITS)
    assert float(result["total_s"]) < BOUND_S, f"slowest (seconds, signature, pattern, unit): {result['worst']}"


def _example_units() -> list[str]:
    """The start of each signature's real error line, repeated: a literal the pattern looks for, many times over
    on one line and never completed (``.*`` between two literals rescans the rest of the line per occurrence)."""
    out = []
    for _, text in EXAMPLES:
        for line in text.splitlines():
            line = line.strip()  # noqa: PLW2901
            out.append(line[: len(line) // 2])
    return out


def test_every_catalog_pattern_reads_its_own_words_repeated_in_linear_time(cli_env: dict[str, str]) -> None:
    """Repeated literals: the Windows file's ``compiled_autograd\\.h.*error C2872`` is still quadratic in them (not
    fixed here), so the line is 40k characters: a quadratic pattern takes seconds, a linear one milliseconds."""
    result = _search_all(_example_units(), 40_000, cli_env)
    assert float(result["total_s"]) < BOUND_S, f"slowest (seconds, signature, pattern, unit): {result['worst']}"


@pytest.mark.parametrize("unit", [pytest.param(u, id=repr(u)) for u in ("a.cu", "a/", ":", "x.cu(1)", "=/")])
def test_diagnose_cli_reads_a_log_of_long_lines_fast(
    unit: str, tmp_path: Path, cli_env: dict[str, str], attnforge_argv: list[str]
) -> None:
    """The whole command (extraction, the log's own facts, the signatures) on a failed build whose lines are
    200k characters without a space: it answers, and says that it read each long line's ends only."""
    line = (unit * (LINE_CHARS // len(unit) + 1))[:LINE_CHARS]
    log = tmp_path / "long.log"
    log.write_text(f"FAILED: x.o\n{line}\n{line}\nninja: build stopped: subcommand failed.\n", encoding="utf-8")
    snapshot = Path(__file__).resolve().parents[1] / "fixtures" / "snapshots" / "cpu_dev_torch2.13_cpu.json"
    start = time.perf_counter()
    try:
        done = subprocess.run([*attnforge_argv, "diagnose", str(log), "--snapshot", str(snapshot), "--json"],
                              capture_output=True, text=True, env=cli_env, timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"attnforge diagnose hung on a log of {LINE_CHARS}-character lines of {unit!r}")
    assert time.perf_counter() - start < 30
    assert done.returncode == 1, done.stderr  # unrecognised, as documented
    doc = json.loads(done.stdout)
    assert doc["known"] is False
    assert any("2 line(s) longer than 32 KiB" in note for note in doc["notes"])
    assert all(len(ev["text"]) < 40_000 for ev in doc["evidence"])
