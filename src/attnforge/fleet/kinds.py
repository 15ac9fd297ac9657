"""Which nodes are the same machine kind, and which kinds can share one wheel. Pure.

A **machine kind** is what decides which binary a node needs (issue 24): the same wheel platform tag, Python
ABI, torch version + CUDA + C++11 ABI, and the same set of GPU compute capabilities. Two nodes of one kind get
the same route and the same artifact.

A **wheel key** is a kind without its compute capabilities and its glibc: the operating system, CPU
architecture, Python ABI and torch (version, CUDA, C++11 ABI). Kinds that share a wheel key can share one build
whose ``--arch`` list is the union of their compute capabilities (one fatbin). A wheel built on glibc X runs on
glibc >= X, so the build of a group runs on the member with the oldest glibc.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from attnforge.probe.snapshot import SystemSnapshot
from attnforge.provision.build import key_torch
from attnforge.types.cc import ComputeCapability


@dataclass(frozen=True, slots=True, kw_only=True)
class WheelKey:
    """What a built torch extension is bound to, apart from its compute capabilities.

    Attributes:
        os: ``linux`` / ``windows``; cpu_arch: ``x86_64``, ``AMD64``, ``aarch64``.
        python_abi: the ABI tag of the interpreter (``cp312``).
        torch_version / cuda_version / cxx11_abi: torch as probed on the node (None without torch).
    """

    os: str
    cpu_arch: str
    python_abi: str
    torch_version: str | None
    cuda_version: str | None
    cxx11_abi: bool | None

    def __str__(self) -> str:
        return f"{self.os}-{self.cpu_arch} {self.runtime()}"

    def runtime(self) -> str:
        """``cp312 torch 2.11.0+cu130 cxx11abi=true``: the Python ABI, torch and its C++ ABI."""
        torch = f"torch {self.torch_version}" if self.torch_version else "no torch"
        abi = "" if self.cxx11_abi is None else f" cxx11abi={str(self.cxx11_abi).lower()}"
        return f"{self.python_abi} {torch}{abi}"


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineKind:
    """One machine kind (see the module docstring).

    Attributes:
        platform_tag: the wheel platform tag of the node's interpreter (``manylinux_2_39_x86_64``).
        wheel: the :class:`WheelKey` (kind minus compute capabilities and glibc).
        ccs: the distinct GPU compute capabilities, sorted, e.g. ``((9, 0),)``; empty without a GPU.
    """

    platform_tag: str
    wheel: WheelKey
    ccs: tuple[ComputeCapability, ...]

    @property
    def id(self) -> str:
        """A short stable name: ``k-`` + 8 hex digits of the sha256 of :meth:`describe`."""
        return "k-" + hashlib.sha256(self.describe().encode()).hexdigest()[:8]

    def describe(self) -> str:
        """``manylinux_2_39_x86_64 cp312 torch 2.11.0+cu130 cxx11abi=true sm_90``."""
        ccs = ",".join(f"sm_{c.major}{c.minor}" for c in self.ccs) or "no GPU"
        return f"{self.platform_tag} {self.wheel.runtime()} {ccs}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """One node of the cluster and what its probe said.

    Attributes:
        node_id: Ray's node id (hex); for ``--snapshot`` files, the file name.
        address: the node's IP address (Ray's ``NodeManagerAddress``), or the file path.
        snapshot: the node's :class:`SystemSnapshot`.
        cpus / memory_bytes / gpus: the node's Ray resources (``CPU``, ``memory``, ``GPU``); 0 when unknown
            (offline planning).
        head: the node is the Ray head.
        fingerprint: what the node's probe depends on, cheaply read (:func:`attnforge.fleet.cluster.
            node_fingerprint`): a node whose fingerprint changed is probed again.
    """

    node_id: str
    address: str
    snapshot: SystemSnapshot
    cpus: float = 0.0
    memory_bytes: float = 0.0
    gpus: float = 0.0
    head: bool = False
    fingerprint: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class KindGroup:
    """The nodes of one kind, and the snapshot that stands for the kind (its first node's)."""

    kind: MachineKind
    nodes: tuple[Node, ...]

    @property
    def snapshot(self) -> SystemSnapshot:
        return self.nodes[0].snapshot


def kind_of(snapshot: SystemSnapshot) -> MachineKind:
    """The machine kind of ``snapshot``.

    The wheel tag (``cp312-cp312-manylinux_2_39_x86_64``, ``PlatformInfo.wheel_tag``) gives the Python ABI and
    the platform tag; torch gives version, CUDA and C++11 ABI as the cache keys them
    (:func:`attnforge.provision.build.key_torch`); the GPUs give the compute capabilities.
    """
    p = snapshot.platform
    _, abi, platform_tag = [*p.wheel_tag.split("-", 2), "", ""][:3]
    torch_version, cuda_version, cxx11_abi = key_torch(snapshot)
    wheel = WheelKey(os=p.os, cpu_arch=p.cpu_arch, python_abi=abi or p.wheel_tag, torch_version=torch_version,
                     cuda_version=cuda_version, cxx11_abi=cxx11_abi)
    return MachineKind(platform_tag=platform_tag or p.wheel_tag, wheel=wheel,
                       ccs=tuple(sorted(set(snapshot.compute_capabilities))))


def group_nodes(nodes: Iterable[Node]) -> tuple[KindGroup, ...]:
    """Nodes grouped by kind, kinds in order of first appearance, nodes in input order. O(nodes)."""
    groups: dict[MachineKind, list[Node]] = {}
    for node in nodes:
        groups.setdefault(kind_of(node.snapshot), []).append(node)
    return tuple(KindGroup(kind=k, nodes=tuple(v)) for k, v in groups.items())


def glibc_key(snapshot: SystemSnapshot) -> tuple[int, tuple[int, ...]]:
    """Sort key putting the oldest glibc first and no glibc last: the best builder of a shared wheel first."""
    glibc = snapshot.platform.glibc
    if glibc is None:
        return (1, ())
    return (0, tuple(int(x) for x in glibc.split(".") if x.isdigit()))
