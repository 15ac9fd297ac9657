"""Seams for install tests: a planner that orders candidates like the resolver, and a real pip-wheel builder.

The planner is a stand-in at the ``Planner`` seam (the real resolver needs a catalog backend); the builder is
real: it runs ``pip wheel`` on a project directory, as a source build of a pure-Python package would.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from attnforge.cache._files import sha256_file
from attnforge.resolve.types import (
    BuildSpec,
    CachedArtifact,
    Candidate,
    CandidateKind,
    Plan,
    Request,
    SourceKind,
    SourceSpec,
    WheelRef,
)


@dataclass(kw_only=True)
class OrderedPlanner:
    """Cache first, then wheels in ``find_links``, then a build of ``source`` (the resolver's order)."""

    find_links: Path | None = None
    source: Path | None = None
    published_sha256: dict[str, str] = field(default_factory=dict)  # filename -> hash an index would publish
    calls: int = 0

    def __call__(self, request: Request, *, cached: Sequence[CachedArtifact]) -> Plan:
        self.calls += 1
        name = canonicalize_name(request.backend)
        candidates = [
            Candidate(kind=CandidateKind.CACHE, description=f"cache {a.filename}", accepted=True,
                      cache_key=a.key)
            for a in cached
            if canonicalize_name(a.name) == name
        ]
        if self.find_links is not None and not request.from_source:
            for path in sorted(self.find_links.glob("*.whl")):
                if canonicalize_name(parse_wheel_filename(path.name)[0]) == name:
                    sha = self.published_sha256.get(path.name)
                    ref = WheelRef(filename=path.name, url=str(path), sha256=sha)
                    candidates.append(Candidate(kind=CandidateKind.WHEEL, description=f"wheel {path.name}",
                                                accepted=True, wheel=ref))
        if self.source is not None:
            spec = BuildSpec(name=name, version=None, source=SourceSpec(kind=SourceKind.PATH,
                             location=str(self.source)), archs=((9, 0),), max_jobs=1, nvcc_threads=1,
                             env={"MAX_JOBS": "1", "AF_FIXTURE_FLAG": "on"})
            candidates.append(Candidate(kind=CandidateKind.SOURCE, description=f"build {self.source}",
                                        accepted=True, build=spec))
        if not candidates:
            candidates.append(Candidate(kind=CandidateKind.SOURCE, description="build from PyPI sdist",
                                        accepted=False, reasons=("no nvcc on this machine",)))
        return Plan(request=request, candidates=tuple(candidates))


@dataclass(frozen=True, kw_only=True)
class Built:
    wheel_path: Path
    log_path: Path | None
    source_sha256: str
    owned_dir: Path | None = None


def pip_wheel_builder(spec: BuildSpec, *, home: Path) -> Built:
    """Build ``spec.source`` (a project directory) with ``pip wheel --no-deps --no-build-isolation``."""
    src = Path(spec.source.location)
    out = home / "builds" / hashlib.sha256(str(src).encode()).hexdigest()[:12]
    out.mkdir(parents=True, exist_ok=True)
    log = out / "build.log"
    with log.open("w") as f:
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir",
             "--wheel-dir", str(out), str(src)],
            stdout=f, stderr=subprocess.STDOUT, check=True,
        )
    [wheel] = out.glob("*.whl")
    return Built(wheel_path=wheel, log_path=log, source_sha256=tree_sha256(src))


def tree_sha256(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "egg-info" not in str(p)
                       and "build" not in p.relative_to(root).parts):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + sha256_file(path).encode())
    return digest.hexdigest()


def make_project(
    root: Path, *, name: str = "af-pure-fixture", version: str = "0.3.0", value: int = 3
) -> Path:
    """A tiny setuptools project (one module) to build from source."""
    module = canonicalize_name(name).replace("-", "_")
    (root / module).mkdir(parents=True)
    (root / module / "__init__.py").write_text(f"VALUE = {value}\n")
    (root / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{name}"
        version = "{version}"

        [tool.setuptools]
        packages = ["{module}"]
    """))
    return root


def write_wheel(
    dest: Path, *, name: str, version: str, files: dict[str, str], root_is_purelib: bool = True
) -> Path:
    """A pip-installable wheel holding exactly ``files`` (member path -> text), with a correct RECORD."""
    dest.mkdir(parents=True, exist_ok=True)
    dist = f"{canonicalize_name(name).replace('-', '_')}-{version}"
    members = {path: text.encode() for path, text in files.items()}
    members[f"{dist}.dist-info/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    members[f"{dist}.dist-info/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: attnforge-tests\nRoot-Is-Purelib: {str(root_is_purelib).lower()}\n"
        "Tag: py3-none-any\n"
    ).encode()
    record = [f"{path},sha256={_b64_sha256(data)},{len(data)}" for path, data in members.items()]
    members[f"{dist}.dist-info/RECORD"] = ("\n".join([*record, f"{dist}.dist-info/RECORD,,"]) + "\n").encode()
    path = dest / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for member, data in members.items():
            zf.writestr(member, data)
    return path


def _b64_sha256(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
