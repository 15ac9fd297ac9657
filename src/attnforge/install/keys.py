"""Cache-key inputs for what the installer stores: a wheel it built, or a prebuilt wheel it fetched; and
:func:`store_built`, the one way a finished source build enters the store (``install`` and ``build`` alike)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import parse_wheel_filename

from attnforge.cache import ArtifactKind, CacheKeyInputs
from attnforge.install.abi import built_target, wheel_tags
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.types import BuildSpec
from attnforge.types.binary import AbiKind, BinaryTarget
from attnforge.types.cc import ComputeCapability

if TYPE_CHECKING:
    from attnforge.cache import Entry, Store

#: Build variables that change how fast or where a build runs, not the bytes it produces; every other variable
#: a build spec sets is part of the cache key (flags such as FLASH_ATTENTION_DISABLE_DROPOUT or
#: FLASH_ATTN_CUDA_ARCHS change the binary). Paths are left out because the toolkit's version is in the key.
NOT_IN_KEY = frozenset({
    "MAX_JOBS", "NVCC_THREADS", "FLASH_ATTENTION_FORCE_BUILD", "CUDA_HOME", "CUDA_PATH", "PATH", "TMP",
    "TEMP", "TMPDIR", "SCCACHE_DIR", "CCACHE_DIR", "PIP_NO_BUILD_ISOLATION", "DISTUTILS_USE_SDK",
})


def build_flags(spec: BuildSpec) -> tuple[str, ...]:
    """What of ``spec`` changes the bytes built, as key flags: every ``spec.env`` variable but :data:`NOT_IN_KEY` and
    the recipe's ``parallel_env`` (how many extensions build at once), then the build tree's edits."""
    skip = NOT_IN_KEY | {spec.parallel_env}
    return (*(f"{k}={v}" for k, v in spec.env.items() if k not in skip), *(e.key_flag() for e in spec.edits))


def toolchain_of(snapshot: SystemSnapshot, spec: BuildSpec | None) -> tuple[tuple[str, str], ...]:
    """The compilers that shaped a build: the spec's nvcc and the snapshot's host C++ compiler."""
    tools: dict[str, str] = {}
    toolkit = spec.toolkit if spec is not None and spec.toolkit is not None else None
    if toolkit is not None:
        tools["nvcc"] = toolkit.version
    for kind in ("g++", "gcc", "cl", "clang"):
        compiler = snapshot.compiler(kind)
        if compiler is not None:
            tools[kind] = compiler.version
            break
    return tuple(tools.items())


def torch_fields(snapshot: SystemSnapshot) -> tuple[str | None, str | None, bool | None]:
    """(torch version, torch's CUDA, C++11 ABI) of the interpreter the artifact is for."""
    torch = snapshot.torch
    if torch is None:
        return None, None, None
    return torch.version, torch.cuda_version, torch.cxx11_abi


def built_wheel_inputs(
    *, wheel: Path, spec: BuildSpec, source_sha256: str, snapshot: SystemSnapshot, target: BinaryTarget | None = None
) -> CacheKeyInputs:
    """Key inputs of a wheel built from ``spec`` on the machine ``snapshot`` describes.

    ``target`` is what the binary needs (:func:`attnforge.install.abi.built_target`, read from the built wheel): a
    stable-ABI build is keyed by its minimum torch and no C++11 ABI, so every torch it serves shares its key.
    None keys it to the snapshot's torch (version, CUDA, C++11 ABI).
    """
    name, version, _, _ = parse_wheel_filename(wheel.name)
    python_tag, platform_tag = wheel_tags(wheel.name)
    torch_version, cuda_version, cxx11_abi = torch_fields(snapshot)
    abi = AbiKind.TORCH
    if target is not None:
        abi, torch_version, cxx11_abi = target.abi, target.torch, target.cxx11_abi
    flags = build_flags(spec)
    if spec.allow_unsupported_compiler:  # on Windows the flag reaches nvcc at build time, not via spec.env
        flags = (*flags, "nvcc:-allow-unsupported-compiler")
    return CacheKeyInputs(
        name=name, version=str(version), kind=ArtifactKind.WHEEL, source_sha256=source_sha256,
        archs=spec.archs, flags=flags, python_tag=python_tag, platform_tag=platform_tag,
        glibc=snapshot.platform.glibc, toolchain=toolchain_of(snapshot, spec),
        torch_version=torch_version, cuda_version=cuda_version, cxx11_abi=cxx11_abi, abi=abi,
    )


def prebuilt_wheel_inputs(
    *, wheel: Path, sha256: str, archs: tuple[ComputeCapability, ...], snapshot: SystemSnapshot
) -> CacheKeyInputs:
    """Key inputs of a prebuilt wheel taken as is: its own bytes are the "source".

    ``archs`` are the compute capabilities it was accepted for, so the cache offers it again only to them.
    """
    name, version, _, _ = parse_wheel_filename(wheel.name)
    python_tag, platform_tag = wheel_tags(wheel.name)
    torch_version, cuda_version, cxx11_abi = torch_fields(snapshot)
    return CacheKeyInputs(
        name=name, version=str(version), kind=ArtifactKind.WHEEL, source_sha256=sha256, archs=archs,
        flags=("prebuilt",), python_tag=python_tag, platform_tag=platform_tag, glibc=snapshot.platform.glibc,
        torch_version=torch_version, cuda_version=cuda_version, cxx11_abi=cxx11_abi,
    )


def _flags_of(log_path: Path | None) -> str:
    """The compile lines of a build log (where ``-DTORCH_TARGET_VERSION=...`` shows); empty without one."""
    if log_path is None:
        return ""
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(line for line in text.splitlines() if "TORCH_TARGET_VERSION" in line)


def check_built_version(wheel: Path, wanted_version: str, *, log_path: Path | None = None) -> None:
    """Refuse a built wheel whose version is outside the request's PEP 440 specifier (``>=99`` built 2.8.3).

    Raises:
        BuildError: it is outside (the message names both; the wheel is left to the caller).
    """
    if not wanted_version.strip():
        return
    from packaging.specifiers import SpecifierSet

    from attnforge.errors import BuildError

    name, version, _, _ = parse_wheel_filename(wheel.name)
    if not SpecifierSet(wanted_version).contains(version, prereleases=True):
        raise BuildError(
            f"the build made {name} {version}, which does not satisfy {wanted_version}; it was not cached",
            log_path=str(log_path) if log_path else None, cause=f"the source's version is {version}",
            hint="build a source of a version inside the range, or change the version specifier",
        )


def label_and_key(wheel: Path, spec: BuildSpec, *, source_sha256: str, snapshot: SystemSnapshot,
                  log_path: Path | None) -> tuple[Path, CacheKeyInputs]:
    """A freshly built wheel labelled and keyed by the ABI its binary really has (:func:`built_target`: the
    ELF symbols and the build's ``TORCH_TARGET_VERSION`` flag; a stable-ABI build is labelled and keyed once per
    minimum torch, a per-torch build per torch and C++ ABI): the one way a build becomes an artifact, for
    ``install``/``build`` (:func:`store_built`) and for a fleet node (:func:`attnforge.provision.build.build_here`).

    Returns:
        (the labelled wheel, next to ``wheel``; its cache-key inputs).

    Raises:
        BuildError: the binary's ABI is not the one ``--abi`` asked for (``spec.abi``; a spec with edits asks for a
            per-torch binary), e.g. the edit that was to bind it to one torch left it on the stable ABI.
    """
    from attnforge.install.guards import pinned_to_torch

    target = built_target(wheel, snapshot=snapshot, archs=spec.archs, build_flags=_flags_of(log_path))
    asked = spec.abi if spec.abi is not None else AbiKind.TORCH if spec.edits else None
    if asked is not None and target.abi in (AbiKind.TORCH, AbiKind.TORCH_STABLE) and target.abi is not asked:
        from attnforge.errors import BuildError

        made = "uses the libtorch stable ABI" if target.abi is AbiKind.TORCH_STABLE else "is bound to one torch"
        raise BuildError(f"the build was to make a {asked.value} binary (--abi {asked.value}), but its binary {made}; "
                         "it was not cached", log_path=str(log_path) if log_path else None,
                         cause=(f"the edit of {', '.join(e.file for e in spec.edits)} did not change what was built"
                                if spec.edits else "the project builds the other ABI on this torch"),
                         hint=f"drop --abi {asked.value}, or build a source that makes that ABI")
    labelled = pinned_to_torch(wheel, spec, snapshot, target)
    inputs = built_wheel_inputs(wheel=labelled, spec=spec, source_sha256=source_sha256, snapshot=snapshot,
                                target=target)
    return labelled, inputs


def store_built(store: Store, spec: BuildSpec, *, wheel: Path, log_path: Path | None, source_sha256: str,
                snapshot: SystemSnapshot, owned_dir: Path | None = None, wanted_version: str = "") -> Entry:
    """Put the wheel a build of ``spec`` produced into ``store``, keyed as ``install`` keys it, so the next
    ``install`` (or ``plan``) of the same request finds it as a cache candidate and ``cache export`` serves it.

    The wheel is first checked against the request's version specifier ``wanted_version`` (a source's version is
    known only once built) and labelled with the torch it was built against (:func:`~attnforge.install.guards.
    pinned_to_torch`); ``owned_dir`` (the builder's staging directory) is removed afterwards when the wheel was
    stored or refused; where the store could not take it (a full disk, a read-only cache) it is kept, and the
    error names the wheel: a build of minutes or hours is not thrown away.

    Raises:
        BuildError: the built version does not satisfy ``wanted_version`` (nothing is stored).
        CacheError: the disk is full or the store cannot be written (the hint says where the wheel is kept).
        OSError: the same, where the store did not name it (the wheel is kept too).
    """
    from attnforge.cache._files import remove_tree
    from attnforge.errors import CacheError

    keep = False
    try:
        check_built_version(wheel, wanted_version, log_path=log_path)
        labelled, inputs = label_and_key(wheel, spec, source_sha256=source_sha256, snapshot=snapshot,
                                         log_path=log_path)
        origin = {"origin": "source-build", "source": spec.source.location, "notes": list(spec.notes),
                  "capabilities": spec.capabilities.to_json() if spec.capabilities else None}
        return store.put(labelled, inputs, log_path=log_path, provenance=origin).entry
    except CacheError as exc:
        keep = True
        kept = f"the built wheel is kept at {wheel} (`pip install {wheel}` installs it without the cache)"
        exc.hint = f"{exc.hint}; {kept}" if exc.hint else kept
        raise
    except OSError:
        keep = True
        raise
    finally:
        if owned_dir is not None and not keep:
            remove_tree(owned_dir)
