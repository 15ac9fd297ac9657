"""Does a prebuilt binary fit this machine? Tags, local label, torch, CUDA, C++11 ABI, GPU archs.

Installers check only the tag triple; the torch/CUDA/ABI a wheel was built for hides in its local version
label (``2.8.3+cu12torch2.8cxx11abiTRUE``), and its GPU code in its binary. This module checks all of them
and says "built for X, you have Y" for each mismatch. Sources: toolchain-facts.md §6.1 and §8 predicates
1 and 6; install-anchors.md §4.3 (CUDA: same major, wheel minor <= torch minor, as huggingface/kernels
does) and KB-07.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from attnforge.catalog import Catalog
from attnforge.catalog.backends import Backend
from attnforge.catalog.recipes import CudaTag, TorchMatch, WheelGrammar, WheelLabel
from attnforge.catalog.toolchain import Target, TargetKind, parse_major_minor
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.types import CachedArtifact, Request, WheelRef
from attnforge.types.binary import AbiKind
from attnforge.types.cc import ComputeCapability, format_cc
from attnforge.types.local_label import LocalLabel


@dataclass(frozen=True, slots=True, kw_only=True)
class BinaryFacts:
    """What a wheel (or cached artifact) says about the build it came from."""

    filename: str
    name: str
    version: Version
    tags: frozenset[Tag]
    label: WheelLabel | None
    torch_match: TorchMatch
    archs: tuple[Target, ...]  # empty: unknown


@dataclass(frozen=True, slots=True, kw_only=True)
class Match:
    """The verdict on one binary: ``problems`` reject it, ``notes`` explain an acceptance."""

    problems: tuple[str, ...]
    notes: tuple[str, ...]
    tag_rank: int | None

    @property
    def ok(self) -> bool:
        return not self.problems


def read_wheel(filename: str, catalog: Catalog, ref: WheelRef | None = None) -> BinaryFacts:
    """Parse a wheel filename and its local label with the first grammar of its distribution that fits.

    A wheel without a label takes what its index implies (``ref.implied_*``: the PyTorch index's
    ``cu130/`` path says CUDA 13.0, its FA3 wheels use the stable ABI of torch >= 2.9).

    Raises:
        ValueError: not a valid wheel filename.
    """
    try:
        name, version, _, tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion) as exc:
        raise ValueError(str(exc)) from None
    if version.local is None and ref is not None and ref.implied_torch_match is not None:
        return BinaryFacts(
            filename=filename,
            name=name,
            version=version,
            tags=tags,
            label=WheelLabel(
                grammar=f"index:{ref.source}",
                cuda=CudaTag.parse(ref.implied_cuda) if ref.implied_cuda else None,
                torch=ref.implied_torch,
                cxx11_abi=None,
            ),
            torch_match=TorchMatch(ref.implied_torch_match),
            archs=(),
        )
    grammars = catalog.grammars_for(name)
    if ref is not None and ref.grammars:  # the source's own grammars first: labels of publishers overlap
        own = [catalog.wheel_grammars[g] for g in ref.grammars if g in catalog.wheel_grammars]
        grammars = (*own, *(g for g in grammars if g not in own))
    label, grammar = _label(grammars, version.local)
    if label is None and version.local is not None:
        built = _own_label(version.local)
        if built is not None:  # a wheel attnforge built (exported, or re-served by a team): its label says it all
            return BinaryFacts(filename=filename, name=name, version=version, tags=tags, label=built[0],
                               torch_match=built[2], archs=built[1])
    return BinaryFacts(
        filename=filename,
        name=name,
        version=version,
        tags=tags,
        label=label,
        torch_match=grammar.torch_match if grammar else TorchMatch.NONE,
        archs=grammar.archs if grammar else (),
    )


def _own_label(local: str) -> tuple[WheelLabel, tuple[Target, ...], TorchMatch] | None:
    """attnforge's own label (:mod:`attnforge.types.local_label`): torch major.minor (the wheel pins
    ``torch==X.Y.*``; a stable-ABI build's minimum, ``torch>=X.Y``), CUDA, C++11 ABI and the SASS it was built
    with."""
    try:
        own = LocalLabel.parse(local)
    except ValueError:
        return None
    label = WheelLabel(grammar="attnforge", cuda=_cuda_tag(own.cuda), torch=f"{own.torch[0]}.{own.torch[1]}",
                       cxx11_abi=own.cxx11_abi)
    return label, _sass(own.archs), TorchMatch.AT_LEAST if own.stable_abi else TorchMatch.MAJOR_MINOR


def _cuda_tag(version: str | None) -> CudaTag | None:
    """``"13.0"`` -> cu130 (None stays None)."""
    if not version:
        return None
    major, minor = parse_major_minor(version)
    return CudaTag(major=major, minor=minor)


def _sass(archs: Sequence[ComputeCapability]) -> tuple[Target, ...]:
    return tuple(Target(cc=cc, kind=TargetKind.SASS) for cc in archs)


def read_cached(artifact: CachedArtifact) -> BinaryFacts:
    """The facts of a cached artifact: its own record of torch, CUDA, ABI and archs (exact torch match; a
    stable-ABI build's torch is its minimum: any torch at or above it).

    Raises:
        ValueError: the artifact's filename is not a wheel filename.
    """
    try:
        name, version, _, tags = parse_wheel_filename(artifact.filename)
    except (InvalidWheelFilename, InvalidVersion) as exc:
        raise ValueError(str(exc)) from None
    label = WheelLabel(grammar="cache", cuda=_cuda_tag(artifact.cuda_version), torch=artifact.torch_version,
                       cxx11_abi=artifact.cxx11_abi)
    return BinaryFacts(
        filename=artifact.filename,
        name=name,
        version=version,
        tags=tags,
        label=label,
        torch_match=TorchMatch.AT_LEAST if artifact.abi == AbiKind.TORCH_STABLE else TorchMatch.EXACT,
        archs=_sass(artifact.archs),
    )


def _label(
    grammars: Sequence[WheelGrammar], local: str | None
) -> tuple[WheelLabel | None, WheelGrammar | None]:
    if local is None:
        return None, None
    for g in grammars:
        label = g.parse(local)
        if label is not None:
            return label, g
    return None, None


def target_ccs(snapshot: SystemSnapshot, request: Request) -> tuple[ComputeCapability, ...]:
    return tuple(request.archs) if request.archs else snapshot.compute_capabilities


def check_binary(
    facts: BinaryFacts,
    snapshot: SystemSnapshot,
    catalog: Catalog,
    *,
    backend: Backend | None,
    request: Request,
    supported: Sequence[Tag],
) -> Match:
    """Every reason ``facts`` cannot serve ``request`` on ``snapshot`` (all of them, not just the first)."""
    problems: list[str] = []
    notes: list[str] = []
    problems.extend(_version_problems(facts, backend, request))
    rank = min((i for i, t in enumerate(supported) if t in facts.tags), default=None)
    if rank is None:
        wheel_tags = ", ".join(sorted(str(t) for t in facts.tags))
        problems.append(
            f"wheel tags {wheel_tags} do not fit Python {snapshot.platform.python_version} on "
            f"{snapshot.platform.wheel_tag.split('-', 2)[-1]} (best tag here: {snapshot.platform.wheel_tag})"
        )
    elif all(t.platform.startswith("linux_") for t in facts.tags):
        notes.append(
            "plain linux_* tag: the glibc it needs is not stated (a too-new build fails with "
            "'GLIBC_2.xx not found')"
        )
    native = backend is None or bool(backend.native_modules)
    if native:
        problems.extend(_label_problems(facts, snapshot, notes))
    problems.extend(_arch_problems(facts, snapshot, catalog, backend=backend, request=request, notes=notes))
    return Match(problems=tuple(problems), notes=tuple(notes), tag_rank=rank)


def _version_problems(facts: BinaryFacts, backend: Backend | None, request: Request) -> list[str]:
    out = []
    if (
        backend is not None
        and backend.version_spec
        and not backend.version_spec.contains(facts.version, prereleases=True)
    ):
        out.append(f"version {facts.version} is not {backend.display_name} ({backend.version_spec})")
    if request.version:
        try:
            spec = SpecifierSet(request.version)
        except InvalidSpecifier:
            return out
        if not spec.contains(facts.version, prereleases=True):
            out.append(f"version {facts.version} does not satisfy {request.version}")
    return out


def _label_problems(facts: BinaryFacts, snapshot: SystemSnapshot, notes: list[str]) -> list[str]:
    label = facts.label
    if label is None:
        local = facts.version.local
        if local is None:
            return ["no local version label: the filename does not say which torch and CUDA it was built for"]
        return [f"local label +{local} fits no wheel grammar in the catalog: cannot tell its torch and CUDA"]
    torch = snapshot.torch
    if torch is None:
        return ["torch is not installed here, so no torch extension can load"]
    out = []
    if label.cuda is not None:
        built = f"built for CUDA {label.cuda.text()}"
        if torch.cuda_version is None:
            out.append(f"{built}, but torch {torch.version} here is a CPU build")
        else:
            have = parse_major_minor(torch.cuda_version)
            if label.cuda.major != have[0]:
                out.append(f"{built}, torch here has CUDA {torch.cuda_version} (the CUDA majors must match)")
            elif label.cuda.minor is not None and label.cuda.minor > have[1]:
                out.append(f"{built}, newer than torch's CUDA {torch.cuda_version}")
        out.extend(_driver_problems(label.cuda, snapshot))
    out.extend(_torch_problems(facts, torch.version))
    if label.torch is None or facts.torch_match is TorchMatch.NONE:
        notes.append("the filename does not say which torch it needs (pip checks Requires-Dist)")
    if (
        label.cxx11_abi is not None
        and torch.cxx11_abi is not None
        and snapshot.platform.os == "linux"
        and label.cxx11_abi != torch.cxx11_abi
    ):
        out.append(
            f"built with cxx11abi{str(label.cxx11_abi).upper()}, torch here uses "
            f"cxx11abi{str(torch.cxx11_abi).upper()} (undefined symbols at import)"
        )
    return out


def _driver_problems(cuda: CudaTag, snapshot: SystemSnapshot) -> list[str]:
    """The driver runs CUDA up to its own version (``cuda_driver_version``); a newer build cannot load."""
    for gpu in snapshot.gpus:
        if not gpu.cuda_driver_version:
            continue
        try:
            most = parse_major_minor(gpu.cuda_driver_version)
        except ValueError:
            continue
        if (cuda.major, cuda.minor or 0) > most:
            return [
                f"built for CUDA {cuda.text()}, the driver {gpu.driver_version or ''} runs CUDA up to "
                f"{gpu.cuda_driver_version} (update the driver, or take a build for an older CUDA)"
            ]
    return []


def _torch_problems(facts: BinaryFacts, torch_version: str) -> list[str]:
    label = facts.label
    if label is None or label.torch is None or facts.torch_match is TorchMatch.NONE:
        return []
    try:
        have = Version(torch_version.split("+", 1)[0])
        want = Version(label.torch.split("+", 1)[0])
    except InvalidVersion:
        return [f"cannot compare torch {torch_version} with the wheel's torch {label.torch}"]
    built = f"built for torch {label.torch}"
    if facts.torch_match is TorchMatch.MAJOR_MINOR and have.release[:2] != want.release[:2]:
        return [f"{built}, you have torch {torch_version}"]
    if facts.torch_match is TorchMatch.EXACT and have.release[:3] != ((*want.release, 0, 0))[:3]:
        return [f"{built} exactly, you have torch {torch_version}"]
    if facts.torch_match is TorchMatch.AT_LEAST and have < want:
        return [f"{built} or newer (stable ABI), you have torch {torch_version}"]
    return []


def _arch_problems(
    facts: BinaryFacts,
    snapshot: SystemSnapshot,
    catalog: Catalog,
    *,
    backend: Backend | None,
    request: Request,
    notes: list[str],
) -> list[str]:
    out = []
    ccs = target_ccs(snapshot, request)
    if backend is not None:
        for cc in ccs:
            if not backend.support.supports_cc(cc):
                out.append(
                    f"{backend.display_name} supports compute capability {backend.support.cc_range_text()}, "
                    f"the GPU is {format_cc(cc)}"
                )
    if not facts.archs:
        if backend is None or backend.native_modules:
            notes.append("the wheel's GPU archs are not known; attnforge verify checks them after install")
        return out
    if not ccs:
        notes.append("no GPU detected and no --arch: the wheel's archs were not checked")
        return out
    built = ", ".join(str(t) for t in facts.archs)
    for cc in ccs:
        fits = [str(t) for t in facts.archs if catalog.tools.runs_on(t, cc)]
        if fits and out == []:
            notes.append(f"declares code for {format_cc(cc)}: {', '.join(fits)} (checked in the binary after download)")
        if not fits:
            name = next(
                (g.name for g in snapshot.gpus if g.compute_capability == cc),
                f"compute capability {format_cc(cc)}",
            )
            out.append(
                f"has no code for {format_cc(cc)} ({name}): built for {built}; it would fail with "
                "'no kernel image is available for execution on the device'"
            )
    return out


def same_distribution(name: str, distributions: Sequence[str]) -> bool:
    want = canonicalize_name(name)
    return any(canonicalize_name(d) == want for d in distributions)
