"""What an installed backend's binary can run: read from the wheel itself, or from the cache entry it came from.

A slim build (``--head-dim 128 --dtype bf16``) writes ``capabilities: {head_dims, dtypes, backward, features}``
into its ``provenance.json`` ``details`` and, when its wheel is labelled for torch (:mod:`attnforge.cache.label`),
into the wheel's ``.dist-info`` as :data:`CAPABILITIES_FILE`, so the limits travel with the wheel to an exported
index and a teammate's install. :func:`installed_capabilities` reads that file first; for wheels installed
before it existed, it follows the distribution's ``direct_url.json`` (PEP 610) to the cache entry next to the
provenance. None when the binary has none recorded (a full build, a wheel from elsewhere: the backend's own
table applies).
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from attnforge import _serde
from attnforge.cache._provenance import PROVENANCE
from attnforge.catalog.slim import Capabilities

#: The key under provenance ``details`` (and the install's JSON) that holds a build's capabilities.
CAPABILITIES_KEY = "capabilities"
#: The file in a slim wheel's ``.dist-info`` that holds its capabilities (:meth:`Capabilities.to_json`).
CAPABILITIES_FILE = "attnforge_capabilities.json"


def capabilities_file(capabilities: Capabilities) -> dict[str, bytes]:
    """The ``.dist-info`` entry that carries ``capabilities`` in a wheel (for ``label_wheel``)."""
    return {CAPABILITIES_FILE: json.dumps(capabilities.to_json(), sort_keys=True).encode()}


def provenance_capabilities(doc: Mapping[str, Any]) -> Capabilities | None:
    """The capabilities recorded in a ``provenance.json`` document, or None (none recorded, or malformed)."""
    details = doc.get("details")
    return _parsed(details.get(CAPABILITIES_KEY) if isinstance(details, Mapping) else None)


def _parsed(raw: object) -> Capabilities | None:
    """:meth:`Capabilities.from_json` of a JSON object, None for anything else or a malformed one."""
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
        carried = _from_text(dist.read_text(CAPABILITIES_FILE))
        return carried if carried is not None else _from_direct_url(dist.read_text("direct_url.json"))
    return None


def backend_capabilities(backend_id: str) -> Capabilities | None:
    """:func:`installed_capabilities` of a catalog backend id (None for unknown ids and torch built-ins)."""
    from attnforge.catalog import load_catalog

    backend = load_catalog().backends.get(backend_id)
    return installed_capabilities(backend.distributions) if backend is not None else None


def _from_text(text: str | None) -> Capabilities | None:
    try:
        return _parsed(_serde.loads(text)) if text else None
    except ValueError:
        return None


def _from_direct_url(text: str | None) -> Capabilities | None:
    if not text:
        return None
    try:
        url = _serde.loads(text).get("url", "")
    except (ValueError, AttributeError):
        return None
    parsed = urllib.parse.urlparse(str(url))
    if parsed.scheme != "file":
        return None
    provenance = Path(urllib.request.url2pathname(parsed.path)).parent / PROVENANCE
    try:
        doc = _serde.loads(provenance.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return provenance_capabilities(doc) if isinstance(doc, Mapping) else None


__all__ = ["CAPABILITIES_KEY", "backend_capabilities", "installed_capabilities", "provenance_capabilities"]
