"""fastest_backend: nearest measured shape, latest run wins, restricted to allowed backends."""

from __future__ import annotations

import pytest

from attnforge.bench.flops import Mode
from attnforge.bench.records import ShapeClass, fastest_backend
from attnforge.records import BenchRecord


def rec(backend: str, seqlen: int, tflops: float, *, head_dim: int = 128, causal: bool = False,
        mode: str = "fwd", run: str = "r1") -> BenchRecord:
    return BenchRecord(device_key="k", backend=backend, backend_version=None, dtype="bfloat16", mode=mode,
                       causal=causal, batch=16384 // seqlen, heads=16, kv_heads=16, head_dim=head_dim,
                       seqlen_q=seqlen, seqlen_k=seqlen, ms=1.0, tflops=tflops, peak_mem_bytes=None,
                       run_id=run)


# numbers from tests/fixtures/h200_bench_2026-11-21.json (cuDNN wins fwd; FA4 wins at 4k and 16k)
RECORDS = [
    rec("sdpa-cudnn", 1024, 574.1), rec("flash-attn", 1024, 346.8), rec("flash-attn-4", 1024, 547.1),
    rec("sdpa-cudnn", 4096, 615.3), rec("flash-attn", 4096, 368.9), rec("flash-attn-4", 4096, 644.1),
    rec("sdpa-cudnn", 16384, 621.9), rec("flash-attn-4", 16384, 676.5),
    rec("sdpa-cudnn", 1024, 286.8, causal=True, mode="fwd+bwd"), rec("flash-attn-4", 1024, 309.0, causal=True,
                                                                      mode="fwd+bwd"),
]


def cls(seqlen: int, *, head_dim: int = 128, causal: bool = False, mode: Mode = Mode.FWD) -> ShapeClass:
    return ShapeClass(dtype="bfloat16", mode=mode, causal=causal, head_dim=head_dim, seqlen=seqlen)


@pytest.mark.parametrize(("shape", "among", "want"), [
    pytest.param(cls(1024), None, "sdpa-cudnn", id="measured-1k"),
    pytest.param(cls(4096), None, "flash-attn-4", id="measured-4k"),
    pytest.param(cls(1500), None, "sdpa-cudnn", id="nearest-on-log-scale-is-1k"),
    pytest.param(cls(3000), None, "flash-attn-4", id="nearest-on-log-scale-is-4k"),
    pytest.param(cls(100_000), None, "flash-attn-4", id="beyond-the-grid"),
    pytest.param(cls(4096), {"sdpa-cudnn", "flash-attn"}, "sdpa-cudnn", id="only-verified"),
    pytest.param(cls(1024, head_dim=96), None, "sdpa-cudnn", id="nearest-head-dim"),
    pytest.param(cls(1024, causal=True, mode=Mode.FWD_BWD), None, "flash-attn-4", id="training"),
    pytest.param(cls(1024, causal=True), None, None, id="never-measured"),
    pytest.param(cls(1024), {"xformers"}, None, id="nothing-allowed"),
])
def test_fastest_backend(shape: ShapeClass, among: set[str] | None, want: str | None) -> None:
    assert fastest_backend(RECORDS, shape, among) == want


def test_a_later_run_overrides_an_earlier_one() -> None:
    later = [*RECORDS, rec("flash-attn", 1024, 900.0, run="r2"), rec("flash-attn", 1024, 100.0, run="r3")]
    assert fastest_backend(later, cls(1024)) == "sdpa-cudnn"
    assert fastest_backend([*RECORDS, rec("flash-attn", 1024, 900.0, run="r2")], cls(1024)) == "flash-attn"
