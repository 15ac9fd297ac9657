"""attnforge over a Ray cluster: probe every node, group nodes into machine kinds, plan the fewest artifacts,
build them once as Ray tasks, publish them to one package index, and roll them out per node.

Layout (one room per question):

- :mod:`.kinds`: which nodes are the same machine kind, and which kinds can share one wheel (pure);
- :mod:`.plan`: the fewest artifacts that serve every kind, through the one resolver (pure);
- :mod:`.cluster`: the Ray connection, the alive nodes and the per-node probe (node affinity, hard);
- :mod:`.index`: where artifacts land (a PEP 503 directory, or an index server by URL) and the lock per key;
- :mod:`.build`: the planned builds as Ray tasks (sized by the local jobs rule, retried once);
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
