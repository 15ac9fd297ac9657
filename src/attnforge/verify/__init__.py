"""Numerical verification of attention backends against a float64 reference (``attnforge verify``).

Nothing runs at import time; torch is imported by the functions that need it.
"""

from __future__ import annotations

from attnforge.types.device import DeviceType
from attnforge.verify.cases import VerifyCase, generate_cases
from attnforge.verify.check import BackendVerification, CaseResult, CaseStatus, verify_backend
from attnforge.verify.compare import Comparison, compare
from attnforge.verify.device import DeviceInfo, current_device
from attnforge.verify.run import VerifyReport, run_verify

__all__ = [
    "BackendVerification", "CaseResult", "CaseStatus", "Comparison", "DeviceInfo", "DeviceType", "VerifyCase",
    "VerifyReport", "compare", "current_device", "generate_cases", "run_verify", "verify_backend",
]
