"""Value types shared by every layer: compute capability, versions, the device key (and the attention shape).

This package is the floor of the layer table (docs/architecture.md): it imports nothing from attnforge, so any
module may import it without creating a cycle.
"""

from __future__ import annotations

from attnforge.types.cc import ComputeCapability, format_cc, parse_cc, parse_cc_list
from attnforge.types.device import DeviceKey, device_key
from attnforge.types.versions import loose_version, major_minor, newest_first, parse_version

__all__ = [
    "ComputeCapability", "DeviceKey", "device_key", "format_cc", "loose_version", "major_minor", "newest_first",
    "parse_cc", "parse_cc_list", "parse_version",
]
