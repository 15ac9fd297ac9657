"""``install``: the whole pipeline into an interpreter: assemble the request (as ``plan`` does) -> plan -> cache hit,
hash-checked wheel or build (into the cache) -> pip/uv -> verify (:func:`attnforge.install.flow.install` with the
real collaborators of :mod:`attnforge.install.defaults`)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from attnforge._system.runner import Runner
from attnforge.errors import ResolveError
from attnforge.install.flow import InstallResult as InstallResult  # noqa: PLC0414 - the result verbs render
from attnforge.install.inputs import RequestArgs

if TYPE_CHECKING:
    from attnforge.build.progress import Reporter
    from attnforge.catalog.slim import Capabilities


def install(args: RequestArgs, *, verify: bool = True, allow_overlap: bool = False, require_hashes: bool = False,
            on_note: Callable[[str], None] | None = None, runner: Runner | None = None,
            python: str = sys.executable, reporter: Reporter | None = None) -> InstallResult:
    """Get ``args`` working in ``python``; a source build reports its progress (phases, ninja's ``[n/N]`` steps,
    heartbeats while the compiler is silent: :mod:`attnforge.build.progress`) to ``reporter`` (none when None).

    Raises:
        UsageError: bad input (see :func:`attnforge.install.inputs.assemble`).
        ResolveError: nothing can install it here; for a backend whose builds live on the PyTorch index (its
            catalog install command names ``{torch_index}``) the hint is that command for this torch's CUDA.
        CacheError, BuildError, InstallError: see :func:`attnforge.install.flow.install`.
    """
    from attnforge._system.runner import SubprocessRunner
    from attnforge.cache import Store
    from attnforge.install.defaults import index_fetcher, source_builder, subprocess_verifier
    from attnforge.install.flow import install as run_install
    from attnforge.install.inputs import assemble
    from attnforge.resolve.torch_checks import torch_cuda

    wanted = assemble(args, on_note=on_note)
    runner = runner or SubprocessRunner()
    catalog, snapshot = wanted.catalog, wanted.snapshot
    try:
        return run_install(
            wanted.request, snapshot=snapshot, store=Store(wanted.home), planner=wanted.planner,
            builder=functools.partial(source_builder, reporter=reporter),
            verifier=subprocess_verifier(runner, catalog) if verify else None,
            runner=runner, python=python, fetch_index=index_fetcher(catalog, runner),
            allow_overlap=allow_overlap, require_hashes=require_hashes,
        )
    except ResolveError as exc:
        backend = catalog.backends.get(wanted.request.backend)
        if backend is not None and "{torch_index}" in backend.install and not args.index_urls:
            # e.g. PyPI's xformers is the CUDA 12.8 build; a cu130 torch needs the PyTorch index's build
            step = backend.install.replace("{torch_index}", catalog.tools.torch_index_url(torch_cuda(snapshot)))
            exc.hint = f"this torch needs the {backend.display_name} build for its CUDA: {step}"
        raise


def installed_capabilities(backend_id: str) -> Capabilities | None:
    """What the installed build of catalog backend ``backend_id`` can run (head dims, dtypes, backward, features),
    as its slim build recorded it in its wheel or its cache entry; None for a full build, a wheel from elsewhere,
    an unknown id or a torch built-in (the backend's own capability table applies then). Reads this interpreter's
    installed distributions (:func:`attnforge.cache.capabilities.backend_capabilities`)."""
    from attnforge.cache.capabilities import backend_capabilities

    return backend_capabilities(backend_id)
