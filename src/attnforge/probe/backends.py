"""The installed state of each backend asked for, read in subprocesses so a crashing import cannot hurt us.

Which backends to look for is data the caller passes (``load_catalog().backends.values()``, in practice): the
probe never loads the catalog itself. It reads six things of each, all of them :class:`attnforge.catalog.Backend`'s:
``id``, ``builtin``, ``distributions``, ``version_spec``, ``import_name``, ``native_modules``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.version import InvalidVersion, Version

from attnforge.probe.context import ProbeContext
from attnforge.probe.snapshot import InstalledBackend, NativeModule

if TYPE_CHECKING:
    from attnforge.catalog import Backend

_SCRIPT = Path(__file__).with_name("_backend_script.py")


def installed_versions(distributions: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(distribution, version text) of each of ``distributions`` that is installed, in the order given, read
    from package metadata without importing (the text may not be a valid version)."""
    for dist in distributions:
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        yield dist, version


def installed_distribution(backend: Backend) -> tuple[str, str] | None:
    """(distribution, version) of the first installed distribution that provides ``backend`` and whose version
    fits its ``version_spec`` (sageattention 1.x vs 2.x), read from package metadata without importing."""
    for dist, version in installed_versions(backend.distributions):
        try:
            if backend.version_spec and Version(version) not in backend.version_spec:
                continue
        except InvalidVersion:
            continue
        return dist, version
    return None


def collect_backends(ctx: ProbeContext, backends: Iterable[Backend], *, torch_ok: bool) -> list[InstalledBackend]:
    """One record per packaged backend of ``backends`` (built-ins are described by the torch section)."""
    packaged = [b for b in backends if not b.builtin]
    found = {b.id: installed_distribution(b) for b in packaged}

    def probe(b: Backend) -> InstalledBackend:
        dist = found[b.id]
        if dist is None:
            return InstalledBackend(backend=b.id, distribution=None, version=None, imports=None)
        return _probe_import(ctx, b, dist[0], dist[1]) if torch_ok else InstalledBackend(
            backend=b.id, distribution=dist[0], version=dist[1], imports=False,
            import_error="torch is not importable, so this backend cannot load")

    todo = [b for b in packaged if found[b.id] is not None]
    with ThreadPoolExecutor(max_workers=max(1, min(4, len(todo)))) as pool:
        probed = dict(zip([b.id for b in todo], pool.map(probe, todo), strict=True))
    return [probed.get(b.id) or probe(b) for b in packaged]


def _probe_import(ctx: ProbeContext, b: Backend, dist: str, version: str) -> InstalledBackend:
    env = {**ctx.environ, "XFORMERS_MORE_DETAILS": "1", "PYTHONWARNINGS": "ignore"}
    res = ctx.runner.run((ctx.python, str(_SCRIPT), b.import_name, *b.native_modules), env=env,
                         timeout_s=ctx.timeout_s * 4)
    try:
        data = json.loads(res.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        tail = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
        return InstalledBackend(backend=b.id, distribution=dist, version=version, imports=False,
                                import_error=f"the import crashed the interpreter: {tail}")
    return InstalledBackend(
        backend=b.id, distribution=dist, version=version, imports=data["imports"],
        import_error=data["import_error"],
        native=tuple(NativeModule(name=m["name"], ok=m["ok"], error=m["error"]) for m in data["native"]),
        details=tuple(data["details"]),
    )
