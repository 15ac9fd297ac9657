"""What goes into the cache key of a built wheel."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from attnforge.cache.key import CacheKey
from attnforge.install.keys import built_wheel_inputs
from attnforge.probe import SystemSnapshot
from attnforge.resolve.types import BuildSpec, SourceKind, SourceSpec
from tests._fakes import FIXTURES

H200 = SystemSnapshot.load(FIXTURES / "snapshots" / "h200_torch2.11_cu130.json")
WHEEL = Path("flash_attn-2.8.3.post2-cp312-cp312-linux_x86_64.whl")
SPEC = BuildSpec(name="flash-attn", version="2.8.3.post2",
                 source=SourceSpec(kind=SourceKind.PYPI_SDIST, location="flash-attn", version="2.8.3.post2"),
                 archs=((9, 0),), max_jobs=16, nvcc_threads=1,
                 env={"FLASH_ATTN_CUDA_ARCHS": "90", "MAX_JOBS": "16", "NVCC_THREADS": "1"})


def _key(spec: BuildSpec) -> CacheKey:
    return CacheKey.of(built_wheel_inputs(wheel=WHEEL, spec=spec, source_sha256="ab" * 32, snapshot=H200))


def test_parallelism_does_not_change_the_key_but_flags_and_archs_do() -> None:
    base = _key(SPEC)
    assert _key(dataclasses.replace(SPEC, max_jobs=2, env={**SPEC.env, "MAX_JOBS": "2"})) == base
    assert _key(dataclasses.replace(SPEC, archs=((9, 0), (12, 0)))) != base
    assert _key(dataclasses.replace(SPEC, env={**SPEC.env, "FLASH_ATTENTION_DISABLE_DROPOUT": "TRUE"})) != base
    assert _key(dataclasses.replace(SPEC, allow_unsupported_compiler=True)) != base


def test_a_built_version_outside_the_request_is_refused_before_it_is_cached(tmp_path: Path) -> None:
    """A source's version is known only once built: ``>=99`` that built 2.8.3 is an error, and nothing is
    stored (the staging directory goes either way)."""
    import pytest

    from attnforge.cache import Store
    from attnforge.errors import BuildError
    from attnforge.install.keys import check_built_version, store_built
    from tests.cache.wheelmaker import make_wheel

    wheel = make_wheel(tmp_path / "staging", name="flash-attn", version="2.8.3", tag="cp312-cp312-linux_x86_64")
    check_built_version(wheel, ">=2.8")
    check_built_version(wheel, "")
    store = Store(tmp_path / "home")
    with pytest.raises(BuildError, match=r"made flash-attn 2\.8\.3, which does not satisfy >=99"):
        store_built(store, SPEC, wheel=wheel, log_path=None, source_sha256="ab" * 32, snapshot=H200,
                    owned_dir=wheel.parent, wanted_version=">=99")
    assert store.list() == []
    assert not wheel.parent.exists()


def test_a_built_wheel_the_store_cannot_take_is_kept_and_named(tmp_path: Path) -> None:
    """A full disk (or a read-only cache) when the build's wheel is stored: the staging directory used to be
    removed anyway, throwing the build away; now it stays and the error's hint names the wheel."""
    import errno

    import pytest

    from attnforge.cache import Store
    from attnforge.errors import CacheError
    from attnforge.install.keys import store_built
    from tests.cache.wheelmaker import make_wheel

    wheel = make_wheel(tmp_path / "staging", name="flash-attn", version="2.8.3.post2", tag="cp312-cp312-linux_x86_64")
    store = Store(tmp_path / "home")

    def full(*args: object, **kwargs: object) -> object:
        raise CacheError("the cache's disk is full", hint="free some space")

    mp = pytest.MonkeyPatch()
    mp.setattr(store, "put", full)
    try:
        with pytest.raises(CacheError) as info:
            store_built(store, SPEC, wheel=wheel, log_path=None, source_sha256="ab" * 32, snapshot=H200,
                        owned_dir=wheel.parent)
        assert wheel.is_file() and f"kept at {wheel}" in (info.value.hint or "")
        assert (info.value.hint or "").startswith("free some space; ")

        def disk(*args: object, **kwargs: object) -> object:
            raise OSError(errno.ENOSPC, "No space left on device")

        mp.setattr(store, "put", disk)
        with pytest.raises(OSError):  # noqa: PT011 - the CLI names it (cli/_output.os_error)
            store_built(store, SPEC, wheel=wheel, log_path=None, source_sha256="ab" * 32, snapshot=H200,
                        owned_dir=wheel.parent)
        assert wheel.is_file()
    finally:
        mp.undo()
