"""What an installed backend's binary can run, read back from the cache entry it was installed from.

A slim build (``--head-dim 128 --dtype bf16``) writes ``capabilities: {head_dims, dtypes, backward, features}``
into its ``provenance.json`` ``details``; pip records the wheel it installed in the distribution's
``direct_url.json`` (PEP 610), and that wheel lies in its cache entry next to the provenance. So verify, bench
and the dispatcher ask :func:`installed_capabilities` and get the build's limits, or None when the binary has
none recorded (a full build, a wheel from an index: the backend's own table applies).
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from attnforge.cache._provenance import PROVENANCE
from attnforge.catalog.slim import Capabilities

#: The key under provenance ``details`` (and the install's JSON) that holds a build's capabilities.
CAPABILITIES_KEY = "capabilities"


def provenance_capabilities(doc: Mapping[str, Any]) -> Capabilities | None:
    """The capabilities recorded in a ``provenance.json`` document, or None (none recorded, or malformed)."""
    details = doc.get("details")
    raw = details.get(CAPABILITIES_KEY) if isinstance(details, Mapping) else None
    if not isinstance(raw, Mapping):
        return None
    try:
        return Capabilities.from_json(raw)
    except ValueError:
        return None


def installed_capabilities(distributions: Iterable[str]) -> Capabilities | None:
    """The recorded capabilities of the first of ``distributions`` installed in this interpreter, or None.

    Args:
        distributions: PyPI names that provide the backend (``Backend.distributions``: ``flash-attn-3``...).
    """
    for name in distributions:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        return _from_direct_url(dist.read_text("direct_url.json"))
    return None


def backend_capabilities(backend_id: str) -> Capabilities | None:
    """:func:`installed_capabilities` of a catalog backend id (None for unknown ids and torch built-ins)."""
    from attnforge.catalog import load_catalog

    backend = load_catalog().backends.get(backend_id)
    return installed_capabilities(backend.distributions) if backend is not None else None


def _from_direct_url(text: str | None) -> Capabilities | None:
    if not text:
        return None
    try:
        url = json.loads(text).get("url", "")
    except (ValueError, AttributeError):
        return None
    parsed = urllib.parse.urlparse(str(url))
    if parsed.scheme != "file":
        return None
    provenance = Path(urllib.request.url2pathname(parsed.path)).parent / PROVENANCE
    try:
        doc = json.loads(provenance.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return provenance_capabilities(doc) if isinstance(doc, Mapping) else None


__all__ = ["CAPABILITIES_KEY", "backend_capabilities", "installed_capabilities", "provenance_capabilities"]
