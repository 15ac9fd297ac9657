"""The frozen record of one machine: what every decision in attnforge is made from.

A snapshot is produced once by :func:`attnforge.probe.collect_snapshot` and then only read. It round-trips
through JSON (``attnforge probe --json > machine.json``; ``--snapshot machine.json`` on every deciding verb), so
any plan can be replayed on a machine that is not the one it was made for. Every section records the source it
was read from; a section that could not be read is ``None`` and ``problems`` says why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from attnforge import _serde
from attnforge._serde import DecodeError, from_jsonable, to_jsonable
from attnforge._system.files import read_user_file
from attnforge.errors import ProbeError, UsageError
from attnforge.types.cc import ComputeCapability

#: Bump when a field changes meaning or is removed; adding a field with a default keeps the version.
SCHEMA_VERSION = 1

@dataclass(frozen=True, slots=True, kw_only=True)
class PlatformInfo:
    """Operating system, interpreter and host resources.

    Attributes:
        os: ``"linux"``, ``"windows"`` or ``"darwin"`` (``sys.platform`` normalised).
        os_release: kernel release or Windows build.
        cpu_arch: ``platform.machine()``, e.g. ``x86_64``, ``AMD64``, ``aarch64``.
        python_version: ``"3.11.7"``.
        python_implementation: ``"CPython"``.
        python_executable: the interpreter attnforge runs in (and installs into).
        wheel_tag: the most specific wheel tag this interpreter accepts (first of ``packaging.tags.sys_tags()``).
        glibc: ``"2.36"`` on glibc Linux, else None.
        cores: logical CPU count.
        ram_total_bytes / ram_available_bytes: from psutil.
        disk_path / disk_free_bytes: free space where the cache lives.
        source: where these were read from.
    """

    os: str
    os_release: str
    cpu_arch: str
    python_version: str
    python_implementation: str
    python_executable: str
    wheel_tag: str
    glibc: str | None
    cores: int
    ram_total_bytes: int
    ram_available_bytes: int
    disk_path: str
    disk_free_bytes: int | None
    source: str = "platform, packaging.tags, psutil"


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuInfo:
    """One NVIDIA GPU.

    Attributes:
        index: device ordinal.
        name: marketing name, e.g. ``"NVIDIA H200"``.
        compute_capability: ``(9, 0)``.
        memory_bytes: total device memory.
        driver_version: e.g. ``"580.159.04"``.
        cuda_driver_version: the highest CUDA the driver supports, e.g. ``"13.0"`` (None when unknown).
        source: ``"nvml"``, ``"nvidia-smi"`` or ``"torch"``.
    """

    index: int
    name: str
    compute_capability: ComputeCapability
    memory_bytes: int | None
    driver_version: str | None
    cuda_driver_version: str | None
    source: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchInfo:
    """PyTorch as seen from a subprocess of the target interpreter.

    Attributes:
        version: ``"2.11.0+cu130"``.
        cuda_version: ``torch.version.cuda`` (``"13.0"``), None for CPU and ROCm builds.
        hip_version: ``torch.version.hip`` for ROCm builds.
        cxx11_abi: ``torch.compiled_with_cxx11_abi()``.
        arch_list: ``torch.cuda.get_arch_list()``, e.g. ``("sm_80", "sm_90")``; empty for CPU builds.
        cudnn_version: ``torch.backends.cudnn.version()`` (``91900``), None if absent.
        sdpa_flash_available: whether SDPA's flash backend is compiled in (None when unknown).
        cuda_available: ``torch.cuda.is_available()``.
        triton_version: the installed triton (or triton-windows) version.
        source: how it was read.
    """

    version: str
    cuda_version: str | None
    hip_version: str | None
    cxx11_abi: bool | None
    arch_list: tuple[str, ...]
    cudnn_version: int | None
    sdpa_flash_available: bool | None
    cuda_available: bool
    triton_version: str | None
    source: str = "subprocess: python -c 'import torch'"

    @property
    def is_cuda_build(self) -> bool:
        return self.cuda_version is not None

    @property
    def base_version(self) -> str:
        """``"2.11.0"`` from ``"2.11.0+cu130"``."""
        return self.version.split("+", 1)[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class CudaToolkit:
    """One CUDA toolkit with an nvcc.

    Attributes:
        path: the toolkit root (``/usr/local/cuda``).
        nvcc: the nvcc executable.
        version: ``"13.0"`` (release from ``nvcc --version``).
        build: the ``Build cuda_13.0.r13.0/compiler.36424714_0`` line.
        found_via: ``PATH``, ``CUDA_HOME``, ``CUDA_PATH``, ``glob``.
        has_headers: whether ``<path>/include/cuda_runtime.h`` exists (a wrapper script's root may lack it).
    """

    path: str
    nvcc: str
    version: str
    build: str | None
    found_via: str
    has_headers: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Compiler:
    """A host C/C++ compiler.

    Attributes:
        kind: ``gcc``, ``g++``, ``clang``, ``cl``.
        path: executable path.
        version: ``"12.2.0"``; for ``cl`` the compiler version ``"19.44.35207"``.
        banner: the first line the compiler printed about itself.
    """

    kind: str
    path: str
    version: str
    banner: str


@dataclass(frozen=True, slots=True, kw_only=True)
class VisualStudio:
    """A Visual Studio / Build Tools instance from ``vswhere -format json``.

    Attributes:
        instance_id: vswhere's ``instanceId``.
        display_name: e.g. ``"Visual Studio Build Tools 2022"``.
        version: ``installationVersion`` (``"17.14.36310.24"``).
        install_path: ``installationPath``.
        msvc_toolsets: MSVC toolset versions under ``VC\\Tools\\MSVC`` (``"14.44.35207"``).
    """

    instance_id: str
    display_name: str
    version: str
    install_path: str
    msvc_toolsets: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PythonDevFiles:
    """Whether the target interpreter can compile and link C extensions (``Python.h``; on Windows also
    ``pythonXY.lib``).

    Embedded ("portable") CPython distributions, such as ComfyUI's ``python_embeded``, ship neither
    ``include`` nor ``libs`` and mark themselves with a ``pythonXY._pth`` file next to ``python.exe``.
    Source: docs/research/install-anchors.md §8.5, §5.4; toolchain-facts.md §4.2.

    Attributes:
        include_dir: ``sysconfig.get_paths()["include"]``.
        has_python_h: ``<include_dir>/Python.h`` exists.
        libs_dir: ``<sys.base_exec_prefix>\\libs`` (Windows only; None elsewhere).
        import_lib: the import library torch's link step needs, e.g. ``python312.lib`` (Windows only).
        has_import_lib: ``<libs_dir>/<import_lib>`` exists (None off Windows).
        embedded: a ``._pth`` file sits next to the executable (the embeddable distribution's marker).
    """

    include_dir: str
    has_python_h: bool
    libs_dir: str | None
    import_lib: str | None
    has_import_lib: bool | None
    embedded: bool

    @property
    def can_build_extensions(self) -> bool:
        return self.has_python_h and self.has_import_lib is not False


@dataclass(frozen=True, slots=True, kw_only=True)
class Tool:
    """A build tool such as ninja or sccache.

    Attributes:
        name: ``ninja`` or ``sccache``.
        path: executable path.
        version: what ``--version`` printed.
        in_interpreter: whether the executable lives in this interpreter's scripts dir (None when unknown).
    """

    name: str
    path: str
    version: str | None
    in_interpreter: bool | None


@dataclass(frozen=True, slots=True, kw_only=True)
class NativeModule:
    """The result of importing one compiled module directly (``flash_attn_2_cuda``)."""

    name: str
    ok: bool
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InstalledBackend:
    """The state of one attention backend's package in the target interpreter.

    Attributes:
        backend: catalog id (``flash-attn``).
        distribution: the installed distribution name, None when not installed.
        version: installed version, None when not installed.
        imports: whether the Python package imports (None when not installed or not tried).
        import_error: the last line of the import error.
        native: the direct import of each native module.
        details: extra evidence (e.g. xFormers' ``built for`` lines), verbatim.
    """

    backend: str
    distribution: str | None
    version: str | None
    imports: bool | None
    import_error: str | None = None
    native: tuple[NativeModule, ...] = ()
    details: tuple[str, ...] = ()

    @property
    def installed(self) -> bool:
        return self.version is not None

    @property
    def native_ok(self) -> bool | None:
        if not self.native:
            return None
        return all(m.ok for m in self.native)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeProblem:
    """A section of the snapshot that could not be read, and why."""

    section: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SystemSnapshot:
    """Everything attnforge knows about one machine. See the module docstring."""

    schema_version: int = SCHEMA_VERSION
    created_at: str
    platform: PlatformInfo
    gpus: tuple[GpuInfo, ...] = ()
    torch: TorchInfo | None = None
    cuda_toolkits: tuple[CudaToolkit, ...] = ()
    compilers: tuple[Compiler, ...] = ()
    visual_studio: tuple[VisualStudio, ...] = ()
    ninja: Tool | None = None
    sccache: Tool | None = None
    long_paths_enabled: bool | None = None
    python_dev: PythonDevFiles | None = None
    env: dict[str, str] = field(default_factory=dict)
    backends: tuple[InstalledBackend, ...] = ()
    problems: tuple[ProbeProblem, ...] = ()

    # -- convenience views -------------------------------------------------------------------------------
    @property
    def compute_capabilities(self) -> tuple[ComputeCapability, ...]:
        """Distinct compute capabilities of the GPUs, in device order."""
        seen: list[ComputeCapability] = []
        for gpu in self.gpus:
            if gpu.compute_capability not in seen:
                seen.append(gpu.compute_capability)
        return tuple(seen)

    def compiler(self, kind: str) -> Compiler | None:
        return next((c for c in self.compilers if c.kind == kind), None)

    def backend(self, backend_id: str) -> InstalledBackend | None:
        return next((b for b in self.backends if b.backend == backend_id), None)

    def problem(self, section: str) -> str | None:
        return next((p.reason for p in self.problems if p.section == section), None)

    def device_key(self) -> str:
        """The records' key of this machine, as the runtime computes it (:func:`attnforge.types.device.
        device_key`): ``"NVIDIA H200|9.0|torch 2.11.0+cu130"`` for GPU 0, ``"cpu|torch 2.13.0+cpu"`` without a
        usable GPU."""
        from attnforge.types.device import device_key

        torch_version = self.torch.version if self.torch else "none"
        if not (self.gpus and self.torch is not None and self.torch.cuda_available):
            return device_key("cpu", None, torch_version)
        return device_key(self.gpus[0].name, self.gpus[0].compute_capability, torch_version)

    @property
    def primary_toolkit(self) -> CudaToolkit | None:
        """The toolkit a torch extension build would use: CUDA_HOME/CUDA_PATH first, then PATH, then globs."""
        order = {"CUDA_HOME": 0, "CUDA_PATH": 1, "PATH": 2}
        return min(self.cuda_toolkits, key=lambda t: (not t.has_headers, order.get(t.found_via, 3)), default=None)

    # -- JSON ----------------------------------------------------------------------------------------------
    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(to_jsonable(self), indent=indent, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> SystemSnapshot:
        """Parse a snapshot written by :meth:`to_json`.

        Raises:
            ProbeError: not JSON, a newer schema version, or a field that does not fit (its dotted path named).
        """
        try:
            data = _serde.loads(text)
        except ValueError as exc:
            raise ProbeError("the snapshot is not valid JSON", cause=str(exc),
                             hint="write one with: attnforge probe --json > machine.json") from None
        if not isinstance(data, dict):
            raise ProbeError("the snapshot is not a JSON object", hint="write one with: attnforge probe --json")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ProbeError(
                f"snapshot schema version {version!r} is not supported (this attnforge reads {SCHEMA_VERSION})",
                hint="re-run `attnforge probe --json` with this attnforge version",
            )
        try:
            return from_jsonable(cls, data)
        except DecodeError as exc:
            raise ProbeError(f"the snapshot does not fit the schema at {exc.path}", cause=exc.problem,
                             hint="write one with: attnforge probe --json > machine.json") from None

    @classmethod
    def load(cls, path: Path) -> SystemSnapshot:
        """Read a snapshot file.

        Raises:
            ProbeError: the file is missing or unreadable, or its content is not a snapshot.
        """
        try:  # bounded: /dev/zero given as a snapshot was read until memory ran out (CLI fuzz, 2026-12-03)
            text = read_user_file(path, what="snapshot", hint="write one with: attnforge probe --json > machine.json")
        except UsageError as exc:  # missing, unreadable, endless, not UTF-8 (a binary file is not a snapshot either)
            raise ProbeError(exc.message, cause=exc.cause, hint=exc.hint) from None
        return cls.from_json(text)
