"""The concrete adapters, keyed by the catalog's backend ids, and the SDPA fallback.

``adapters()`` builds each adapter once per process from the catalog (no backend package is imported until
an adapter's ``load_error()`` or call). The fallback, PyTorch SDPA with no kernel forced, is not a catalog
backend: it is :func:`fallback`, named ``"sdpa"``.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping

from attnforge.backends._base import AdapterBase, Requirement
from attnforge.backends.adapter import BackendAdapter
from attnforge.backends.capabilities import SDPA_FALLBACK, Capabilities, load_capabilities
from attnforge.backends.external import SageAdapter, XformersAdapter
from attnforge.backends.flash import (
    FlashAttn3Adapter,
    FlashAttn4Adapter,
    FlashAttnAdapter,
    capabilities_from_build,
)
from attnforge.backends.flex import FlexAdapter
from attnforge.backends.sdpa import SDPA_KERNELS, SdpaAdapter
from attnforge.catalog import Backend, load_catalog

FALLBACK = "sdpa"

#: native modules a package hides when they fail to load, so the import check names them (install-anchors §7)
_HIDDEN_NATIVE: dict[str, tuple[str, ...]] = {"xformers": ("xformers._C",)}


def adapters() -> dict[str, BackendAdapter]:
    """One adapter per catalog backend id (``sdpa-flash`` ... ``xformers``); the same objects on every call.

    Raises:
        CatalogError: the packaged catalog or runtime table is invalid.
    """
    return dict(_built())


def fallback() -> BackendAdapter:
    """PyTorch SDPA with no kernel forced: serves every call, needs no verify record."""
    return _fallback()


@functools.cache
def _fallback() -> SdpaAdapter:
    return SdpaAdapter(name=FALLBACK, caps=SDPA_FALLBACK, requirement=Requirement(modules=("torch",)),
                       kernel=None)


@functools.cache
def _built() -> dict[str, BackendAdapter]:
    catalog = load_catalog()
    caps = load_capabilities()
    return {bid: make_adapter(backend, _with_build(backend, caps[bid])) for bid, backend in catalog.backends.items()}


def _with_build(backend: Backend, caps: Capabilities) -> Capabilities:
    """``caps`` narrowed to what the installed build compiled, when the build recorded it (a slim build's
    ``provenance.json``, read back by ``attnforge.cache.capabilities``); ``caps`` as they are otherwise."""
    if backend.builtin:
        return caps
    try:
        recorded = importlib.import_module("attnforge.cache.capabilities").installed_capabilities(
            backend.distributions)
    except (ImportError, AttributeError):  # no reader of recorded capabilities in this version
        return caps
    if recorded is None:
        return caps
    try:
        return capabilities_from_build(caps, recorded.to_json() if hasattr(recorded, "to_json") else recorded)
    except ValueError:
        return caps


def make_adapter(backend: Backend, caps: Capabilities) -> BackendAdapter:
    """The adapter class for ``backend.family``, configured from the catalog row.

    Raises:
        KeyError: an SDPA backend id the adapter does not know how to force.
    """
    req = Requirement(modules=(backend.import_name, *_HIDDEN_NATIVE.get(backend.family, ())),
                      distributions=backend.distributions, version_spec=str(backend.version_spec))
    if backend.family == "sdpa":
        return SdpaAdapter(name=backend.id, caps=caps, requirement=req, kernel=SDPA_KERNELS[backend.id])
    cls = _BY_ID.get(backend.id) or _FAMILIES[backend.family]
    return cls(name=backend.id, caps=caps, requirement=req)


_FAMILIES: dict[str, Callable[..., AdapterBase]] = {
    "flex": FlexAdapter,
    "flash-attn": FlashAttnAdapter,
    "sageattention": SageAdapter,
    "xformers": XformersAdapter,
}
#: ids of a family whose versions spell features differently
_BY_ID: dict[str, Callable[..., AdapterBase]] = {
    "flash-attn-3": FlashAttn3Adapter,
    "flash-attn-4": FlashAttn4Adapter,
}


def installed_versions(adapters: Mapping[str, object]) -> dict[str, str | None]:
    """Per backend id, the installed version of the first of its distributions that is installed (from package
    metadata, no import); None for torch's built-ins (their version is in the device key) and adapters
    without a requirement."""
    from attnforge.probe.backends import installed_versions as versions_of

    found: dict[str, str | None] = {}
    for name, adapter in adapters.items():
        dists = getattr(getattr(adapter, "requirement", None), "distributions", ())
        found[name] = next((ver for _, ver in versions_of(dists)), None) if dists else None
    return found
