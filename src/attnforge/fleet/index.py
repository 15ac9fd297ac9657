"""Where the fleet's artifacts land, one lock per artifact key, and what is already there.

Two kinds of package index, both read by plain ``pip install --index-url``:

- a **directory** (the embedded default, on storage the nodes share), written as a PEP 503 index by the store's
  own export (:func:`attnforge.cache.share.export`: every artifact copied under a fresh name and renamed into
  place, the pages rewritten atomically afterwards, so a wheel is visible only whole); pip's URL is
  ``file://DIR/simple``;
- an **index server** by URL (pypiserver, devpi-server: ``http(s)://HOST/.../simple/``), uploaded to with the
  ``file_upload`` form of the PyPI legacy upload API (the one ``twine`` speaks), through the one HTTP client
  (:class:`attnforge.fetch.http.HttpClient`: proxies, the command's network deadline for pages; an upload is
  bounded by its stall timeout instead). Credentials come from ``ATTNFORGE_INDEX_USER``/
  ``ATTNFORGE_INDEX_PASSWORD`` (else ``TWINE_USERNAME``/``TWINE_PASSWORD``, else the URL's ``user:password@``)
  and are never printed: every message names the URL without its user part.

Which fleet artifact keys are published is recorded per key (``.fleet/keys/<hex>.json`` in the directory; for a
server, under ``$ATTNFORGE_HOME/fleet/published/``) so a re-run builds only what is missing, and a
``filelock`` per key makes two ``fleet build``s at once build each key once.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import filelock
from packaging.utils import canonicalize_name, parse_wheel_filename

from attnforge import _serde
from attnforge._system.files import write_atomic
from attnforge.cache.key import CacheKey, CacheKeyInputs
from attnforge.fetch.http import FetchError, HttpClient, HttpStatusError, basic_auth
from attnforge.fleet import FleetError
from attnforge.provision.cache import file_sha256 as sha256_file


@dataclass(frozen=True, slots=True, kw_only=True)
class Published:
    """One artifact in the index: its fleet key, wheel file name and sha256."""

    key: str
    filename: str
    sha256: str


class Index(Protocol):
    """A package index the fleet publishes to (see the module docstring)."""

    @property
    def pip_url(self) -> str: ...  # what ``pip install --index-url`` takes

    def lock(self, key: str) -> Any: ...  # a context manager: the lock of one artifact key

    def published(self, key: str) -> Published | None: ...

    def publish(self, key: str, wheel: Path, inputs: CacheKeyInputs, log_path: Path | None) -> Published: ...


def open_index(text: str, *, home: Path, environ: Mapping[str, str] | None = None) -> Index:
    """The index named by ``text``: an ``http(s)://`` URL is a server (checked to answer), anything else a
    directory (created).

    Raises:
        FleetError: the server does not answer, or the directory cannot be created (exit 1).
        UsageError: a URL scheme other than http(s)/file.
    """
    from attnforge.errors import UsageError

    parsed = urllib.parse.urlsplit(text)
    if parsed.scheme in ("http", "https"):
        index = ServerIndex(text, home=home, environ=os.environ if environ is None else environ)
        index.check()
        return index
    if parsed.scheme == "file":
        text = urllib.request.url2pathname(parsed.path).removesuffix("/simple")
    elif parsed.scheme and len(parsed.scheme) > 1:
        raise UsageError(f"not an index: {text!r}", hint="give a directory (shared storage) or an http(s):// URL")
    return DirIndex(Path(text), home=home)


def _hex(key: str) -> str:
    return key.removeprefix("sha256:")[:32]


class DirIndex:
    """A PEP 503 index in a directory (the store's export layout: ``simple/`` pages, ``artifacts/<digest>/``)."""

    def __init__(self, root: Path, *, home: Path) -> None:
        self.root = root.absolute()
        self.home = home
        try:
            (self.root / ".fleet" / "keys").mkdir(parents=True, exist_ok=True)
            (self.root / ".fleet" / "locks").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise FleetError(f"cannot create the index directory {self.root}", cause=str(exc),
                             hint="give --index a directory you can write to (shared by the nodes)") from None

    @property
    def pip_url(self) -> str:
        return (self.root / "simple").as_uri()

    def lock(self, key: str) -> filelock.FileLock:
        return filelock.FileLock(str(self.root / ".fleet" / "locks" / f"{_hex(key)}.lock"))

    def published(self, key: str) -> Published | None:
        """The artifact of ``key`` when its record exists and the wheel it names is intact."""
        try:
            doc = _serde.loads((self.root / ".fleet" / "keys" / f"{_hex(key)}.json").read_text(encoding="utf-8"))
            wheel = self.root / doc["path"]
            if sha256_file(wheel) != doc["sha256"]:
                return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return Published(key=key, filename=doc["filename"], sha256=doc["sha256"])

    def artifact_path(self, key: str) -> str:
        """The published wheel of ``key``, relative to the index root (``artifacts/<digest>/<file>``).

        Raises:
            OSError, ValueError, KeyError: ``key`` was not published here.
        """
        doc = _serde.loads((self.root / ".fleet" / "keys" / f"{_hex(key)}.json").read_text(encoding="utf-8"))
        return str(doc["path"])

    def publish(self, key: str, wheel: Path, inputs: CacheKeyInputs, log_path: Path | None) -> Published:
        """Export ``wheel`` into the index through a one-entry store (``cache/share.py``'s export).

        Raises:
            CacheError: the disk is full or a symlink was planted in the index (nothing partial stays visible).
        """
        from attnforge.provision.cache import publish_to_directory

        entry = publish_to_directory(wheel, inputs, dest=self.root, log_path=log_path, provenance={"fleet_key": key},
                                     scratch=self.home / "fleet" / "staging" / uuid.uuid4().hex[:12])
        rel = f"artifacts/{CacheKey.parse(entry.key).digest}/{entry.filename}"
        _check_served(self.pip_url, entry.filename, entry.sha256, lambda: sha256_file(self.root / rel))
        doc = {"key": key, "filename": entry.filename, "sha256": entry.sha256, "path": rel}
        write_atomic(self.root / ".fleet" / "keys" / f"{_hex(key)}.json", json.dumps(doc).encode())
        return Published(key=key, filename=entry.filename, sha256=entry.sha256)


class ServerIndex:
    """An index server (pypiserver, devpi-server) by URL; uploads with the legacy ``file_upload`` form."""

    def __init__(self, url: str, *, home: Path, environ: Mapping[str, str]) -> None:
        parts = urllib.parse.urlsplit(url)
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        path = parts.path.rstrip("/")
        self.simple_url = urllib.parse.urlunsplit((parts.scheme, netloc, path + "/", "", ""))
        self.upload_url = urllib.parse.urlunsplit((parts.scheme, netloc, path.removesuffix("/simple") + "/", "", ""))
        user = environ.get("ATTNFORGE_INDEX_USER") or environ.get("TWINE_USERNAME") or parts.username
        password = environ.get("ATTNFORGE_INDEX_PASSWORD") or environ.get("TWINE_PASSWORD") or parts.password
        self._auth = None if not user else basic_auth(user, password or "")
        self.state = home / "fleet" / "published" / hashlib.sha256(self.simple_url.encode()).hexdigest()[:16]
        self.state.mkdir(parents=True, exist_ok=True)

    @property
    def pip_url(self) -> str:
        return self.simple_url  # without credentials: pip takes them from its own config or keyring

    def _open(self, url: str, *, data: bytes | None = None, content_type: str | None = None) -> Any:
        """GET ``url`` (POST ``data``, not bounded by the network budget) with the credentials.

        Raises:
            FetchError: the server did not answer or answered with an error status (:class:`HttpStatusError`).
        """
        headers = {"Content-Type": content_type} if content_type else None
        return HttpClient().open(url, headers=headers, data=data, auth=self._auth, bounded=data is None)

    def check(self) -> None:
        """Raises FleetError when the index does not answer (exit 1), naming the URL without credentials."""
        try:
            with self._open(self.simple_url) as resp:
                resp.read(1)
        except (FetchError, OSError) as exc:
            raise FleetError(f"the package index at {self.simple_url} does not answer", cause=str(exc),
                             hint="start the index server (e.g. `pypi-server run -p 8080 DIR`) or check --index; "
                                  "credentials go in ATTNFORGE_INDEX_USER/ATTNFORGE_INDEX_PASSWORD") from None

    def lock(self, key: str) -> filelock.FileLock:
        return filelock.FileLock(str(self.state / f"{_hex(key)}.lock"))

    def published(self, key: str) -> Published | None:
        """The artifact of ``key`` when it was recorded here and the server still lists its file."""
        try:
            doc = _serde.loads((self.state / f"{_hex(key)}.json").read_text(encoding="utf-8"))
            project = canonicalize_name(parse_wheel_filename(doc["filename"])[0])
            with self._open(f"{self.simple_url}{project}/") as resp:
                page = resp.read().decode("utf-8", "replace")
        except (OSError, ValueError, KeyError, FetchError):
            return None
        if doc["filename"] not in page:
            return None
        return Published(key=key, filename=doc["filename"], sha256=doc["sha256"])

    def publish(self, key: str, wheel: Path, inputs: CacheKeyInputs, log_path: Path | None) -> Published:
        """Upload ``wheel`` (the server stores an upload whole or not at all); 409 (already there) is fine.

        Raises:
            FleetError: the server refused the upload (its status and reason; never the credentials).
        """
        sha = sha256_file(wheel)
        name, version, _, _ = parse_wheel_filename(wheel.name)
        fields = {":action": "file_upload", "protocol_version": "1", "name": str(name), "version": str(version),
                  "filetype": "bdist_wheel", "pyversion": "any", "sha256_digest": sha}
        body, ctype = _multipart(fields, wheel)
        try:
            with self._open(self.upload_url, data=body, content_type=ctype) as resp:
                resp.read()
        except HttpStatusError as exc:
            if exc.code != 409:
                raise FleetError(f"the index at {self.simple_url} refused {wheel.name}", cause=str(exc),
                                 hint="check the upload credentials (ATTNFORGE_INDEX_USER/ATTNFORGE_INDEX_PASSWORD)"
                                 " and that the server accepts uploads") from None
        except (FetchError, OSError) as exc:
            raise FleetError(f"the package index at {self.simple_url} does not answer",
                             cause=str(exc), hint="check the index server") from None
        _check_served(self.simple_url, wheel.name, sha, lambda: self._served_sha256(str(name), wheel.name))
        doc = {"key": key, "filename": wheel.name, "sha256": sha}
        write_atomic(self.state / f"{_hex(key)}.json", json.dumps(doc).encode())
        return Published(key=key, filename=wheel.name, sha256=sha)

    def _served_sha256(self, project: str, filename: str) -> str | None:
        """The sha256 of ``filename`` as the server serves it now (its project page's link, downloaded), None when
        the page does not list it."""
        import html.parser

        page_url = f"{self.simple_url}{canonicalize_name(project)}/"
        with self._open(page_url) as resp:
            page = resp.read().decode("utf-8", "replace")
        hrefs: list[str] = []

        class Links(html.parser.HTMLParser):
            def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
                href = dict(attrs).get("href")
                if tag == "a" and href and urllib.parse.urlsplit(href).path.rsplit("/", 1)[-1] == filename:
                    hrefs.append(href)

        Links().feed(page)
        if not hrefs:
            return None
        digest = hashlib.sha256()
        with self._open(urllib.parse.urljoin(page_url, hrefs[0].split("#", 1)[0])) as resp:
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                digest.update(chunk)
        return digest.hexdigest()


def _check_served(url: str, filename: str, sha256: str, served: Any) -> None:
    """A publish counts once the index serves the very bytes: ``served()`` (the sha256 read back, None when not
    listed) must equal ``sha256``.

    Raises:
        FleetError: the index does not list the file, or serves other bytes (exit 1 for that build).
    """
    try:
        got = served()
    except (FetchError, OSError) as exc:
        raise FleetError(f"{filename} could not be read back from the index at {url}",
                         cause=str(exc),
                         hint="check the index server and its storage") from None
    if got is None:
        raise FleetError(f"the index at {url} took {filename} but does not list it",
                         cause="the upload was answered with success, yet the project page has no such file",
                         hint="check the index server's package directory (is it writable, is it the one served?)")
    if got != sha256:
        raise FleetError(f"the index at {url} serves other bytes for {filename}",
                         cause=f"sha256 {got[:16]}... served, {sha256[:16]}... uploaded",
                         hint="another wheel of that name is already there: remove it from the index")


def _multipart(fields: Mapping[str, str], wheel: Path) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts: list[bytes] = []
    for name, value in fields.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="content"; filename="{wheel.name}"\r\n'
                 "Content-Type: application/octet-stream\r\n\r\n".encode())
    parts.append(wheel.read_bytes())
    parts.append(f"\r\n--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


@contextmanager
def scratch_dir(home: Path) -> Iterator[Path]:
    """A private temporary directory under ``$ATTNFORGE_HOME/fleet/tmp`` (removed afterwards)."""
    base = home / "fleet" / "tmp"
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        yield Path(tmp)
