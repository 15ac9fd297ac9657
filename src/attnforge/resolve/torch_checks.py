"""The torch questions of the build preflight: is torch a CUDA build, and which PyTorch index fixes it if not.

Every version fact comes from ``toolchain.toml`` (``[[torch]]``, ``[torch_stack]``); toolchain-facts.md §5.
"""

from __future__ import annotations

from attnforge.catalog import Catalog
from attnforge.catalog.toolchain import MajorMinor, parse_major_minor
from attnforge.probe.snapshot import CudaToolkit, SystemSnapshot
from attnforge.resolve.checks import Check


def toolkit_version(toolkit: CudaToolkit) -> MajorMinor | None:
    try:
        return parse_major_minor(toolkit.version)
    except ValueError:
        return None


def torch_cuda(snapshot: SystemSnapshot) -> MajorMinor | None:
    t = snapshot.torch
    if t is None or t.cuda_version is None:
        return None
    try:
        return parse_major_minor(t.cuda_version)
    except ValueError:
        return None


def torch_checks(snapshot: SystemSnapshot, catalog: Catalog) -> list[Check]:
    t = snapshot.torch
    py = snapshot.platform.python_executable
    suggestion = _torch_suggestion(snapshot, catalog)
    if t is None:
        why = snapshot.problem("torch") or "import torch failed"
        return [
            Check(
                name="torch",
                ok=False,
                reason=f"torch is not importable in {py} ({why})",
                fix=f"{py} -m pip install torch --index-url {suggestion}",
            )
        ]
    if t.hip_version is not None:
        return [
            Check(
                name="torch-cuda",
                ok=False,
                reason=f"torch {t.version} is a ROCm build (HIP {t.hip_version}); attnforge builds CUDA "
                "extensions only",
                fix="use an NVIDIA GPU with a CUDA build of torch",
            )
        ]
    if t.cuda_version is None:
        return [
            Check(
                name="torch-cuda",
                ok=False,
                reason=f"torch {t.version} is a CPU-only build (torch.version.cuda is None): a CUDA "
                f"extension cannot "
                "be compiled against it, whatever CUDA_HOME says",
                fix=f"install a CUDA build of torch: {py} -m pip install torch --index-url {suggestion}",
            )
        ]
    return [Check(name="torch-cuda", ok=True, reason=f"torch {t.version} is a CUDA {t.cuda_version} build")]


def _torch_suggestion(snapshot: SystemSnapshot, catalog: Catalog) -> str:
    """The PyTorch index to suggest: the newest CUDA variant of this torch release that matches an installed
    nvcc's major (so the extension build works afterwards), else the release's PyPI default, else the newest
    installed toolkit's, else the catalog's default variant (all from ``toolchain.toml``)."""
    tools = catalog.tools
    release = None
    if snapshot.torch is not None:
        try:
            release = tools.torch_release(parse_major_minor(snapshot.torch.version))
        except ValueError:
            release = None
    majors = {v[0] for tk in snapshot.cuda_toolkits if (v := toolkit_version(tk)) is not None}
    if release is not None:
        fitting = [c for c in release.cuda if c[0] in majors]
        if fitting:
            return tools.torch_index_url(max(fitting))
        if release.pypi_default is not None:
            return tools.torch_index_url(release.pypi_default)
    versions = sorted(v for tk in snapshot.cuda_toolkits if (v := toolkit_version(tk)) is not None)
    return tools.torch_index_url(versions[-1] if versions else tools.default_torch_cuda())


def torch_variant_for(snapshot: SystemSnapshot, catalog: Catalog, cuda_major: int) -> MajorMinor | None:
    """The newest CUDA variant with major ``cuda_major`` of the installed torch release (``(12, 8)``), if any."""
    if snapshot.torch is None:
        return None
    try:
        release = catalog.tools.torch_release(parse_major_minor(snapshot.torch.version))
    except ValueError:
        return None
    fitting = [c for c in release.cuda if c[0] == cuda_major] if release else []
    return max(fitting) if fitting else None
