"""Build the real fixture extension (``tests/fixtures/ext_pkg``, package ``af_ext_fixture``) into a store.

Used by the end-to-end tests and by ``scripts/bench_cache_install.py``: a real ``attnforge.build.execute`` of
a real torch C++ extension, stored with the installer's own key function.
"""

from __future__ import annotations

from pathlib import Path

from attnforge.build import execute
from attnforge.cache import Entry, Store
from attnforge.cache._files import remove_tree
from attnforge.install.keys import built_wheel_inputs
from attnforge.probe import collect_snapshot
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.types import BuildSpec, SourceKind, SourceSpec

EXT_PKG = Path(__file__).resolve().parents[1] / "fixtures" / "ext_pkg"


def fixture_spec(build_root: Path) -> BuildSpec:
    return BuildSpec(
        name="af-ext-fixture", version=None, source=SourceSpec(kind=SourceKind.PATH, location=str(EXT_PKG)),
        archs=(), max_jobs=2, nvcc_threads=1, env={"MAX_JOBS": "2"}, build_root=str(build_root),
    )


def build_fixture_into(store: Store, snapshot: SystemSnapshot | None = None) -> Entry:
    """Compile the fixture once and store the wheel with its log; returns the cache entry."""
    snapshot = snapshot or collect_snapshot(backends=())
    spec = fixture_spec(store.root / "build")
    result = execute(spec, home=store.root)
    inputs = built_wheel_inputs(wheel=result.wheel, spec=spec, source_sha256=result.source_sha256,
                                snapshot=snapshot)
    try:
        origin = {"origin": "fixture"}
        return store.put(result.wheel, inputs, log_path=result.log_path, provenance=origin).entry
    finally:
        remove_tree(result.wheel.parent)  # the builder's staging dir; the cache holds its own copy
