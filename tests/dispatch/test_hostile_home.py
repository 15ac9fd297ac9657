"""attention() from a hostile ATTNFORGE_HOME (issue 31 item 1): it serves exactly as from an empty home (plain
SDPA on CPU, bit for bit), warns once with the cause and the fix, and never raises; measurements it cannot
store are kept in the process.

The homes are real files (tests/hostile_homes.py). The read-only home of another user is made real too: the
home is chmod 0555 and the check runs in a child without root's CAP_DAC_OVERRIDE (``setpriv``), so the kernel
refuses its writes as it would a colleague's; skipped where that is not possible.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from attnforge.dispatch import runtime, state
from attnforge.records import BenchRecord
from tests import hostile_homes
from tests.hostile_homes import DAMAGED, HOMES, OTHER_DEVICE

SRC = Path(__file__).resolve().parents[2] / "src"
_NO_DAC = "-dac_override,-dac_read_search,-fowner"


@pytest.fixture(autouse=True)
def fresh_runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A new process-wide dispatcher (it opens the records of this test's home) and no warning given yet."""
    monkeypatch.setattr(state, "_WARNED", set())
    previous = runtime.set_dispatcher(runtime.Dispatcher())
    yield
    runtime.set_dispatcher(previous)


def _calls() -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(2, 4, 33, 16, generator=g), torch.randn(2, 4, 33, 16, generator=g),
             torch.randn(2, 4, 33, 16, generator=g)),
            (torch.randn(1, 8, 17, 32, generator=g), torch.randn(1, 8, 40, 32, generator=g),
             torch.randn(1, 8, 40, 32, generator=g))]


def _serve_all() -> list[warnings.WarningMessage]:
    import attnforge

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for q, k, v in _calls():
            mask = torch.rand(q.shape[0], 1, q.shape[2], k.shape[2], generator=torch.Generator().manual_seed(4)) > 0.3
            for _ in range(2):  # the second call takes the remembered route (the remembered plan, with a mask)
                got = attnforge.attention(q, k, v, layout="bhsd")
                assert torch.equal(got, torch.nn.functional.scaled_dot_product_attention(q, k, v))
                got = attnforge.attention(q, k, v, attn_mask=mask)
                assert torch.equal(got, torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    return [w for w in caught if issubclass(w.category, state.StateWarning)]


@pytest.mark.parametrize("case", sorted(HOMES))
def test_attention_from_a_hostile_home_equals_sdpa_and_warns_at_most_once(
        case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNFORGE_HOME", str(HOMES[case](tmp_path / "home")))
    found = _serve_all()
    if case in DAMAGED:
        assert len(found) == 1, [str(w.message) for w in found]
        text = str(found[0].message)
        assert "records.db" in text or "attnforge home" in text, text
        assert "Fix:" in text and "empty home" in text, text
    else:
        assert found == []


@pytest.mark.parametrize("case", sorted(HOMES))
def test_first_use_measurements_that_cannot_be_stored_are_kept_in_the_process(
        case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNFORGE_HOME", str(HOMES[case](tmp_path / "home")))
    records = state.runtime_records()
    rec = BenchRecord(device_key="cpu|torch-x", backend="sdpa", backend_version=None, dtype="float32",
                      mode="fwd", causal=False, batch=1, heads_q=2, heads_kv=2, head_dim=16, seqlen_q=8,
                      seqlen_k=8, ms=1.0, tflops=1.0, peak_mem_bytes=None, run_id="t")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records.add_bench([rec])  # the write autotune.tune makes after a first-use measurement
        records.add_bench([dataclasses.replace(rec, seqlen_q=16, seqlen_k=16)])  # another shape: read back too
        got = records.bench_records("cpu|torch-x")
    assert [(r.backend, r.seqlen_q) for r in got] == [("sdpa", 8), ("sdpa", 16)]  # stored or kept: never lost
    assert len([w for w in caught if issubclass(w.category, state.StateWarning)]) <= 1


def test_a_locked_records_db_is_waited_for_briefly_then_served_around(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with hostile_homes.locked(tmp_path / "home") as home:
        monkeypatch.setenv("ATTNFORGE_HOME", str(home))
        found = _serve_all()
    assert len(found) == 1 and "locked" in str(found[0].message)


def test_the_dispatcher_reads_its_records_through_the_never_raising_view() -> None:
    assert isinstance(runtime.get_dispatcher()._source(), state.RuntimeRecords)


_CHILD = """
import json, os, sys, warnings, torch
import attnforge
from attnforge.dispatch import runtime
from attnforge.records import BenchRecord
q = torch.randn(1, 2, 9, 16)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = attnforge.attention(q, q, q, layout="bhsd")
    source = runtime.get_dispatcher()._source()
    verified = source.latest_verify(sys.argv[1])
    rec = BenchRecord(device_key=sys.argv[1], backend="sdpa", backend_version=None, dtype="float32", mode="fwd",
                      causal=False, batch=1, heads_q=2, heads_kv=2, head_dim=16, seqlen_q=8, seqlen_k=8, ms=1.0,
                      tflops=1.0, peak_mem_bytes=None, run_id="child")
    source.add_bench([rec])
    source.add_bench([rec])
print(json.dumps({
    "equal": bool(torch.equal(out, torch.nn.functional.scaled_dot_product_attention(q, q, q))),
    "verified": sorted(verified), "bench": len(source.bench_records(sys.argv[1])),
    "warnings": [str(w.message) for w in caught if w.category.__name__ == "StateWarning"],
    "can_write": os.access(os.environ["ATTNFORGE_HOME"], os.W_OK)}))
"""


@pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to act as a user that file permissions apply to")
def test_a_shared_read_only_home_is_read_and_its_writes_are_kept_in_the_process(tmp_path: Path) -> None:
    home = tmp_path / "home"
    db = hostile_homes._sound(home, rows=5)
    before = {p.name: p.stat().st_mtime_ns for p in home.iterdir()}
    for path in (home, db):
        path.chmod(0o555 if path.is_dir() else 0o444)
    env = {**os.environ, "ATTNFORGE_HOME": str(home), "PYTHONPATH": str(SRC)}
    done = subprocess.run(["setpriv", f"--bounding-set={_NO_DAC}", f"--inh-caps={_NO_DAC}", sys.executable,
                           "-c", _CHILD, OTHER_DEVICE], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["can_write"] is False  # the kernel really refuses this child's writes
    assert got["equal"] is True
    assert got["verified"] == ["sdpa-math"]  # a read-only home is still read
    assert got["bench"] == 5 + 2  # the stored rows, and the two this process could not store
    assert len(got["warnings"]) == 1 and "kept in this process" in got["warnings"][0], got["warnings"]
    assert {p.name: p.stat().st_mtime_ns for p in home.iterdir()} == before  # nothing was written


@pytest.mark.parametrize("column", ["layout", "features", "mode", "tflops", "ms", "ms_lo", "ms_mad", "seqlen_q",
                                    "rounds"])
def test_a_row_with_a_value_no_release_writes_is_damage_not_a_crash(
        column: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bench row of this device whose layout, feature or mode no release writes, or a text in a numeric column
    (SQLite keeps any value in any column; a hand-edited or damaged file), used to pass the read and raise inside a
    decision (``ValueError: 'zzz' is not a valid Layout``, ``TypeError: '>' not supported between instances of 'str'
    and 'int'``), i.e. inside attention(). It is now the damage it is: one warning, and attention() serves as from
    an empty home."""
    from attnforge.errors import CacheError
    from attnforge.records import RecordStore, device_key

    store = RecordStore(tmp_path / "home")
    good = BenchRecord(device_key=device_key("cpu", None, torch.__version__), backend="sdpa-math",
                       backend_version=None, dtype="float32", mode="fwd", causal=False, batch=2, heads_q=4,
                       heads_kv=4, head_dim=16, seqlen_q=33, seqlen_k=33, ms=1.0, tflops=99.0,
                       peak_mem_bytes=None, run_id="r", ms_lo=0.9, ms_hi=1.1, ms_mad=0.01)
    store.add_bench([good])
    with contextlib.closing(sqlite3.connect(store.path)) as conn, conn:
        conn.execute(f"UPDATE bench SET {column} = 'zzz'")  # noqa: S608 - a test's constant column name
    with pytest.raises(CacheError, match="cannot be read"):
        store.bench_records(good.device_key)
    monkeypatch.setenv("ATTNFORGE_HOME", str(tmp_path / "home"))
    found = _serve_all()
    assert len(found) == 1 and "cannot be read" in str(found[0].message), [str(w.message) for w in found]


@pytest.mark.parametrize("details", ["[1, 2]", "null", '{"failed_features": 5}', "not json"])
def test_a_verify_row_whose_details_are_not_what_a_release_writes_is_damage(
        details: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dispatcher reads a verify record's ``details`` (its failed features) inside a decision: details that are
    valid JSON but not a mapping, or failed features that are not a list, raised there (AttributeError, TypeError)
    as a broken layout did (above). They are damage now, as unparsable JSON was."""
    from attnforge.records import RecordStore, VerifyRecord, device_key

    store = RecordStore(tmp_path / "home")
    store.add_verify(VerifyRecord(device_key=device_key("cpu", None, torch.__version__), backend="flex",
                                  backend_version=None, ok=True, summary="ok", details={"failed_features": []}))
    with contextlib.closing(sqlite3.connect(store.path)) as conn, conn:
        conn.execute("UPDATE verify SET details = ?", (details,))
    monkeypatch.setenv("ATTNFORGE_HOME", str(tmp_path / "home"))
    found = _serve_all()
    assert len(found) == 1 and "cannot be read" in str(found[0].message), [str(w.message) for w in found]


def test_attention_serves_from_a_home_whose_records_db_a_newer_attnforge_wrote(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A newer attnforge's records.db (a team home, an older venv beside a newer one) is not damage: attention()
    serves exactly as SDPA, warns once with the upgrade fix (not `cache repair`, which would move the newer
    release's records aside), and its first-use records are kept in the process, never written into that file."""
    from attnforge.records import SCHEMA_VERSION

    home = HOMES["records-newer-schema"](tmp_path / "home")
    before = (home / "records.db").read_bytes()
    monkeypatch.setenv("ATTNFORGE_HOME", str(home))
    found = _serve_all()
    records = state.runtime_records()
    rec = BenchRecord(device_key="cpu|torch-x", backend="sdpa", backend_version=None, dtype="float32", mode="fwd",
                      causal=False, batch=1, heads_q=2, heads_kv=2, head_dim=16, seqlen_q=8, seqlen_k=8, ms=1.0,
                      tflops=1.0, peak_mem_bytes=None, run_id="t")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records.add_bench([rec])
        assert [r.run_id for r in records.bench_records("cpu|torch-x")] == ["t"]  # kept in the process
    assert not [w for w in caught if issubclass(w.category, state.StateWarning)]  # warned once per process
    assert len(found) == 1, [str(w.message) for w in found]
    text = str(found[0].message)
    assert f"written by a newer attnforge (schema 99; this one reads up to {SCHEMA_VERSION})" in text, text
    assert "pip install -U attnforge" in text and "cache repair" not in text and "damaged" not in text, text
    assert (home / "records.db").read_bytes() == before
    assert sorted(p.name for p in home.iterdir()) == ["records.db"]
