"""The wheels (and sdists) in the places the user named: ``--find-links`` directories and ``--index-url``
PEP 503 indexes. The resolver takes the result as data (``resolve/`` does no I/O).

A find-links directory is read with ``os.scandir``; an index page ``<index>/<project>/`` is fetched with
:class:`attnforge.fetch.http.HttpClient` (``file://`` works offline; ``http(s)://`` is skipped with a note when
offline; ``user:password@`` in the URL is sent as basic auth and never shown). Anchors are read as PEP 503
says: the text of the link is the filename, ``#sha256=...`` in the URL is the hash.
"""

from __future__ import annotations

import html.parser
import os
import re
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from attnforge._system.urls import url_problem
from attnforge.errors import UsageError
from attnforge.fetch.http import FetchError, HttpClient, HttpStatusError, shown
from attnforge.resolve.types import Request, SourceKind, SourceSpec, WheelRef


@dataclass(frozen=True, slots=True, kw_only=True)
class Listing:
    """Wheels found, and why some places gave none (unreachable index, offline)."""

    wheels: tuple[WheelRef, ...]
    problems: tuple[str, ...] = ()


def list_find_links(directory: str) -> list[WheelRef]:
    """Every ``*.whl`` directly inside ``directory``, sorted by name.

    Raises:
        UsageError: the directory does not exist or cannot be read.
    """
    path = Path(directory).expanduser()
    try:
        # the name first: is_file() follows a link and raises for a loop, which blamed the whole folder (CLI fuzz,
        # 2026-12-03: one looping link, not even a .whl, made a folder of good wheels "unreadable")
        entries = sorted(e.name for e in os.scandir(path) if e.name.endswith(".whl") and _is_file(e))
    except OSError as exc:
        raise UsageError(
            f"cannot read --find-links directory {directory}",
            cause=exc.strerror,
            hint="pass a directory that holds .whl files",
        ) from None
    return [WheelRef(filename=name, url=str(path / name)) for name in entries]


def _is_file(entry: os.DirEntry[str]) -> bool:
    """Whether a folder entry is a file (following a link); False for a link that loops or leads nowhere."""
    try:
        return entry.is_file()
    except OSError:
        return False


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


def parse_simple_page(page: str, page_url: str) -> list[WheelRef]:
    """The wheels linked from one PEP 503 project page."""
    parser = _Anchors()
    parser.feed(page)
    out = []
    for href, text in parser.links:
        url = urllib.parse.urljoin(page_url, href)
        parsed = urllib.parse.urlsplit(url)
        name = text or urllib.parse.unquote(parsed.path.rsplit("/", 1)[-1])
        if not name.endswith(".whl"):
            continue
        sha256 = None
        if parsed.fragment.startswith("sha256="):
            sha256 = parsed.fragment.removeprefix("sha256=")
        out.append(
            WheelRef(filename=name, url=urllib.parse.urlunsplit(parsed._replace(fragment="")), sha256=sha256)
        )
    return out


def list_index(index_url: str, project: str, *, client: HttpClient | None = None) -> list[WheelRef]:
    """The wheels of ``project`` on the PEP 503 index ``index_url`` (``file:`` or ``http(s):``).

    Raises:
        FetchError: the page cannot be fetched (:class:`HttpStatusError` for an HTTP status).
    """
    page_url = f"{index_url.rstrip('/')}/{canonicalize_name(project)}/"
    if page_url.startswith("file:"):  # a local index: no network, no deadline
        path = Path(urllib.request.url2pathname(urllib.parse.urlsplit(page_url).path))
        try:
            page = (path / "index.html" if path.is_dir() else path).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise FetchError(f"{page_url}: {exc.strerror or exc}") from None
    else:
        page = (client or HttpClient()).get(page_url).body.decode("utf-8", errors="replace")
    return parse_simple_page(page, shown(page_url))


def check_index_url(index: str) -> str:
    """The scheme of the ``--index-url`` ``index``: ``file``, ``http`` or ``https``.

    Raises:
        UsageError: it cannot be parsed (``http://[::1``, a port that is no number), has another scheme, or is an
            ``http(s)`` URL that names no host (``http://``).
    """
    def refused(cause: str) -> UsageError:
        # the URL as typed, without ``user:password@`` (``shown`` needs a URL that parses)
        typed = re.sub(r"//[^/@]*@", "//", index)
        return UsageError(f"not an index URL: {typed}", cause=cause,
                          hint="give a PEP 503 index as https://HOST/simple, http://HOST/simple or file:///PATH")

    problem = url_problem(index, ("file", "http", "https"))
    if problem is not None:
        raise refused(problem)
    return urllib.parse.urlsplit(index).scheme


def list_wheels(
    find_links: Sequence[str],
    index_urls: Sequence[str],
    projects: Sequence[str],
    *,
    offline: bool,
    client: HttpClient | None = None,
) -> Listing:
    """Wheels of ``projects`` from every find-links dir and index, with a problem line per place that failed.

    Raises:
        UsageError: a find-links directory does not exist, or an index URL is not one (:func:`check_index_url`).
    """
    schemes = [check_index_url(index) for index in index_urls]  # every one refused before any is fetched
    wheels: list[WheelRef] = []
    problems: list[str] = []
    for d in find_links:
        wheels.extend(list_find_links(d))
    for index, scheme in zip(index_urls, schemes, strict=True):
        if offline and scheme != "file":
            problems.append(f"--offline: skipped the index {shown(index)}")
            continue
        client = client or HttpClient()  # one client (one deadline) for all the projects of every index
        for project in dict.fromkeys(canonicalize_name(p) for p in projects):
            try:
                wheels.extend(list_index(index, project, client=client))
            except HttpStatusError as exc:
                if exc.code != 404:
                    problems.append(f"{shown(index)}: {project}: HTTP {exc.code}")
            except FetchError as exc:
                problems.append(f"{shown(index)}: {project}: {exc}")
    return Listing(wheels=tuple(wheels), problems=tuple(problems))


def find_sdist(directories: Sequence[str], projects: Sequence[str], version_spec: str = "") -> Path | None:
    """The newest sdist (``NAME-VERSION.tar.gz``/``.zip``) of one of ``projects`` in the find-links
    ``directories`` whose version fits ``version_spec``, or None.

    This is how an offline machine builds from source: the sdist travels in the same wheelhouse as the wheels
    (``attnforge install flash-attn --find-links ./wheelhouse --offline``).
    """
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.utils import InvalidSdistFilename, parse_sdist_filename
    from packaging.version import Version

    try:
        spec = SpecifierSet(version_spec or "")
    except InvalidSpecifier:
        return None
    wanted = {canonicalize_name(p) for p in projects}
    best: tuple[Version, Path] | None = None
    for directory in directories:
        path = Path(directory).expanduser()
        if not path.is_dir():
            continue
        for entry in sorted(path.iterdir()):
            if not entry.name.endswith((".tar.gz", ".zip")):
                continue
            try:
                name, version = parse_sdist_filename(entry.name)
            except InvalidSdistFilename:
                continue
            if name in wanted and spec.contains(version, prereleases=True) and (best is None or version > best[0]):
                best = (version, entry)
    return best[1] if best else None


def with_local_sdist(request: Request, projects: Sequence[str]) -> Request:
    """``request`` with its source set to a matching sdist from its find-links directories, when there is one
    and the request names no source of its own."""
    if request.source is not None or not request.find_links:
        return request
    sdist = find_sdist(request.find_links, projects, request.version)
    if sdist is None:
        return request
    from dataclasses import replace

    from packaging.utils import parse_sdist_filename

    version = str(parse_sdist_filename(sdist.name)[1])
    return replace(request, source=SourceSpec(kind=SourceKind.PATH, location=str(sdist), version=version))
