"""The one "fastest" rule (attnforge.ranking): exact shape class, latest run wins, ties (no lead beyond the noise
margin) go to the lower-overhead path, restricted to allowed backends. Noise cases of issue 22: test_noise_rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnforge.ranking import Measurement, beats, fastest, overhead_tier, rank, wins_per_backend
from attnforge.records import BenchRecord
from attnforge.types.shapes import AttentionShape, Mode, ShapeClass


def rec(backend: str, seqlen: int, tflops: float, *, head_dim: int = 128, causal: bool = False,
        mode: str = "fwd", run: str = "r1", spread: float = 0.0) -> BenchRecord:
    """A record of 1 ms median whose rounds lie ``spread`` (relative) either side of it."""
    return BenchRecord(device_key="k", backend=backend, backend_version=None, dtype="bfloat16", mode=mode,
                       causal=causal, batch=16384 // seqlen, heads_q=16, heads_kv=16, head_dim=head_dim,
                       seqlen_q=seqlen, seqlen_k=seqlen, ms=1.0, tflops=tflops, peak_mem_bytes=None,
                       run_id=run, ms_lo=1.0 - spread if spread else None, ms_hi=1.0 + spread if spread else None)


# numbers from tests/fixtures/h200_bench_2026-11-21.json (cuDNN wins fwd 1k; FA4 wins at 4k and 16k)
RECORDS = [
    rec("sdpa-cudnn", 1024, 574.1), rec("flash-attn", 1024, 346.8), rec("flash-attn-4", 1024, 547.1),
    rec("sdpa-cudnn", 4096, 615.3), rec("flash-attn", 4096, 368.9), rec("flash-attn-4", 4096, 644.1),
    rec("sdpa-cudnn", 16384, 621.9), rec("flash-attn-4", 16384, 676.5),
    rec("sdpa-cudnn", 1024, 286.8, causal=True, mode="fwd+bwd"), rec("flash-attn-4", 1024, 309.0, causal=True,
                                                                      mode="fwd+bwd"),
]


def cls(seqlen: int, *, head_dim: int = 128, causal: bool = False, mode: Mode = Mode.FWD) -> ShapeClass:
    return ShapeClass.of(AttentionShape(batch=1, heads_q=16, heads_kv=16, head_dim=head_dim, seqlen_q=seqlen,
                                        seqlen_k=seqlen, causal=causal, mode=mode, dtype="bfloat16"))


@pytest.mark.parametrize(("shape", "among", "want"), [
    pytest.param(cls(1024), None, "sdpa-cudnn", id="measured-1k"),
    pytest.param(cls(4096), None, "flash-attn-4", id="measured-4k"),
    pytest.param(cls(3000), None, "flash-attn-4", id="same-bucket-as-4k"),
    pytest.param(cls(100_000), None, None, id="beyond-the-grid-is-unmeasured"),
    pytest.param(cls(4096), {"sdpa-cudnn", "flash-attn"}, "sdpa-cudnn", id="only-verified"),
    pytest.param(cls(1024, head_dim=96), None, None, id="other-head-dim-is-unmeasured"),
    pytest.param(cls(1024, causal=True, mode=Mode.FWD_BWD), None, "flash-attn-4", id="training"),
    pytest.param(cls(1024, causal=True), None, None, id="never-measured"),
    pytest.param(cls(1024), {"xformers"}, None, id="nothing-allowed"),
])
def test_fastest(shape: ShapeClass, among: set[str] | None, want: str | None) -> None:
    assert fastest(RECORDS, shape, among).winner == want


def test_a_later_run_overrides_an_earlier_one() -> None:
    later = [*RECORDS, rec("flash-attn", 1024, 900.0, run="r2"), rec("flash-attn", 1024, 100.0, run="r3")]
    assert fastest(later, cls(1024)).winner == "sdpa-cudnn"
    assert fastest([*RECORDS, rec("flash-attn", 1024, 900.0, run="r2")], cls(1024)).winner == "flash-attn"


def m(name: str, tflops: float, spread: float = 0.0) -> Measurement:
    return Measurement(backend=name, tflops=tflops, tflops_lo=tflops * (1 - spread), tflops_hi=tflops * (1 + spread),
                       noise=spread)


@pytest.mark.parametrize(("cands", "winner", "tied"), [
    pytest.param([m("sdpa", 600, 0.01), m("sdpa-cudnn", 603, 0.01)], "sdpa", ("sdpa", "sdpa-cudnn"),
                 id="issue-17-1k-forced-cudnn-0.5pct-ahead-is-a-tie"),
    pytest.param([m("sdpa", 600, 0.001), m("sdpa-cudnn", 640, 0.001)], "sdpa-cudnn", ("sdpa-cudnn",),
                 id="beyond-the-spread-wins"),
    pytest.param([m("sdpa-cudnn", 600, 0.02), m("flash-attn-4", 610, 0.02)], "sdpa-cudnn",
                 ("sdpa-cudnn", "flash-attn-4"), id="forced-sdpa-kernel-before-external"),
    pytest.param([m("sdpa", 1.0, 0.3), m("flex", 1.2, 0.3), m("sdpa-math", 0.9, 0.3)], "sdpa",
                 ("sdpa", "flex", "sdpa-math"), id="cpu-noise-keeps-plain-sdpa"),
    pytest.param([m("sdpa", 1.0), m("flex", 1.0)], "sdpa", ("sdpa", "flex"), id="exact-equal-no-spread"),
    pytest.param([m("fa4", 700, 0.01), m("fa3", 690, 0.02)], "fa4", ("fa3", "fa4"),
                 id="same-tier-tie-goes-to-higher-median"),
])
def test_ties_within_the_spread_go_to_the_lower_overhead_path(cands: list[Measurement], winner: str,
                                                                tied: tuple[str, ...]) -> None:
    r = rank(cands)
    assert r.winner == winner
    assert set(r.tied) == set(tied) and r.tied[0] == winner
    assert sorted(r.order) == sorted(c.backend for c in cands)


def test_margin_is_the_winner_over_the_best_other() -> None:
    assert rank([m("a", 110), m("b", 100)]).margin == pytest.approx(0.10)
    assert rank([m("sdpa", 100, 0.05), m("x", 102, 0.05)]).margin == pytest.approx(100 / 102 - 1)  # tie to sdpa
    assert rank([m("a", 1)]).margin is None
    assert rank([]).winner is None



def test_overhead_tiers() -> None:
    assert [overhead_tier(n) for n in ("sdpa", "sdpa-cudnn", "sdpa-flash", "flash-attn", "flex")] == [0, 1, 1, 2, 2]


def test_wins_per_backend_counts_forward_classes_among_allowed() -> None:
    wins = wins_per_backend(RECORDS)
    assert {n: len(v) for n, v in wins.items()} == {"sdpa-cudnn": 1, "flash-attn-4": 2}
    assert set(wins_per_backend(RECORDS, among={"flash-attn"})) == {"flash-attn"}


def test_spread_of_records_makes_a_tie() -> None:
    records = [rec("sdpa", 1024, 600.0, spread=0.02), rec("sdpa-cudnn", 1024, 605.0, spread=0.02)]
    r = fastest(records, cls(1024))
    assert (r.winner, set(r.tied)) == ("sdpa", {"sdpa", "sdpa-cudnn"})


measurements = st.lists(
    st.builds(m, st.sampled_from(["sdpa", "sdpa-cudnn", "sdpa-flash", "fa4", "xf"]),
              st.floats(1.0, 1000.0), st.floats(0.0, 0.3)),
    max_size=5, unique_by=lambda x: x.backend)


@given(measurements)
def test_the_rule_is_honest(cands: list[Measurement]) -> None:
    r = rank(cands)
    if not cands:
        assert r.winner is None
        return
    top = max(cands, key=lambda c: c.tflops)
    assert r.winner in r.tied and top.backend in r.tied
    win = r.measurements[r.winner]
    assert not beats(top, win)  # the winner is never slower than the top beyond the noise
    if "sdpa" in r.tied:
        assert r.winner == "sdpa"  # plain SDPA wins every tie it is in
    if all(beats(top, o) for o in cands if o is not top):
        assert r.winner == top.backend  # faster beyond all the noise: it wins whatever its overhead
