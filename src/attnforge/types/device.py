"""The device key: which device (and torch) a verify or bench record belongs to.

One constructor (:meth:`DeviceKey.of` / :func:`device_key`) and one reader (:meth:`DeviceKey.parse`) for every
place that stores or looks up records: the runtime (from torch), verify and bench (from their device), and the
doctor (from a snapshot).
"""

from __future__ import annotations

from dataclasses import dataclass

from attnforge._compat import StrEnum
from attnforge.types.cc import ComputeCapability


@dataclass(frozen=True, slots=True)
class DeviceKey:
    """``"NVIDIA H200|9.0|torch 2.11.0+cu130"``; ``"cpu|torch 2.13.0+cpu"`` without a GPU.

    Attributes:
        device: the device name (``"NVIDIA H200"``, ``"cpu"``).
        compute_capability: None for a CPU.
        torch_version: ``torch.__version__`` (``"none"`` when torch is missing).
    """

    device: str
    compute_capability: ComputeCapability | None
    torch_version: str

    @classmethod
    def of(cls, device: str, compute_capability: tuple[int, int] | None, torch_version: str) -> DeviceKey:
        cc = None if compute_capability is None else ComputeCapability(*compute_capability)
        return cls(device, cc, torch_version)

    @classmethod
    def parse(cls, text: str) -> DeviceKey:
        """Read back what ``str()`` wrote.

        Raises:
            ValueError: not a device key.
        """
        parts = text.split("|")
        if len(parts) not in (2, 3) or not parts[-1].startswith("torch ") or not parts[0]:
            raise ValueError(f"not a device key: {text!r} (expected NAME|CC|torch VERSION or NAME|torch VERSION)")
        cc = ComputeCapability.parse(parts[1]) if len(parts) == 3 else None
        return cls(parts[0], cc, parts[-1].removeprefix("torch "))

    def __str__(self) -> str:
        if self.compute_capability is None:
            return f"{self.device}|torch {self.torch_version}"
        return f"{self.device}|{self.compute_capability}|torch {self.torch_version}"


def device_key(device: str, compute_capability: tuple[int, int] | None, torch_version: str) -> str:
    """The records key as text: ``str(DeviceKey.of(...))``."""
    return str(DeviceKey.of(device, compute_capability, torch_version))


class DeviceType(StrEnum):
    """Where kernels run (torch's device type): the devices verify and bench use and capability rows name."""

    CUDA = "cuda"
    CPU = "cpu"
