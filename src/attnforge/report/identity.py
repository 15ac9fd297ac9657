"""The device key of a snapshot: the same :func:`attnforge.types.device.device_key` the runtime uses."""

from __future__ import annotations

from attnforge.probe.snapshot import SystemSnapshot
from attnforge.types.device import device_key


def snapshot_device_key(s: SystemSnapshot) -> str:
    """``"NVIDIA H200|9.0|torch 2.11.0+cu130"`` for GPU 0, ``"cpu|torch 2.13.0+cpu"`` without a usable GPU."""
    torch_version = s.torch.version if s.torch else "none"
    usable = s.gpus and s.torch is not None and s.torch.cuda_available
    if not usable:
        return device_key("cpu", None, torch_version)
    g = s.gpus[0]
    return device_key(g.name, g.compute_capability, torch_version)
