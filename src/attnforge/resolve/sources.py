"""Prebuilt-wheel sources as data (``catalog/data/wheel_sources.toml``), and the pure decisions about them.

Which sources serve a backend, what URL a per-CUDA index has for this torch, how a GitHub releases listing
becomes :class:`WheelRef` rows, which catalog backend a typed name means, and how long each route is expected
to take. The network side (listing, cache of listings, download) lives in :mod:`attnforge.fetch`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from packaging.utils import canonicalize_name

from attnforge._compat import StrEnum
from attnforge._system.urls import url_problem
from attnforge.catalog import Catalog
from attnforge.catalog._check import Collector
from attnforge.catalog.recipes import TorchMatch
from attnforge.catalog.toolchain import parse_major_minor
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.types import CandidateKind, WheelRef


class SourceKind(StrEnum):
    GITHUB_RELEASES = "github-releases"
    PEP503 = "pep503"
    FIND_LINKS = "find-links"


@dataclass(frozen=True, slots=True, kw_only=True)
class WheelSource:
    """One place prebuilt wheels are published. See the header of ``wheel_sources.toml``."""

    id: str
    kind: SourceKind
    repo: str = ""
    index: str = ""
    backends: tuple[str, ...] = ()
    distributions: tuple[str, ...] = ()
    grammars: tuple[str, ...] = ()
    implied: Mapping[str, str] = field(default_factory=dict)
    covers: str = ""
    sources: tuple[str, ...] = ()

    def where(self) -> str:
        return f"github.com/{self.repo} releases" if self.repo else self.index


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteTimes:
    installed_s: float
    cache_s: float
    wheel_s: float
    source_s: Mapping[str, float]
    default_source_s: float

    def expected_s(self, kind: CandidateKind | str, backend: str) -> float | None:
        """Expected seconds of one route (None for a kind without a figure)."""
        table = {"installed": self.installed_s, "cache": self.cache_s, "wheel": self.wheel_s}
        if str(kind) == "source":
            return self.source_s.get(backend, self.default_source_s)
        return table.get(str(kind))


_BUILT = re.compile(r"^attnforge: built \S+ in ([0-9.]+) s$", re.MULTILINE)


def build_seconds(log_text: str) -> float | None:
    """The duration a build log of ``attnforge build`` ends with (``attnforge: built X.whl in 830.2 s``)."""
    found = _BUILT.findall(log_text)
    return float(found[-1]) if found else None


@dataclass(frozen=True, slots=True, kw_only=True)
class WheelSources:
    sources: Mapping[str, WheelSource]
    names: Mapping[str, str]
    route_times: RouteTimes

    def for_backend(self, backend: str) -> tuple[WheelSource, ...]:
        return tuple(s for s in self.sources.values() if backend in s.backends)


_SOURCE_FIELDS = {"kind", "repo", "index", "backends", "distributions", "grammars", "implied", "covers", "sources"}


def parse_wheel_sources(doc: Mapping[str, Any], errors: Collector) -> WheelSources:
    """Read the document, recording every bad field in ``errors``."""
    errors.schema_version(doc, 1)
    out: dict[str, WheelSource] = {}
    for sid, raw, path in errors.rows(doc, "sources", _SOURCE_FIELDS):
        kind_text = errors.get(raw, "kind", path, str)
        try:
            kind = SourceKind(kind_text)
        except ValueError:
            errors.add(f"{path}.kind", f"expected one of {[k.value for k in SourceKind]}, got {kind_text!r}")
            kind = SourceKind.PEP503
        repo = errors.get(raw, "repo", path, str, default="")
        index = errors.get(raw, "index", path, str, default="")
        if kind is SourceKind.GITHUB_RELEASES and repo.count("/") != 1:
            errors.add(f"{path}.repo", f"expected owner/name, got {repo!r}")
        if kind is not SourceKind.GITHUB_RELEASES and not _is_url(index):
            errors.add(f"{path}.index", f"expected a URL, got {index!r}")
        implied = {str(k): str(v) for k, v in errors.get(raw, "implied", path, dict, default={}).items()}
        if implied.get("torch_match", "none") not in {m.value for m in TorchMatch}:
            errors.add(f"{path}.implied.torch_match", f"not a torch match rule: {implied['torch_match']!r}")
        out[sid] = WheelSource(
            id=sid,
            kind=kind,
            repo=repo,
            index=index,
            backends=errors.str_list(raw, "backends", path, allow_empty=False),
            distributions=errors.str_list(raw, "distributions", path, allow_empty=False),
            grammars=errors.str_list(raw, "grammars", path),
            implied=implied,
            covers=errors.get(raw, "covers", path, str),
            sources=errors.str_list(raw, "sources", path, allow_empty=False),
        )
    names = {str(canonicalize_name(str(k))): str(v) for k, v in doc.get("names", {}).items()}
    rt = doc.get("route_times", {})
    times = RouteTimes(
        installed_s=float(rt.get("installed_s", 0)),
        cache_s=float(rt.get("cache_s", 15)),
        wheel_s=float(rt.get("wheel_s", 60)),
        source_s={str(k): float(v) for k, v in rt.get("source_s", {}).items()},
        default_source_s=float(rt.get("default_source_s", 1800)),
    )
    return WheelSources(sources=out, names=names, route_times=times)


@functools.cache
def load_wheel_sources(path: str | None = None) -> WheelSources:
    """The shipped ``wheel_sources.toml`` (or the file at ``path``).

    Raises:
        CatalogError: the file is unreadable or a field is bad (every bad field is listed).
    """
    from pathlib import Path

    from attnforge.catalog._check import read_toml

    file = Path(path) if path else Path(str(resources.files("attnforge.catalog").joinpath("data/wheel_sources.toml")))
    errors = Collector(file.name)
    ws = parse_wheel_sources(read_toml(file), errors)
    errors.finish()
    return ws


def check_against(ws: WheelSources, catalog: Catalog) -> list[str]:
    """Problems between the sources and the catalog: unknown backends, grammars or name targets."""
    out = []
    for s in ws.sources.values():
        out += [f"sources.{s.id}.backends: unknown backend {b!r}" for b in s.backends if b not in catalog.backends]
        out += [
            f"sources.{s.id}.grammars: unknown grammar {g!r}" for g in s.grammars if g not in catalog.wheel_grammars
        ]
    out += [f"names.{n}: unknown backend {b!r}" for n, b in ws.names.items() if b not in catalog.backends]
    return out


# -- names people type -------------------------------------------------------------------------------------
def resolve_name(typed: str, catalog: Catalog, ws: WheelSources | None = None) -> tuple[str, str | None]:
    """(backend id, a note saying which backend a typed name means, or None when it is an id).

    ``flash_attn`` -> ``flash-attn``; ``sageattention`` -> ``sageattention-2`` (never the PyPI 1.x sdist).
    A name that is neither an id nor a known alias is returned as given (``catalog.backend`` then rejects it
    with the known ids).
    """
    if typed in catalog.backends:
        return typed, None
    ws = ws or load_wheel_sources()
    canon = canonicalize_name(typed)
    target = canon if canon in catalog.backends else ws.names.get(canon)
    if target is None or target not in catalog.backends:
        return typed, None
    return target, f"{typed!r} means the catalog backend {target} ({catalog.backends[target].display_name})"


def _is_url(text: str) -> bool:
    """Whether ``text`` is an http(s) or file URL that parses, port included
    (:func:`attnforge._system.urls.url_problem`; ``{cuda_tag}`` read as a tag)."""
    return text.startswith(("https://", "http://", "file:")) and url_problem(
        text.replace("{cuda_tag}", "cu130"), ("file", "http", "https")) is None


# -- per-CUDA index URLs -----------------------------------------------------------------------------------
def torch_cuda_tag(snapshot: SystemSnapshot) -> str | None:
    """``cu130`` for torch 2.11.0+cu130; None for a CPU torch or none."""
    t = snapshot.torch
    if t is None or not t.cuda_version:
        return None
    from attnforge.resolve.preflight import cu_tag

    try:
        return cu_tag(parse_major_minor(t.cuda_version))
    except ValueError:
        return None


def index_url(source: WheelSource, snapshot: SystemSnapshot) -> str | None:
    """The source's index with ``{cuda_tag}`` filled in; None when it needs one and torch has no CUDA."""
    if "{cuda_tag}" not in source.index:
        return source.index
    tag = torch_cuda_tag(snapshot)
    return None if tag is None else source.index.replace("{cuda_tag}", tag)


def with_implied(
    refs: Iterable[WheelRef], source: WheelSource, snapshot: SystemSnapshot, listed_at: str
) -> list[WheelRef]:
    """``refs`` stamped with the source, listing time and what the index implies about label-less wheels."""
    from dataclasses import replace

    tag = torch_cuda_tag(snapshot) or ""
    cuda = source.implied.get("cuda", "").replace("{cuda_tag}", tag).removeprefix("cu") or None
    return [
        replace(
            r,
            source=source.id,
            listed_at=listed_at,
            grammars=source.grammars,
            implied_cuda=cuda,
            implied_torch=source.implied.get("torch") or None,
            implied_torch_match=source.implied.get("torch_match") or None,
        )
        for r in refs
    ]


# -- GitHub releases -> wheels -----------------------------------------------------------------------------
def wheels_from_releases(
    releases: Sequence[Mapping[str, Any]], source: WheelSource, *, listed_at: str
) -> list[WheelRef]:
    """The ``.whl`` assets of the source's distributions in a ``GET /repos/{repo}/releases`` answer.

    An asset's ``digest`` (``"sha256:..."``, published by GitHub since 2025) becomes the expected sha256.
    """
    wanted = {canonicalize_name(d) for d in source.distributions}
    out = []
    for release in releases:
        if release.get("draft"):
            continue
        for asset in release.get("assets") or ():
            name = str(asset.get("name", ""))
            if not name.endswith(".whl") or canonicalize_name(name.split("-", 1)[0]) not in wanted:
                continue
            digest = asset.get("digest")
            sha = (
                str(digest).removeprefix("sha256:")
                if isinstance(digest, str) and digest.startswith("sha256:")
                else None
            )
            out.append(
                WheelRef(
                    filename=name,
                    url=str(asset.get("browser_download_url", "")),
                    sha256=sha,
                    source=source.id,
                    listed_at=listed_at,
                    grammars=source.grammars,
                )
            )
    return out
