"""Attention speed on this machine (``attnforge bench``): TFLOP/s per shape and backend, stored for dispatch.

FLOPs per call (:mod:`attnforge.bench.flops`, the FlashAttention papers' convention):

* forward: ``4 * B * Hq * Sq * Sk * D``, halved when causal (when ``Sq != Sk``, the exact number of
  (query, key) pairs the bottom-right aligned mask keeps replaces ``Sq * Sk / 2``);
* forward + backward: ``3.5 *`` forward (the backward pass counts ``2.5 *`` forward).

TFLOP/s = FLOPs / median time of one call. Timing (:mod:`attnforge.bench.timing`): the first call timed
apart (compile/JIT), warm-up, then the median of many repetitions, each on the next of several fresh
random input sets (together larger than the GPU's L2), CUDA events or triton's ``do_bench`` on a GPU and
``time.perf_counter`` on a CPU, the same harness for every backend. Modules: ``flops``, ``grid`` (paper, real-shape,
diffusion, CPU and model shapes), ``models`` (shapes from a Hugging Face config), ``timing``, ``run``
(:func:`run_bench`), ``accuracy`` (quantized error), ``records`` (:func:`to_records`), ``report`` (JSON), ``plot``
(PNG), ``reference`` (rerun and compare a recorded benchmark such as the H200 fixture). "Which is fastest" is
:mod:`attnforge.ranking`; shapes and shape classes are :mod:`attnforge.types.shapes`.
Nothing runs at import time.
"""

from __future__ import annotations

from attnforge.bench.flops import FORMULA, attention_flops, causal_pairs, tflops
from attnforge.bench.grid import ShapeSet, cpu_grid, model_shapes, paper_grid
from attnforge.bench.records import to_records
from attnforge.bench.run import BenchCell, BenchReport, BenchRow, CellStatus, run_bench
from attnforge.bench.timing import Timing, TimingConfig, measure
from attnforge.types.shapes import AttentionShape, Mode, ShapeClass

__all__ = [
    "FORMULA",
    "AttentionShape",
    "BenchCell",
    "BenchReport",
    "BenchRow",
    "CellStatus",
    "Mode",
    "ShapeClass",
    "ShapeSet",
    "Timing",
    "TimingConfig",
    "attention_flops",
    "causal_pairs",
    "cpu_grid",
    "measure",
    "model_shapes",
    "paper_grid",
    "run_bench",
    "tflops",
    "to_records",
]
