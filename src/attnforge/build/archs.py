"""nvcc's spelling of a build's target compute capabilities.

A :class:`~attnforge.resolve.types.BuildSpec` carries compute capabilities as tuples (``(9, 0)``); nvcc wants
``-gencode`` pairs. Each capability gets SASS (``code=sm_90``), and the highest one also gets PTX
(``code=compute_90``) so a newer GPU can JIT-compile it; this is what ``torch.utils.cpp_extension`` does for a
``TORCH_CUDA_ARCH_LIST`` entry ending in ``+PTX`` (``_get_cuda_arch_flags``).
"""

from __future__ import annotations

from collections.abc import Iterable

from attnforge.types.cc import ComputeCapability


def sm_name(cc: ComputeCapability) -> str:
    """``(9, 0)`` -> ``"90"``, the number nvcc puts after ``sm_`` / ``compute_``."""
    return f"{cc[0]}{cc[1]}"


def gencode_flags(archs: Iterable[ComputeCapability], *, ptx_for_highest: bool = True) -> tuple[str, ...]:
    """The nvcc flags that compile for ``archs``.

    Args:
        archs: target compute capabilities, e.g. ``((8, 0), (9, 0))``; duplicates are dropped.
        ptx_for_highest: also embed PTX for the highest capability (forward compatibility).

    Returns:
        ``("-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90")`` for the example above.

    Raises:
        ValueError: no archs were given.
    """
    ordered = sorted(set(archs))
    if not ordered:
        raise ValueError("no target compute capabilities")
    flags = [f"-gencode=arch=compute_{sm_name(cc)},code=sm_{sm_name(cc)}" for cc in ordered]
    if ptx_for_highest:
        top = sm_name(ordered[-1])
        flags.append(f"-gencode=arch=compute_{top},code=compute_{top}")
    return tuple(flags)
