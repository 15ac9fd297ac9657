"""One sub-index per machine kind, so a node's plain ``pip install --index-url <its URL> PROJECT`` gets its own
wheel, and the check that an index never hands an attnforge-built project to the public index.

With several torch variants of one project in one index (the same public version, local labels
``+cu130torch2.11...``, ``+cu130torch2.10...``), pip picks by version and tags, not by the node's torch, and so
may install another kind's build. A fleet directory index therefore also has ``DIR/<kind-id>/simple/``, listing
exactly the wheels built for that kind (a stable-ABI wheel under several), linking to the same files under
``DIR/artifacts/``.

An index server cannot do that: pypiserver serves all its package directories, subdirectories included, as one
``/simple/`` namespace. There a kind's wheel is named by its exact version instead (``PROJECT==0.1.0+cu130torch
2.11...``, the local label included, so exactly one file matches; pip checks it against the listing's
``#sha256=``): ``fleet build`` prints that pin per kind (:func:`kind_requirements`), and ``fleet install`` hands
each node the pin of the wheel ``attnforge plan --index-url URL --snapshot <its kind>`` takes from that index
(:func:`server_requirement`), never a bare name.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name, parse_wheel_filename

from attnforge import _serde
from attnforge._system.files import write_atomic
from attnforge.fleet import FleetError
from attnforge.fleet.index import DirIndex, Published
from attnforge.resolve.types import CandidateKind, Plan

#: Seconds to wait for the index's answer to the fallback check.
FALLBACK_CHECK_TIMEOUT_S = 10.0


def kind_url(index: DirIndex, kind: str) -> str:
    """pip's ``--index-url`` for the nodes of ``kind``: ``file://DIR/<kind>/simple``."""
    return (index.root / kind / "simple").as_uri()


def publish_kinds(index: DirIndex, wheels: Mapping[str, Sequence[Published]]) -> dict[str, str]:
    """Write one sub-index per machine kind listing exactly the wheels that kind should take (``wheels``: kind
    id -> the published wheels built for it); returns kind id -> its pip URL.

    A kind's earlier wheels of another project or version stay listed; one of the same project and public
    version is replaced (the newest build for the kind wins, so pip never chooses among torch variants). A
    wheel may be listed under several kinds (a stable-ABI wheel). Each page is written atomically.
    """
    urls = {}
    for kind, published in wheels.items():
        record = index.root / ".fleet" / "kinds" / f"{kind}.json"
        try:
            entries: dict[str, dict[str, str]] = _serde.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            entries = {}
        for p in published:
            name, version, _, _ = parse_wheel_filename(p.filename)
            project = canonicalize_name(name)
            entries = {fn: e for fn, e in entries.items()
                       if (e["project"], e["public"]) != (project, version.public)}
            entries[p.filename] = {"project": project, "public": version.public, "sha256": p.sha256,
                                   "path": index.artifact_path(p.key)}
        record.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(record, json.dumps(entries, indent=1).encode())
        _write_pages(index.root / kind / "simple", entries, up="../../../")
        urls[kind] = kind_url(index, kind)
    return urls


def _write_pages(simple: Path, entries: Mapping[str, Mapping[str, str]], *, up: str) -> None:
    """PEP 503 pages under ``simple``: one per project, links ``{up}<path>#sha256=...`` (relative to a project
    page), and the root page."""
    import html
    from urllib.parse import quote

    def page(title: str, links: list[str]) -> bytes:
        body = "\n".join(links)
        return (f'<!DOCTYPE html>\n<html>\n<head>\n<meta name="pypi:repository-version" content="1.0">\n'
                f"<title>{html.escape(title)}</title>\n</head>\n<body>\n{body}\n</body>\n</html>\n").encode()

    projects: dict[str, list[str]] = {}
    for filename, e in sorted(entries.items()):
        projects.setdefault(e["project"], []).append(
            f'<a href="{up}{quote(e["path"])}#sha256={e["sha256"]}">{html.escape(filename)}</a><br/>')
    for project, links in projects.items():
        (simple / project).mkdir(parents=True, exist_ok=True)
        write_atomic(simple / project / "index.html", page(f"Links for {project}", links))
    simple.mkdir(parents=True, exist_ok=True)
    write_atomic(simple / "index.html", page("Simple index", [f'<a href="{quote(p)}/">{html.escape(p)}</a><br/>'
                                                               for p in sorted(projects)]))


def kind_index_urls(url: str) -> Any:
    """For ``fleet install --index-url URL``: kind id -> the URL a node of that kind installs from. A fleet
    directory index (``file://DIR/simple`` with ``DIR/.fleet``) gives each kind its own sub-index
    (``file://DIR/<kind>/simple``; None for a kind it holds no wheel for); any other URL is every kind's."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        root = Path(urllib.request.url2pathname(parts.path).rstrip("/")).parent
        if (root / ".fleet" / "kinds").is_dir():
            return lambda kind: (root / kind / "simple").as_uri() if (root / kind / "simple").is_dir() else None
    return lambda _kind: url


def pinned(filename: str, name: str | None = None) -> str:
    """``PROJECT==VERSION`` of a wheel file, its local label included, so no other variant matches (PEP 440:
    ``==`` with a local label is exact); ``name`` instead of the file's project (``attnforge install`` takes the
    backend's id, which may differ from its distribution's name)."""
    project, version, _, _ = parse_wheel_filename(filename)
    return f"{name or canonicalize_name(project)}=={version}"


def kind_requirements(wheels: Mapping[str, Sequence[Published]]) -> dict[str, list[str]]:
    """kind id -> the pinned requirement of each wheel built for it (:func:`pinned`), for an index without
    sub-indexes: ``pip install --index-url URL 'PROJECT==VERSION'`` on a node of that kind takes its own wheel."""
    return {kind: sorted({pinned(p.filename) for p in published}) for kind, published in wheels.items()}


def server_requirement(plan: Plan, index_url: str, requirement: str) -> str | None:
    """The requirement a node installs from an index server (``fleet install --index-url URL``): the pin of the
    wheel that ``plan`` (``attnforge plan REQUIREMENT --index-url URL --snapshot <the node's kind>``) takes from
    that index; ``requirement`` as given when the plan takes nothing from it (already installed, a release wheel
    of a known source: the node's own ``attnforge install`` finds it the same way); None when the plan would
    build or cannot serve the kind (the index holds no wheel for it: reported, not built on every node)."""
    chosen = plan.chosen
    if chosen is None or chosen.kind is CandidateKind.SOURCE:
        return None
    wheel = chosen.wheel
    if chosen.kind is CandidateKind.WHEEL and wheel is not None and wheel.source is None and \
            urllib.parse.urlsplit(wheel.url).netloc == urllib.parse.urlsplit(index_url).netloc:
        return pinned(wheel.filename, plan.request.backend)
    return requirement


def refuse_fallback(url: str) -> None:
    """Refuse an index server that sends projects it does not hold to another index (pypiserver's default
    ``--fallback-url https://pypi.org/simple/``): a node would install a public build of an attnforge-built
    project, with whatever torch and CUDA stack its dependencies pull. Checked with a project name no index
    holds: a redirect to another host is a fallback.

    Raises:
        FleetError: the index falls back (exit 1), or does not answer.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return
    probe = url.rstrip("/") + f"/attnforge-fallback-check-{uuid.uuid4().hex[:8]}/"

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    try:
        # the redirect itself is the answer: HttpClient follows redirects, so this one request opens its own way
        urllib.request.build_opener(NoRedirect).open(probe, timeout=FALLBACK_CHECK_TIMEOUT_S).close()  # noqa: TID251
    except urllib.error.HTTPError as exc:
        target = exc.headers.get("Location", "") if exc.headers else ""
        if 300 <= exc.code < 400 and target and urllib.parse.urlsplit(
                urllib.parse.urljoin(probe, target)).netloc != parts.netloc:
            raise FleetError(f"the index at {url} falls back to {urllib.parse.urlsplit(target).netloc} for projects "
                             "it does not hold", cause=f"HTTP {exc.code} to {target}",
                             hint="nodes would install a public build instead of the fleet's: start pypiserver "
                                  "with --disable-fallback (devpi: an index without bases)") from None
    except (urllib.error.URLError, OSError) as exc:
        raise FleetError(f"the package index at {url} does not answer", cause=str(getattr(exc, "reason", exc)),
                         hint="check --index-url") from None
