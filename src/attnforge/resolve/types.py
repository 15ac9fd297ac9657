"""The values the resolver produces: a :class:`Request` goes in, a :class:`Plan` with every candidate comes out.

These types are the contract between ``resolve/`` (pure decisions), ``build/`` (executes a :class:`BuildSpec`),
``cache/`` and ``install/`` (execute the chosen :class:`Candidate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnforge._compat import StrEnum
from attnforge.catalog.recipes import SourceEdit
from attnforge.catalog.slim import Capabilities, SlimPlan, SlimRequest
from attnforge.probe.snapshot import CudaToolkit
from attnforge.resolve.jobs import job_env
from attnforge.types.binary import AbiKind
from attnforge.types.cc import ComputeCapability


class CandidateKind(StrEnum):
    """Where a binary can come from, in the order the resolver tries them."""

    INSTALLED = "installed"  # already installed and its native modules load
    CACHE = "cache"  # an artifact in the local content-addressed cache
    WHEEL = "wheel"  # a prebuilt wheel from --find-links or a PEP 503 index
    SOURCE = "source"  # a build from source


class SourceKind(StrEnum):
    PYPI_SDIST = "pypi-sdist"  # the sdist of NAME==VERSION from the package index
    GIT = "git"  # git clone URL@REF, optionally a subdirectory
    PATH = "path"  # a local sdist archive or source directory
    URL = "url"  # an sdist archive at a URL


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceSpec:
    """Where the source of a build comes from."""

    kind: SourceKind
    location: str  # distribution name (pypi-sdist), URL (git/url) or path (path)
    version: str | None = None  # pypi-sdist: the exact version to fetch
    ref: str | None = None  # git: branch, tag or commit
    subdirectory: str | None = None  # git/path: where setup.py lives inside the tree
    submodules: tuple[str, ...] = ()  # git submodules the build needs, relative to the tree's root
    specifier: str = ""  # pypi-sdist without an exact version: the PEP 440 range pip takes the newest release of

    def requirement(self) -> str:
        """What pip downloads for a pypi-sdist: ``flash-attn==2.8.3``, ``flash-attn>=99`` or ``flash-attn``."""
        return f"{self.location}=={self.version}" if self.version else f"{self.location}{self.specifier}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """What the user asked for.

    Attributes:
        backend: catalog id (``flash-attn``), or a free name for ``attnforge build --source``.
        version: PEP 440 specifier text (``"==2.8.3.post2"``, ``""`` for any).
        archs: target compute capabilities; None means the detected GPUs'.
        find_links: local directories of wheels/sdists.
        index_urls: PEP 503 simple indexes.
        from_source: skip prebuilt wheels and build.
        offline: never touch the network (only cache, find-links, file:// indexes).
        source: an explicit source for the build, overriding the catalog's.
        allow_unsupported_compiler: let nvcc take a host compiler outside its supported range
            (``-allow-unsupported-compiler``, at the user's risk) instead of refusing the build.
        slim: build only these head dims / dtypes / features (``--head-dim``, ``--dtype``, ``--no-backward``,
            ``--features``); None builds everything.
        installed_capabilities: what the installed build of the backend can run, when it is a slim build (read
            from its provenance by the caller); an installed build that cannot serve the request is not used.
        installed_verify_failure: the summary of the latest ``attnforge verify`` of the installed version on
            this device when it failed (read from the records by the caller); such a build is not "installed and
            working", so the plan obtains it again and the install verifies it again.
        source_sha256: the content hash of a local ``source`` (the tree hash or the sdist's sha256 the build
            will record, read by the caller); with a ``source``, only a cached build of exactly these bytes is a
            cache candidate. None when there is no local source (a git or URL source is hashed once fetched).
        abi: how the binary must bind to torch (``--abi``): ``torch`` (built against this exact torch: for FA3,
            ``flash_api.cpp``'s unboxed ops, less host time a call than the stable ABI's, as the recipe's
            ``per_torch.gain`` says, and a rebuild whenever torch changes), ``torch-stable`` (the libtorch stable
            ABI: one binary for every torch from its minimum up); None takes either (a source build follows the
            project's own choice).
    """

    backend: str
    version: str = ""
    archs: tuple[ComputeCapability, ...] | None = None
    find_links: tuple[str, ...] = ()
    index_urls: tuple[str, ...] = ()
    from_source: bool = False
    offline: bool = False
    source: SourceSpec | None = None
    allow_unsupported_compiler: bool = False
    slim: SlimRequest | None = None
    installed_capabilities: Capabilities | None = None
    installed_verify_failure: str | None = None
    source_sha256: str | None = None
    abi: AbiKind | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildSpec:
    """Everything a source build needs, decided before any compiler runs.

    Attributes:
        name: distribution name being built (``flash-attn``).
        version: version being built when known.
        source: where the source comes from.
        archs: target compute capabilities, e.g. ``((9, 0),)``.
        max_jobs: compile processes at once in all (``MAX_JOBS``; with ``parallel_env``, split over the extension
            modules built side by side: :meth:`job_env`).
        nvcc_threads: nvcc ``--threads`` (``NVCC_THREADS``); jobs x threads <= cores.
        env: the variables to set on top of the user's environment (arch list in the backend's format,
            ``FLASH_ATTENTION_FORCE_BUILD=TRUE``, ``MAX_JOBS``, ``NVCC_THREADS``, ``CUDA_HOME``, ...).
        build_root: a short directory under which the source is unpacked and built.
        toolkit: the CUDA toolkit the build uses.
        python: the interpreter that builds (and whose torch the extension links against).
        use_sccache: route nvcc and the host compiler through sccache.
        notes: human-readable explanations of the choices (why these jobs, why these archs).
        msvc_toolset: Windows: the MSVC toolset nvcc accepts, for ``vcvarsall.bat x64 -vcvars_ver=14.39``.
        allow_unsupported_compiler: the user accepted ``-allow-unsupported-compiler`` (at their risk); on
            Windows the executor adds it when no toolset fits, on Linux ``env`` already carries it.
        capabilities: what the binary will be able to run (a slim build's head dims, dtypes, backward,
            features); None for a full build (the backend's own table applies). Goes into the provenance.
        slim: the slim build's switches, what it leaves out and both time estimates (None for a full build).
        edits: text replacements made in the laid-out tree before the build (``--abi torch``'s
            :attr:`~attnforge.catalog.recipes.Recipe.per_torch`); part of the cache key and the build tree's name.
        abi: the ABI ``--abi`` asked for (None: any); a built binary of another ABI is refused, not cached.
        parallel_env: the recipe's variable for building extension modules side by side (``EXT_PARALLEL``; "" none).
        extension_units: the translation units of each extension module the recipe builds (``parallel_env``'s sizing).
    """

    name: str
    version: str | None
    source: SourceSpec
    archs: tuple[ComputeCapability, ...]
    max_jobs: int
    nvcc_threads: int
    env: dict[str, str] = field(default_factory=dict)
    build_root: str = ""
    toolkit: CudaToolkit | None = None
    python: str = ""
    use_sccache: bool = False
    notes: tuple[str, ...] = ()
    msvc_toolset: str | None = None
    allow_unsupported_compiler: bool = False
    capabilities: Capabilities | None = None
    slim: SlimPlan | None = None
    edits: tuple[SourceEdit, ...] = ()
    abi: AbiKind | None = None
    parallel_env: str = ""
    extension_units: tuple[int, ...] = ()

    def job_env(self, *, jobs: int | None = None, threads: int | None = None) -> dict[str, str]:
        """``MAX_JOBS``, ``NVCC_THREADS`` (and ``parallel_env``) for ``jobs`` processes in all (default
        ``max_jobs``) of ``threads`` nvcc threads (default ``nvcc_threads``): :func:`attnforge.resolve.jobs.job_env`."""
        return job_env(jobs=self.max_jobs if jobs is None else jobs,
                       threads=self.nvcc_threads if threads is None else threads,
                       parallel_env=self.parallel_env, units=self.extension_units)


@dataclass(frozen=True, slots=True, kw_only=True)
class WheelRef:
    """A prebuilt wheel found in a find-links directory or an index."""

    filename: str
    url: str  # file path or URL
    sha256: str | None = None
    source: str | None = None  # the wheel_sources.toml id it was listed by (None: --find-links/--index-url)
    listed_at: str | None = None  # ISO time of the listing it came from
    grammars: tuple[str, ...] = ()  # the source's label grammars, tried first (wheel_grammars ids)
    # What the index itself says about a wheel without a local label (the PyTorch index's ``cu130/``):
    implied_cuda: str | None = None  # "130"
    implied_torch: str | None = None  # "2.9"
    implied_torch_match: str | None = None  # a TorchMatch value


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One way to satisfy a request, accepted or rejected with reasons."""

    kind: CandidateKind
    description: str
    accepted: bool
    reasons: tuple[str, ...] = ()
    wheel: WheelRef | None = None
    build: BuildSpec | None = None
    cache_key: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """The resolver's answer: every candidate in order, and the chosen one (the first accepted)."""

    request: Request
    candidates: tuple[Candidate, ...]

    @property
    def chosen(self) -> Candidate | None:
        return next((c for c in self.candidates if c.accepted), None)

    @property
    def viable(self) -> bool:
        return self.chosen is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class CachedArtifact:
    """What the resolver needs to know about one artifact in the local cache (the store owns the bytes).

    The resolver matches it like a wheel: wheel tags from ``filename``, then torch version, CUDA, C++11 ABI and
    the compute capabilities it was built for.
    """

    key: str  # the cache key, ``sha256:...``
    name: str
    version: str
    filename: str  # the wheel's filename (carries its tags)
    archs: tuple[ComputeCapability, ...]
    torch_version: str | None
    cuda_version: str | None
    cxx11_abi: bool | None
    sha256: str
    flags: tuple[str, ...] = ()  # the cache key's build flags (a slim build's FLASH_ATTENTION_DISABLE_*=TRUE)
    source_sha256: str | None = None  # the cache key's source hash (a prebuilt wheel's own sha256); None: unknown
    abi: str = "torch"  # the cache key's AbiKind: "torch-stable" serves any torch >= ``torch_version``
