"""Compare one attention output with the float64 reference and say exactly how it differs.

The report follows xformers' ``assert_allclose``: the worst element's index, both values, the tolerance and
the fraction of elements that fail, plus the relative L1 error SageAttention uses for quantized kernels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from attnforge.catalog.tolerances import Tolerance


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """How an output differs from the reference.

    Attributes:
        ok: no NaN/Inf, every element within ``atol + rtol * |ref|`` and ``rel_l1 <= max_rel_l1``.
        shape_ok: the output has the reference's shape.
        nonfinite_count: NaN or Inf elements in the output (any one fails the case).
        max_abs_err: the largest ``|out - ref|`` (NaN/Inf count as infinite).
        worst_index: the index of the element furthest outside its tolerance, ``(b, h, s, d)``.
        worst_value / worst_reference: the output and reference values there.
        failing_fraction: the fraction of elements outside ``atol + rtol * |ref|`` (NaN/Inf included).
        rel_l1: ``sum|out - ref| / sum|ref|`` over the finite elements.
        atol, rtol, max_rel_l1: the tolerance that was applied.
    """

    ok: bool
    shape_ok: bool
    nonfinite_count: int
    max_abs_err: float
    worst_index: tuple[int, ...]
    worst_value: float
    worst_reference: float
    failing_fraction: float
    rel_l1: float
    atol: float
    rtol: float
    max_rel_l1: float

    def describe(self) -> str:
        """One line for people: what failed and where (or the margins when it passed)."""
        if not self.shape_ok:
            return "output has the wrong shape"
        where = (f"worst at {list(self.worst_index)}: got {self.worst_value:.6g}, "
                 f"expected {self.worst_reference:.6g}")
        parts = []
        if self.nonfinite_count:
            parts.append(f"{self.nonfinite_count} NaN/Inf element(s)")
        parts.append(f"max abs err {self.max_abs_err:.3g} (atol {self.atol:g}, rtol {self.rtol:g})")
        parts.append(f"{self.failing_fraction:.2%} of elements outside tolerance")
        parts.append(f"rel L1 {self.rel_l1:.3g} (max {self.max_rel_l1:g})")
        return "; ".join(parts) + "; " + where


def compare(out: Any, ref: Any, tol: Tolerance) -> Comparison:
    """Compare ``out`` with ``ref`` under ``tol``.

    Args:
        out: the backend's output, ``[B, H, S, D]``, any floating dtype, any device.
        ref: the float64 reference of the same shape
            (:func:`attnforge.backends.exact.reference_attention`).
        tol: the tolerance row for the backend's precision kind and the inputs' dtype.

    Returns:
        The comparison; never raises for a bad output (a wrong shape is reported as ``shape_ok=False``).
    """
    import torch

    nan = math.nan
    if tuple(out.shape) != tuple(ref.shape):
        return Comparison(ok=False, shape_ok=False, nonfinite_count=0, max_abs_err=math.inf, worst_index=(),
                          worst_value=nan, worst_reference=nan, failing_fraction=1.0, rel_l1=math.inf,
                          atol=tol.atol, rtol=tol.rtol, max_rel_l1=tol.max_rel_l1)
    got = out.detach().to(torch.float64)
    want = ref.detach().to(device=got.device, dtype=torch.float64)
    finite = torch.isfinite(got)
    nonfinite = int((~finite).sum().item())
    err = torch.where(finite, (got - want).abs(), torch.full_like(got, math.inf))
    allowed = tol.atol + tol.rtol * want.abs()
    # How far outside its own tolerance each element is; the worst one is reported.
    excess = torch.where(finite, err - allowed, torch.full_like(got, math.inf))
    failing = int((excess > 0).sum().item())
    total = max(1, got.numel())
    index: tuple[int, ...] = ()
    if got.numel():
        flat = torch.argmax(excess)
        index = tuple(int(i) for i in torch.unravel_index(flat, tuple(got.shape)))
    finite_err = torch.where(finite, err, torch.zeros_like(err))
    ref_l1 = float(want.abs().sum().item())
    err_l1 = float(finite_err.sum().item())
    rel_l1 = err_l1 / ref_l1 if ref_l1 > 0 else (0.0 if err_l1 == 0 else math.inf)
    max_abs = float(err.max().item()) if got.numel() else 0.0
    ok = nonfinite == 0 and failing == 0 and rel_l1 <= tol.max_rel_l1
    return Comparison(
        ok=ok, shape_ok=True, nonfinite_count=nonfinite, max_abs_err=max_abs, worst_index=index,
        worst_value=float(got[index].item()) if index else nan,
        worst_reference=float(want[index].item()) if index else nan,
        failing_fraction=failing / total, rel_l1=rel_l1, atol=tol.atol, rtol=tol.rtol,
        max_rel_l1=tol.max_rel_l1,
    )
