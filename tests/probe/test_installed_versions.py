"""One reader of installed distribution versions, used by the probe and by an adapter's requirement check."""

from __future__ import annotations

from importlib import metadata

from attnforge.backends._base import Requirement, _check_requirement
from attnforge.probe.backends import installed_versions

HAVE = metadata.version("packaging")  # a dependency of attnforge: always installed where the tests run


def test_installed_versions_skips_what_is_not_installed_and_keeps_order() -> None:
    got = list(installed_versions(("attnforge-no-such-dist", "packaging", "attnforge-no-such-dist-2")))
    assert got == [("packaging", HAVE)]


def test_requirement_check_names_the_installed_version_that_does_not_fit() -> None:
    req = Requirement(modules=("json",), distributions=("attnforge-no-such-dist", "packaging"),
                      version_spec=">=9999")
    assert _check_requirement(req) == f"packaging {HAVE} is installed; this backend needs packaging>=9999"
    assert _check_requirement(Requirement(modules=("json",), distributions=("packaging",),
                                          version_spec=">=1")) is None


def test_requirement_check_says_when_none_is_installed() -> None:
    req = Requirement(modules=("json",), distributions=("attnforge-no-such-dist",), version_spec=">=1")
    assert _check_requirement(req) == "none of attnforge-no-such-dist is installed"
