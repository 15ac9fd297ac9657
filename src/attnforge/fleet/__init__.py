"""attnforge over a Ray cluster: probe every node, group nodes into machine kinds, plan the fewest artifacts,
build them once as Ray tasks, publish them to one package index, and roll them out per node.

Layout (one room per question):

- :mod:`.kinds`: which nodes are the same machine kind, and which kinds can share one wheel (pure);
- :mod:`.requests`: each backend's request for a kind, assembled exactly as ``attnforge plan`` assembles it;
- :mod:`.plan`: the fewest artifacts that serve every kind, and which nodes can build each (pure);
- :mod:`.cluster`: the Ray connection, the alive and selected nodes, the per-node probe and fingerprint;
- :mod:`.index`: where artifacts land (a PEP 503 directory, or an index server by URL) and the lock per key;
- :mod:`.kind_index`: one sub-index per kind, and the check that an index never falls back to PyPI;
- :mod:`.build`: the planned builds as Ray tasks on any capable node (sized by the local jobs rule, retried once);
- :mod:`.builder`: what runs on the builder node;
- :mod:`.rollout`: ``install`` / ``verify`` / ``bench`` per node, by the single-machine CLI in a subprocess;
- :mod:`.report`: per kind, each backend's verdict and the per-class winner over SDPA.

Ray is an optional dependency (``pip install 'attnforge[fleet]'``); :func:`require_ray` says so.
"""

from __future__ import annotations

from types import ModuleType

from attnforge.errors import AttnforgeError

INSTALL_HINT = "pip install 'attnforge[fleet]'"


class FleetError(AttnforgeError):
    """A fleet operation is not possible here (exit 1): Ray is missing or unreachable, the index is down."""


def require_ray() -> ModuleType:
    """The ``ray`` module.

    Raises:
        FleetError: ray is not installed (the hint is the install command).
    """
    try:
        import ray
    except ImportError as exc:
        raise FleetError("the fleet commands need Ray, which is not installed",
                         cause=str(exc), hint=f"install it with: {INSTALL_HINT}") from None
    return ray


__all__ = ["INSTALL_HINT", "FleetError", "require_ray"]
