"""A kernel cache for candle's ``candle-flash-attn`` crate: ``libflashattention.a`` kept across builds.

candle's build script compiles the FlashAttention kernels with nvcc (15-20 minutes) into
``$CANDLE_FLASH_ATTN_BUILD_DIR`` (else ``OUT_DIR``, which ``cargo clean`` and profile changes throw away) and
skips the compile when ``libflashattention.a`` there is newer than the kernel sources. It targets one compute
capability, ``$CUDA_COMPUTE_CAP`` (``90``) or the GPU's, with whatever ``nvcc`` is on PATH.
Source: huggingface/candle ``candle-flash-attn/build.rs``; the seed project FerrisMind/candle-video caches the
library by hand and, on Windows, builds it with ``lib /OUT:libflashattention.a *.o`` when the link step fails.

attnforge points the variable at a directory keyed like a wheel (crate version, CUDA, compute capability, host
compiler, OS), so a second build with the same key reuses the library, and stores the library in the artifact
cache (kind ``static-lib``) with provenance, where ``attnforge cache export/import`` carries it to other
machines.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from attnforge._system.files import read_user_file
from attnforge._system.runner import Runner
from attnforge.cache import ArtifactKind, CacheKey, CacheKeyInputs, PutResult, Store
from attnforge.errors import BuildError, UsageError
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.types.cc import ComputeCapability, format_cc, parse_cc

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

CRATE = "candle-flash-attn"
BUILD_DIR_VAR = "CANDLE_FLASH_ATTN_BUILD_DIR"
COMPUTE_CAP_VAR = "CUDA_COMPUTE_CAP"
LIBRARY = "libflashattention.a"
_KEY_RE = re.compile(
    r"(?P<crate>[a-z0-9_-]+)==(?P<version>[^;\s]+);cuda=(?P<cuda>\d+\.\d+);cc=(?P<cc>\d+\.\d+);"
    r"cxx=(?P<cxx>[a-z+]+-[\w.]+);os=(?P<os>[a-z]+)"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelKey:
    """What changes the bytes of ``libflashattention.a``.

    Attributes:
        crate: ``candle-flash-attn``.
        version: the crate version from Cargo.lock (``0.9.1``).
        cuda_version: the release of the nvcc that compiles (``12.8``).
        compute_capability: the one target, ``(9, 0)`` (candle passes ``--gpu-architecture=sm_90``).
        host_compiler: ``gcc-12.2.0`` / ``cl-19.44.35207``: nvcc's host compiler.
        os: ``linux`` or ``windows``.
    """

    crate: str
    version: str
    cuda_version: str
    compute_capability: ComputeCapability
    host_compiler: str
    os: str

    def __str__(self) -> str:
        return (f"{self.crate}=={self.version};cuda={self.cuda_version};"
                f"cc={format_cc(self.compute_capability)};cxx={self.host_compiler};os={self.os}")

    @classmethod
    def parse(cls, text: str) -> KernelKey:
        """Inverse of ``str()``.

        Raises:
            ValueError: not a kernel key.
        """
        m = _KEY_RE.fullmatch(text.strip())
        if m is None:
            raise ValueError(f"not a kernel key: {text!r} (expected e.g. {CRATE}==0.9.1;cuda=12.8;cc=9.0;"
                             "cxx=gcc-12.2.0;os=linux)")
        return cls(crate=m["crate"], version=m["version"], cuda_version=m["cuda"],
                   compute_capability=parse_cc(m["cc"]), host_compiler=m["cxx"], os=m["os"])

    @property
    def digest(self) -> str:
        """16 hex digits of sha256 of the key: the build directory's name."""
        return hashlib.sha256(str(self).encode()).hexdigest()[:16]

    @property
    def compute_cap_value(self) -> str:
        """``(9, 0)`` -> ``"90"``: the form candle's build script parses from ``CUDA_COMPUTE_CAP``."""
        return f"{self.compute_capability[0]}{self.compute_capability[1]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class LockedCrate:
    """``candle-flash-attn`` as Cargo.lock pins it."""

    version: str
    source: str | None  # "registry+https://github.com/rust-lang/crates.io-index", "git+...", None for a path
    checksum: str | None  # sha256 of the .crate file, for registry crates


def read_cargo_lock(path: Path, crate: str = CRATE) -> LockedCrate:
    """The locked version (and checksum) of ``crate``.

    Raises:
        UsageError: the file is missing or not TOML, the crate is not in it, or it is there more than once.
    """
    text = read_user_file(path, what="the lock file", hint="run `cargo generate-lockfile` or pass --crate-version")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML", cause=str(exc)) from None
    found = [p for p in doc.get("package", []) if isinstance(p, dict) and p.get("name") == crate]
    if not found:
        raise UsageError(f"{crate} is not in {path}",
                         hint=f"add it (cargo add {crate}) or pass --crate-version")
    if len(found) > 1:
        versions = ", ".join(str(p.get("version")) for p in found)
        raise UsageError(f"{path} locks {crate} more than once ({versions})", hint="pass --crate-version")
    pkg = found[0]
    return LockedCrate(version=str(pkg.get("version", "")), source=pkg.get("source"),
                       checksum=pkg.get("checksum"))


def find_cargo_lock(start: Path) -> Path | None:
    """The ``Cargo.lock`` of the workspace ``start`` is in (searched upwards)."""
    for folder in (start, *start.parents):
        if (folder / "Cargo.lock").is_file():
            return folder / "Cargo.lock"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class CargoEnv:
    """The environment for one ``cargo build`` of ``candle-flash-attn``.

    Attributes:
        key: what the kernels are built for.
        build_dir: the keyed directory ``CANDLE_FLASH_ATTN_BUILD_DIR`` names.
        env: the variables to set.
        library: ``<build_dir>/libflashattention.a``.
        checksum: the crate's Cargo.lock checksum (None for git/path crates).
        notes: where each value came from.
    """

    key: KernelKey
    build_dir: Path
    env: dict[str, str]
    library: Path
    checksum: str | None
    notes: tuple[str, ...]


def plan_cargo_env(
    snapshot: SystemSnapshot,
    *,
    home: Path,
    crate_version: str,
    checksum: str | None = None,
    compute_capability: ComputeCapability | None = None,
    environ: Mapping[str, str] | None = None,
) -> CargoEnv:
    """Decide the kernel key and the build directory from a snapshot.

    The compute capability is, in order: ``compute_capability``, ``$CUDA_COMPUTE_CAP`` in ``environ``
    (``90``), the first GPU of the snapshot. The CUDA version is the nvcc on PATH (candle's build script runs
    ``nvcc`` from PATH), else the snapshot's primary toolkit.

    Raises:
        UsageError: no compute capability can be found, or ``$CUDA_COMPUTE_CAP`` is not one.
        BuildError: no nvcc, or no host compiler nvcc could use.
    """
    env_in = environ or {}
    notes: list[str] = []
    cc = compute_capability
    if cc is None and env_in.get(COMPUTE_CAP_VAR):
        try:
            cc = parse_cc(env_in[COMPUTE_CAP_VAR])
        except ValueError:
            raise UsageError(f"{COMPUTE_CAP_VAR}={env_in[COMPUTE_CAP_VAR]!r} is not a compute capability",
                             hint=f"use e.g. {COMPUTE_CAP_VAR}=90 for an H100, 120 for an RTX 5090") from None
        notes.append(f"compute capability {format_cc(cc)} from ${COMPUTE_CAP_VAR}")
    if cc is None and snapshot.gpus:
        cc = snapshot.gpus[0].compute_capability
        notes.append(f"compute capability {format_cc(cc)} from GPU 0 ({snapshot.gpus[0].name})")
    if cc is None:
        raise UsageError("no GPU found to build the kernels for", cause=snapshot.problem("gpus"),
                         hint="pass --compute-cap, e.g. --compute-cap 9.0")
    on_path = next((t for t in snapshot.cuda_toolkits if t.found_via == "PATH"), None)
    toolkit = on_path or snapshot.primary_toolkit
    if toolkit is None:
        raise BuildError("no nvcc found: candle's build script needs one on PATH",
                         cause=snapshot.problem("cuda_toolkits"),
                         hint="install a CUDA toolkit and put its bin on PATH")
    notes.append(f"nvcc {toolkit.version} at {toolkit.nvcc}")
    host = _host_compiler(snapshot)
    key = KernelKey(crate=CRATE, version=crate_version, cuda_version=toolkit.version, compute_capability=cc,
                    host_compiler=host, os=snapshot.platform.os)
    build_dir = home / "cargo" / CRATE / key.digest
    env = {BUILD_DIR_VAR: str(build_dir), COMPUTE_CAP_VAR: key.compute_cap_value}
    return CargoEnv(key=key, build_dir=build_dir, env=env, library=build_dir / LIBRARY, checksum=checksum,
                    notes=tuple(notes))


def _host_compiler(snapshot: SystemSnapshot) -> str:
    if snapshot.platform.os == "windows":
        cl = snapshot.compiler("cl")
        if cl is not None:
            return f"cl-{cl.version}"
        from attnforge.resolve.msvc import default_toolset

        chosen = default_toolset(snapshot)  # what a fresh vcvars64 gives: newest instance, newest toolset
        if chosen is not None:
            return f"msvc-{chosen[1]}"
        raise BuildError("no MSVC found for nvcc's host compiler",
                         hint="install Visual Studio 2022 Build Tools with the 'Desktop development with "
                              "C++' workload")
    for kind in ("g++", "gcc", "clang"):
        c = snapshot.compiler(kind)
        if c is not None:
            return f"{kind}-{c.version}"
    raise BuildError("no host C++ compiler found for nvcc", hint="install g++ (e.g. apt-get install g++)")


# -- the artifact cache -------------------------------------------------------------------------------------
def cache_inputs(plan: CargoEnv, cpu_arch: str) -> CacheKeyInputs:
    """The artifact cache's key inputs for the library (kind ``static-lib``).

    ``source_sha256`` is the crate's Cargo.lock checksum (sha256 of the .crate file) when there is one; a git
    or path crate has none, and the key text stands in for it (so two different trees of the same version
    share an entry: pass --crate-version with a suffix of your own to keep them apart, 0.9.1+mytree).
    """
    source = plan.checksum if plan.checksum and re.fullmatch(r"[0-9a-f]{64}", plan.checksum) else (
        hashlib.sha256(str(plan.key).encode()).hexdigest())
    platform = {"windows": "win_amd64", "linux": f"linux_{cpu_arch}"}.get(plan.key.os, plan.key.os)
    return CacheKeyInputs(
        name=plan.key.crate, version=plan.key.version, kind=ArtifactKind.STATIC_LIB, source_sha256=source,
        archs=(plan.key.compute_capability,), flags=(f"{COMPUTE_CAP_VAR}={plan.key.compute_cap_value}",),
        cuda_version=plan.key.cuda_version, python_tag="none", platform_tag=platform,
        toolchain=(("nvcc", plan.key.cuda_version), ("host", plan.key.host_compiler)),
    )


def restore(plan: CargoEnv, store: Store, cpu_arch: str) -> bool:
    """Before the build: create the build dir and, when it lacks the library but the cache has it, copy it in.

    The copy gets a fresh modification time, so candle's "library newer than the kernels" check passes.

    Returns:
        True when the library was restored from the cache.
    """
    plan.build_dir.mkdir(parents=True, exist_ok=True)  # newer build.rs canonicalize() it: it must exist
    if plan.library.is_file():
        return False
    key = CacheKey.of(cache_inputs(plan, cpu_arch))
    if store.find(key) is None:
        return False
    cached = store.get(key)  # re-hashes; a corrupt entry raises CacheError and is quarantined
    tmp = plan.library.with_suffix(".a.part")
    shutil.copyfile(cached, tmp)
    tmp.replace(plan.library)
    return True


def archive_objects_windows(plan: CargoEnv, runner: Runner) -> bool:
    """Windows only: build the library from the object files with ``lib.exe`` when the build left none.

    This is the documented manual step of the seed project (``lib /OUT:libflashattention.a *.o``). The object
    list is expanded here because the runner starts ``lib`` without a shell.

    Returns:
        True when ``lib`` ran and produced the library.

    Raises:
        BuildError: ``lib`` failed (its output is in the cause).
    """
    if plan.key.os != "windows" or plan.library.is_file():
        return False
    objects = sorted(p.name for p in plan.build_dir.glob("*.o"))
    if not objects:
        return False
    res = runner.run(("lib", "/NOLOGO", f"/OUT:{LIBRARY}", *objects), cwd=plan.build_dir, timeout_s=600.0)
    if not res.ok or not plan.library.is_file():
        raise BuildError(f"lib.exe could not archive {len(objects)} object files into {LIBRARY}",
                         cause=(res.output.strip().splitlines() or [f"exit {res.returncode}"])[-1],
                         hint="run it from a VS developer prompt (vcvars64.bat) so lib.exe is on PATH")
    return True


def store_library(plan: CargoEnv, store: Store, cpu_arch: str, *, log_path: Path | None = None) -> PutResult:
    """After the build: put the library into the artifact cache with its provenance.

    Returns:
        The store's ``PutResult`` (``stored=False`` when the same key was already there).

    Raises:
        BuildError: the build left no library.
    """
    if not plan.library.is_file():
        raise BuildError(f"the build left no {LIBRARY} in {plan.build_dir}",
                         hint="did cargo build candle-flash-attn (the flash-attn feature)? see its output")
    provenance = {"kernel_key": str(plan.key), "build_dir_var": BUILD_DIR_VAR,
                  "compute_cap": plan.key.compute_cap_value, "crate_checksum": plan.checksum}
    inputs = cache_inputs(plan, cpu_arch)
    return store.put(plan.library, inputs, log_path=log_path, provenance=provenance)
