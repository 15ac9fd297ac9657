"""Stream a wheel (or an sdist) to disk with a progress bar, hashing it on the way, and check it against its
digest. The request goes through :class:`attnforge.fetch.http.HttpClient` (proxies, the command's deadline for
the answer; once the body flows it is bounded by a stall timeout, not by the budget).

A wheel with a published sha256 (a GitHub asset's ``digest``, an index's ``#sha256=``) must match it; one
without is hashed and the hash is kept as "recorded on first use, not published" in the cache's provenance.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnforge.errors import CacheError, InstallError
from attnforge.fetch.http import FetchError, HttpClient, shown

CHUNK = 1 << 20


def stream(
    url: str,
    target: Path,
    *,
    progress: bool | None = None,
    client: HttpClient | None = None,
) -> str:
    """Download ``url`` (``http(s)://``, ``file:``) into ``target`` and return its sha256 (hex).

    ``progress`` None shows a rich progress bar on stderr when stderr is a terminal.

    Raises:
        InstallError: the download failed (the partial file is removed).
    """
    show = (sys.stderr is not None and sys.stderr.isatty()) if progress is None else progress  # 2>&-: None
    digest = hashlib.sha256()
    try:
        with (client or HttpClient()).open(url) as resp, target.open("wb") as out:
            total = int(resp.headers.get("Content-Length") or 0) or None
            with _bar(show, target.name, total) as advance:
                while chunk := resp.read(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    advance(len(chunk))
    except (FetchError, OSError) as exc:
        target.unlink(missing_ok=True)
        raise InstallError(
            f"could not download {shown(url)}", cause=str(exc),
            hint="check the network or proxy (https_proxy), or put the wheel in a --find-links directory",
        ) from None
    return digest.hexdigest()


class _bar:  # noqa: N801 - used like a function in a with statement
    def __init__(self, show: bool, name: str, total: int | None) -> None:
        self.show, self.name, self.total = show, name, total
        self.progress: Any = None

    def __enter__(self) -> Callable[[int], None]:
        if not self.show:
            return lambda n: None
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

        self.progress = Progress(
            "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
            console=Console(stderr=True), transient=True,
        )
        self.progress.__enter__()
        task = self.progress.add_task(f"download {self.name}", total=self.total)
        return lambda n: self.progress.advance(task, n)

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)


class HashSource:
    """Where the sha256 a fetched wheel was checked against came from (plain strings, shown to the user and kept
    in the cache entry's provenance as ``sha256_source``)."""

    PUBLISHED = "published"  # the index or find-links page published it (``#sha256=``): checked on download
    FIRST_USE = "recorded on first use, not published"  # nothing to check against: recorded, checked later


def check_digest(filename: str, url: str, actual: str, published: str | None) -> str:
    """:attr:`HashSource.PUBLISHED` when ``actual`` matches the published sha256, :attr:`HashSource.FIRST_USE`
    when none is published.

    Raises:
        CacheError: the published digest does not match.
    """
    if published is None:
        return HashSource.FIRST_USE
    if actual != published.lower():
        raise CacheError(
            f"{filename} does not match its published sha256; it was not installed",
            cause=f"expected {published}, got {actual} ({url})",
            hint="the file was corrupted or replaced; fetch it again from a trusted source",
        )
    return HashSource.PUBLISHED
