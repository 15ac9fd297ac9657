"""The device verify and bench run on, and the key their records are stored under."""

from __future__ import annotations

from dataclasses import dataclass

from attnforge.errors import UsageError
from attnforge.types.device import DeviceType, device_key


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceInfo:
    """The device one verify or bench run uses.

    Attributes:
        type: cuda or cpu.
        name: ``"NVIDIA H200"``; ``"cpu"`` without a GPU.
        compute_capability: ``(9, 0)``; None on CPU.
        torch_version: ``torch.__version__``.
        l2_cache_bytes: the GPU's L2 size (input rotation must exceed it); None on CPU.
        memory_bytes: the GPU's total memory; None on CPU.
    """

    type: DeviceType
    name: str
    compute_capability: tuple[int, int] | None
    torch_version: str
    l2_cache_bytes: int | None = None
    memory_bytes: int | None = None

    @property
    def key(self) -> str:
        """The records key (:func:`attnforge.types.device.device_key`)."""
        return device_key(self.name, self.compute_capability, self.torch_version)

    @property
    def torch_device(self) -> str:
        return "cuda:0" if self.type is DeviceType.CUDA else "cpu"


def current_device(requested: str | None = None) -> DeviceInfo:
    """Describe the device to run on: CUDA device 0 when there is one (or when asked), else the CPU.

    Args:
        requested: ``"cuda"``, ``"cpu"`` or None for the best available.

    Raises:
        UsageError: ``"cuda"`` was asked for but torch sees no CUDA device, or an unknown device name.
    """
    import torch

    if requested not in (None, "cuda", "cpu"):
        raise UsageError(f"unknown device {requested!r}", hint="use --device cuda or --device cpu")
    want_cuda = requested == "cuda" or (requested is None and torch.cuda.is_available())
    if not want_cuda:
        return DeviceInfo(type=DeviceType.CPU, name="cpu", compute_capability=None,
                          torch_version=str(torch.__version__))
    if not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for but torch sees no CUDA device",
                         cause=f"torch {torch.__version__} (CUDA {torch.version.cuda})",
                         hint="run `attnforge doctor`, or use --device cpu")
    props = torch.cuda.get_device_properties(0)
    return DeviceInfo(
        type=DeviceType.CUDA, name=str(props.name), compute_capability=(int(props.major), int(props.minor)),
        torch_version=str(torch.__version__), l2_cache_bytes=int(getattr(props, "L2_cache_size", 0)) or None,
        memory_bytes=int(props.total_memory),
    )
