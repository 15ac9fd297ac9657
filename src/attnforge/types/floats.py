"""float32's range, as the attention kernels compute a call's scale and softcap: the one place its limits live.

The kernels (and the exact fallback) multiply the logits by ``scale`` and apply a softcap as ``c * tanh(x / c)`` in
float32. A scale or softcap past float32's largest is infinite there (a softcap's ``inf * 0 = NaN`` for every logit);
a softcap under its smallest normal is 0 or subnormal (the kernels divide by it: NaN rows in the exact math, zeros from
Flex; CPU fuzz, 2026-12-03). Values: IEEE 754 binary32 (``torch.finfo(torch.float32).max`` / ``.tiny``).
"""

from __future__ import annotations

#: the largest float32
FLOAT32_MAX = 3.4028234663852886e38
#: the smallest normal float32
FLOAT32_TINY = 1.1754943508222875e-38


def normal_float32(value: float) -> bool:
    """Whether a positive ``value`` is a normal float32 number (``FLOAT32_TINY <= value <= FLOAT32_MAX``): a
    softcap attention() takes (0 is "off", checked apart)."""
    return FLOAT32_TINY <= value <= FLOAT32_MAX
