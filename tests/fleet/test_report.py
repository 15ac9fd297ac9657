"""fleet report over saved records (pure), and its plot."""

from __future__ import annotations

from pathlib import Path

from attnforge.fleet.report import build_report, plot


def _run(node: str, kind: str, doc: object, status: str = "ok") -> dict:
    return {"node_id": node, "address": "10.0.0.1", "kind": kind, "describe": f"machine {kind}", "status": status,
            "doc": doc, "message": None if status == "ok" else "exit status 1"}


def _verify(*results: tuple[str, bool]) -> dict:
    return {"kind": "verify", "results": [{"backend": b, "ok": ok, "summary": "24 cases" if ok else "2 failed"}
                                          for b, ok in results]}


def _bench(*rows: tuple[str, str, float]) -> dict:
    return {"kind": "bench", "rows": [{"shape_class": c, "best": b,
                                       "cells": [{"backend": b, "ratio_to_baseline": r},
                                                 {"backend": "sdpa", "ratio_to_baseline": 1.0}]}
                                      for c, b, r in rows]}


def test_verdicts_winners_and_margins_per_kind(tmp_path: Path) -> None:
    verify = {"nodes": [_run("a", "k1", _verify(("flash-attn", True))), _run("b", "k1", _verify(("flash-attn", False))),
                        _run("c", "k2", _verify(("flash-attn", True))), _run("d", "k2", None, status="lost")]}
    bench = {"nodes": [_run("a", "k1", _bench(("bf16 fwd", "flash-attn", 2.0))),
                       _run("b", "k1", _bench(("bf16 fwd", "flash-attn", 3.0))),
                       _run("c", "k2", _bench(("bf16 fwd", "sdpa", 1.0)))]}
    report = build_report(verify, bench)
    verdicts = {(v.kind, v.backend): v for v in report.verdicts}
    assert not verdicts["k1", "flash-attn"].ok and verdicts["k1", "flash-attn"].summary == "2 failed"
    assert verdicts["k2", "flash-attn"].ok
    winners = {(w.kind, w.shape_class): w for w in report.winners}
    assert winners["k1", "bf16 fwd"].backend == "flash-attn" and winners["k1", "bf16 fwd"].speedup == 2.5
    assert winners["k2", "bf16 fwd"].speedup == 1.0
    assert any("lost" in p for p in report.problems)
    png = plot(report, tmp_path / "fleet.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_row_per_node_and_backend_with_version_verdict_and_best_tflops(tmp_path: Path) -> None:
    verify = {"nodes": [_run("a", "k1", {"kind": "verify", "results": [
                            {"backend": "flash-attn", "version": "2.8.3", "ok": True, "summary": "24 cases"}]}),
                        _run("b", "k1", None, status="skipped")]}
    cells = [{"backend": "flash-attn", "tflops": 310.0}, {"backend": "sdpa", "tflops": 250.0}]
    bench = {"nodes": [_run("a", "k1", {"kind": "bench", "rows": [
        {"shape_class": "bf16 fwd", "best": "flash-attn", "cells": cells},
        {"shape_class": "bf16 fwd", "best": "flash-attn", "cells": [{"backend": "flash-attn", "tflops": 330.0}]}]})]}
    report = build_report(verify, bench)
    rows = {(r.node_id, r.backend): r for r in report.nodes}
    assert set(rows) == {("a", "flash-attn"), ("a", "sdpa")}  # the skipped node has no row
    fa = rows["a", "flash-attn"]
    assert (fa.version, fa.verified, fa.tflops) == ("2.8.3", True, {"bf16 fwd": 330.0})
    assert rows["a", "sdpa"].verified is None and rows["a", "sdpa"].tflops == {"bf16 fwd": 250.0}


def test_the_plot_grows_with_its_rows(tmp_path: Path) -> None:
    def size(png: Path) -> tuple[int, int]:  # the IHDR chunk: width, height (big-endian) at bytes 16..24
        data = png.read_bytes()
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")

    def report(kinds: int):  # type: ignore[no-untyped-def]
        bench = {"nodes": [_run(f"n{i}", f"k{i}", _bench(("bf16 fwd", "flash-attn", 2.0))) for i in range(kinds)]}
        return build_report(None, bench)

    small = size(plot(report(2), tmp_path / "small.png"))
    big = size(plot(report(12), tmp_path / "big.png"))
    assert big[1] > small[1] * 2


def test_a_noisy_cell_is_never_a_nodes_best() -> None:
    """bench shows a cell beyond its noise bounds but stores it nowhere; the per-node table follows it."""
    cells = [{"backend": "flash-attn", "status": "ok", "tflops": 300.0},
             {"backend": "flash-attn", "status": "noisy", "tflops": 900.0}]
    bench = {"nodes": [_run("a", "k1", {"kind": "bench", "rows": [
        {"shape_class": "bf16 fwd", "best": "flash-attn", "cells": cells}]})]}
    (row,) = build_report(None, bench).nodes
    assert row.tflops == {"bf16 fwd": 300.0}
