"""Whether a text is a URL attnforge can ask, read as text (no network: ``resolve/`` checks its data files with it):
one rule for ``--index-url``, a team's wheel-source ``index``, ``GITHUB_API_URL`` and the proxy variables. Each of
them once raised ``ValueError`` from ``urllib.parse`` past its own check (``http://[::1``, a port past 65535): an
internal error (CLI fuzz, 2026-12-03)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Collection


def url_problem(url: str, schemes: Collection[str] | None = None) -> str | None:
    """Why ``url`` is not a URL to ask, None when it is: it does not parse (its port read too: ``urlsplit`` alone
    passes ``http://host:99999``), its scheme is not one of ``schemes`` (any when None), or it names no host (a
    ``file`` URL needs none where ``schemes`` admits ``file``)."""
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is no number or past 65535
    except ValueError as exc:
        return str(exc)
    if schemes is not None and parts.scheme not in schemes:
        return f"unknown scheme {parts.scheme!r}" if parts.scheme else "it has no scheme"
    if not parts.hostname and not (parts.scheme == "file" and schemes is not None and "file" in schemes):
        return "it names no host"
    return None
