"""``install``: the whole pipeline into an interpreter: plan -> cache hit, hash-checked wheel or build (into the cache)
-> pip/uv -> verify (:func:`attnforge.install.flow.install` with the real collaborators)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from attnforge.install.flow import InstallResult as InstallResult  # noqa: PLC0414 - the result verbs render
from attnforge.install.inputs import RequestArgs


def install(args: RequestArgs, *, verify: bool = True, allow_overlap: bool = False, require_hashes: bool = False,
            on_note: Callable[[str], None] | None = None, python: str = sys.executable) -> InstallResult:
    """Get ``args`` working in ``python``.

    Raises:
        UsageError: bad input.
        ResolveError: nothing can install it here (every candidate's reasons in the cause).
        CacheError, BuildError, InstallError: see :func:`attnforge.install.flow.install`.
    """
    from attnforge.install.defaults import install_request

    return install_request(args, verify=verify, allow_overlap=allow_overlap, require_hashes=require_hashes,
                           on_note=on_note, python=python)
