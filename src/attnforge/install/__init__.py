"""Putting an artifact into the running interpreter: plan, fetch or build into the cache, pip, verify."""

from attnforge.install.pip import PROTECTED, PipInstallResult, pip_install
from attnforge.install.wheelfile import WheelMetadata, read_wheel_metadata

__all__ = ["PROTECTED", "PipInstallResult", "WheelMetadata", "pip_install", "read_wheel_metadata"]
