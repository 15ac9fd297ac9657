"""The unpatched ``torch.nn.functional.scaled_dot_product_attention``, held while ``patch_sdpa`` is active.

Attnforge's own SDPA adapters call :func:`original_sdpa`, so a patched SDPA never routes back into the
dispatcher. :mod:`attnforge.dispatch.sdpa_patch` installs and removes the patch; this module only holds the
function it replaced (it lives here, below dispatch, because the SDPA adapters need it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_HELD: list[Callable[..., Any]] = []


def original_sdpa() -> Callable[..., Any]:
    """The unpatched SDPA function."""
    if _HELD:
        return _HELD[0]
    import torch.nn.functional as F  # noqa: N812 - the name everyone uses

    return F.scaled_dot_product_attention


def hold(fn: Callable[..., Any]) -> None:
    """Remember ``fn`` as the original, unless one is held already (patches nest)."""
    if not _HELD:
        _HELD.append(fn)


def release(fn: Callable[..., Any]) -> None:
    """Forget the held original when ``fn`` is it (the outermost patch was restored)."""
    if _HELD and _HELD[0] is fn:
        _HELD.clear()


def kernels_restricted() -> bool:
    """True inside a ``torch.nn.attention.sdpa_kernel([...])`` context (or after ``torch.backends.cuda``
    flags were turned off) that leaves out any of SDPA's flash, memory-efficient, math or cuDNN kernels: the
    user chose the kernels, and a patched SDPA must not override that choice."""
    import torch

    flags = torch._C  # the getters torch.backends.cuda.*_sdp_enabled() wrap (untyped there)
    return not (flags._get_flash_sdp_enabled() and flags._get_mem_efficient_sdp_enabled()
                and flags._get_math_sdp_enabled() and flags._get_cudnn_sdp_enabled())
