"""A wheel that would overwrite another installed distribution's files is refused unless allowed.

Unit tests run on the real layouts of the two wheels seen colliding on the H200: the flash-attn-4 4.0.0b36 wheel's
member list (``tests/fixtures/wheels/``) and the flash-attn 2.8.3.post2 wheel's members as its real build log
copies them into ``build/bdist.*/wheel``. The integration tests install real wheels into a fresh venv.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnforge._system.runner import Completed, SubprocessRunner
from attnforge.build.frontend import Installer
from attnforge.cache import Store
from attnforge.cache._files import sha256_file
from attnforge.errors import InstallError
from attnforge.install.flow import install
from attnforge.install.overlap import (
    InstalledOwner,
    Overlap,
    Target,
    describe,
    find_overlaps,
    install_targets,
    installed_overlaps,
    refusal,
    warning,
)
from attnforge.install.pip import pip_install
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.types import Request
from tests.conftest import REPO
from tests.install.helpers import OrderedPlanner, write_wheel
from tests.venvs import nested_venv

FIXTURES = REPO / "tests" / "fixtures"
SITE = "/env/lib/python3.12/site-packages"
ROOTS = {"purelib": SITE, "platlib": SITE, "scripts": "/env/bin", "data": "/env"}


def fa4_members() -> list[str]:
    """The flash-attn-4 4.0.0b36 wheel's members (``ZipFile.namelist()`` of the PyPI wheel)."""
    text = (FIXTURES / "wheels" / "flash_attn_4-4.0.0b36-py3-none-any.namelist.txt").read_text()
    return text.split()


def fa2_members() -> list[str]:
    """The flash-attn 2.8.3.post2 wheel's members, as the real H200 build copied them into the wheel."""
    log = (FIXTURES / "logs" / "flash_attn-2.8.3.post2_sm90_cu130_success.log").read_text(errors="replace")
    files = re.findall(r"copying build/lib\.[^/\s]+/(\S+) -> build/bdist\.[^/\s]+/wheel", log)
    return [*files, "flash_attn-2.8.3.post2.dist-info/METADATA", "flash_attn-2.8.3.post2.dist-info/RECORD"]


def installed(name: str, version: str, members: Sequence[str], *, root_is_purelib: bool) -> InstalledOwner:
    """What a distribution's RECORD says once pip installed ``members`` under ``SITE``."""
    files = [f"{SITE}/{t.path}" for t in install_targets(members, root_is_purelib=root_is_purelib)]
    files += [f"{SITE}/{m}" for m in members if ".dist-info/" in m]
    return InstalledOwner(name=name, version=version, files=tuple(files))


@pytest.mark.parametrize(
    ("members", "purelib", "expected"),
    [
        pytest.param(["pkg/__init__.py", "pkg/sub/"], True, [Target(scheme="purelib", path="pkg/__init__.py")],
                     id="root-purelib-dirs-skipped"),
        pytest.param(["pkg/_C.so"], False, [Target(scheme="platlib", path="pkg/_C.so")], id="root-platlib"),
        pytest.param(["pkg/__pycache__/m.cpython-311.pyc", "pkg-1.0.dist-info/RECORD"], True, [],
                     id="pycache-and-dist-info-never"),
        pytest.param(["pkg-1.0.data/scripts/tool", "pkg-1.0.data/purelib/x/y.py", "pkg-1.0.data/data/share/z"],
                     False, [Target(scheme="scripts", path="tool"), Target(scheme="purelib", path="x/y.py"),
                             Target(scheme="data", path="share/z")], id="data-schemes"),
        pytest.param(["pkg-1.0.data/headers/pkg.h", "pkg-1.0.data/unknown/f"], True, [],
                     id="headers-are-per-distribution"),
    ],
)
def test_wheel_members_map_to_their_install_schemes(
    members: list[str], purelib: bool, expected: list[Target]
) -> None:
    assert list(install_targets(members, root_is_purelib=purelib)) == expected


def test_flash_attn_2_over_flash_attn_4_shares_only_the_cute_files() -> None:
    fa4 = installed("flash-attn-4", "4.0.0b36", fa4_members(), root_is_purelib=True)
    fa2 = install_targets(fa2_members(), root_is_purelib=False)
    [overlap] = find_overlaps(fa2, roots=ROOTS, owners=[fa4], name="flash-attn")
    assert overlap.distribution == "flash-attn-4"
    assert all(f.startswith("flash_attn/cute/") for f in overlap.files)
    assert set(overlap.files) == {t.path for t in fa2} & {m for m in fa4_members() if ".dist-info/" not in m}
    assert len(overlap.files) == 20  # of FA2's 21 cute files (hopper_helpers.py is FA2's alone)
    # FA4's wheel has no flash_attn/__init__.py (a PEP 420 namespace to it): the shared directory is no overlap.
    assert "flash_attn/__init__.py" in {t.path for t in fa2}
    assert "flash_attn/__init__.py" not in fa4_members()


def test_flash_attn_4_over_flash_attn_2_names_flash_attn() -> None:
    fa2 = installed("flash_attn", "2.8.3.post2", fa2_members(), root_is_purelib=False)
    fa4 = install_targets(fa4_members(), root_is_purelib=True)
    [overlap] = find_overlaps(fa4, roots=ROOTS, owners=[fa2], name="flash-attn-4")
    assert (overlap.distribution, len(overlap.files)) == ("flash_attn", 20)
    text = describe(overlap, name="flash-attn-4", version="4.0.0b36", installed=False)
    assert text.startswith("flash-attn-4 4.0.0b36 ships flash_attn/cute/ which flash_attn 2.8.3.post2 installed: "
                           "installing it replaces 20 of flash_attn's files (flash_attn/cute/__init__.py, ")


@pytest.mark.parametrize(
    ("owner", "roots"),
    [
        pytest.param(InstalledOwner(name="Flash_Attn", version="2.8.2", files=(f"{SITE}/flash_attn/cute/mask.py",)),
                     ROOTS, id="own-distribution-is-a-reinstall"),
        pytest.param(InstalledOwner(name="other", version="1", files=(f"{SITE}/flash_attn/cute/mask.py",)),
                     {**ROOTS, "platlib": "/venv/lib/python3.12/site-packages"}, id="another-site-packages"),
        pytest.param(InstalledOwner(name="other", version="1", files=(f"{SITE}/flash_attn/cute/",)),
                     ROOTS, id="a-shared-directory"),
    ],
)
def test_what_is_not_an_overlap(owner: InstalledOwner, roots: dict[str, str]) -> None:
    targets = install_targets(["flash_attn/cute/mask.py"], root_is_purelib=False)
    assert find_overlaps(targets, roots=roots, owners=[owner], name="flash-attn") == ()


def test_scripts_are_compared_at_their_resolved_path() -> None:
    owner = InstalledOwner(name="tool-a", version="1", files=(f"{SITE}/../../../bin/tool",))
    targets = install_targets(["b-1.data/scripts/tool"], root_is_purelib=True)
    [overlap] = find_overlaps(targets, roots=ROOTS, owners=[owner], name="b")
    assert overlap.files == ("scripts/tool",)


relpaths = st.lists(st.sampled_from(["a/x.py", "a/y.py", "a/b/z.py", "c.py", "a/__pycache__/x.pyc", "d/e.so"]),
                    unique=True)


@given(wheel=relpaths, owned_a=relpaths, owned_b=relpaths)
def test_overlaps_are_exactly_the_shared_files_per_owner(
    wheel: list[str], owned_a: list[str], owned_b: list[str]
) -> None:
    targets = install_targets(wheel, root_is_purelib=True)
    owners = [InstalledOwner(name=n, version="1", files=tuple(f"{SITE}/{p}" for p in owned))
              for n, owned in (("a-dist", owned_a), ("b-dist", owned_b))]
    found = {o.distribution: set(o.files) for o in find_overlaps(targets, roots=ROOTS, owners=owners, name="w")}
    for owner, owned in (("a-dist", owned_a), ("b-dist", owned_b)):
        shared = {p for p in set(wheel) & set(owned) if "__pycache__" not in p}
        assert found.get(owner, set()) == shared


def test_the_refusal_names_the_owner_the_files_and_both_ways_out() -> None:
    overlap = Overlap(distribution="flash-attn-4", version="4.0.0b36",
                      files=tuple(f"flash_attn/cute/m{i}.py" for i in range(5)))
    pip = Installer(kind="pip", python="/env/bin/python")
    err = refusal([overlap], name="flash-attn", version="2.8.3.post2", installer=pip)
    assert err.message == ("refusing to install flash-attn 2.8.3.post2: it would overwrite files of "
                           "flash-attn-4 4.0.0b36")
    assert "replaces 5 of flash-attn-4's files (flash_attn/cute/m0.py, flash_attn/cute/m1.py, " \
           "flash_attn/cute/m2.py, ...)" in (err.cause or "")
    assert "--allow-overlap" in (err.hint or "")
    assert "/env/bin/python -m pip install --force-reinstall --no-deps flash-attn-4==4.0.0b36" in (err.hint or "")
    assert "/env/bin/python -m pip uninstall flash-attn-4" in (err.hint or "")
    after = warning([overlap], name="flash-attn", version="2.8.3.post2", installer=pip)
    assert "installing it replaced 5 of flash-attn-4's files" in after
    uv = Installer(kind="uv", python="/env/bin/python", uv="/usr/bin/uv")  # a uv venv: the commands are uv's
    assert ("/usr/bin/uv pip install --python /env/bin/python --reinstall --no-deps flash-attn-4==4.0.0b36"
            in warning([overlap], name="flash-attn", version="2.8.3.post2", installer=uv))
    assert "/usr/bin/uv pip uninstall --python /env/bin/python flash-attn-4" in (
        refusal([overlap], name="flash-attn", version="2.8.3.post2", installer=uv).hint or "")


class OneReply:
    """The Runner seam answering every call with one fixed result."""

    def __init__(self, stdout: str, returncode: int = 0) -> None:
        self.reply = (stdout, returncode)
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
            timeout_s: float | None = None) -> Completed:
        self.calls.append(tuple(argv))
        return Completed(argv=tuple(argv), returncode=self.reply[1], stdout=self.reply[0])


@pytest.mark.parametrize(
    ("stdout", "returncode"),
    [
        pytest.param("Traceback (most recent call last):\nSyntaxError", 1, id="interpreter-failed"),
        pytest.param("not json", 0, id="garbage"),
        pytest.param('{"roots": {}}', 0, id="missing-owners"),
    ],
)
def test_an_unreadable_answer_is_an_install_error(tmp_path: Path, stdout: str, returncode: int) -> None:
    wheel = write_wheel(tmp_path, name="w", version="1", files={"w/__init__.py": ""})
    with pytest.raises(InstallError, match="could not read the installed files of /env/bin/python"):
        installed_overlaps(wheel, name="w", python="/env/bin/python", runner=OneReply(stdout, returncode))


def test_the_check_is_one_subprocess_asking_about_the_wheels_top_level_names(tmp_path: Path) -> None:
    wheel = write_wheel(tmp_path, name="w", version="1", files={"w/__init__.py": "", "w/m.py": "", "top.py": ""})
    runner = OneReply('{"roots": {"purelib": "/s"}, "owners": [{"name": "o", "version": "2", "files": ["/s/top.py"]}]}')
    found = installed_overlaps(wheel, name="w", python="/env/bin/python", runner=runner)
    assert found == (Overlap(distribution="o", version="2", files=("top.py",)),)
    [call] = runner.calls
    assert call[-1] == '{"purelib": ["top.py", "w"]}'


class SiteWithTorch:
    """The Runner seam for an interpreter whose torch 2.13.0+cpu owns ``/s/torch/version.py``; pip must not run."""

    def __init__(self) -> None:
        self.pip_ran = False

    def run(self, argv: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
            timeout_s: float | None = None) -> Completed:
        self.pip_ran |= "pip" in argv
        if "sysconfig" in argv[2]:
            out = {"roots": {"purelib": "/s"},
                   "owners": [{"name": "torch", "version": "2.13.0+cpu", "files": ["/s/torch/version.py"]}]}
        else:
            out = {name: "2.13.0+cpu" if name == "torch" else None for name in argv[3:]}
        return Completed(argv=tuple(argv), returncode=0, stdout=json.dumps(out))


def test_the_torch_stack_is_never_overwritten_even_when_allowed(tmp_path: Path) -> None:
    wheel = write_wheel(tmp_path, name="af-bad", version="1", files={"torch/version.py": ""})
    runner = SiteWithTorch()
    with pytest.raises(InstallError, match="never changes the torch stack, not even with --allow-overlap"):
        pip_install(wheel, runner=runner, python="/env/bin/python", allow_overlap=True)
    assert not runner.pip_ran


# -- real installs into a fresh venv ------------------------------------------------------------------------
@pytest.fixture
def venv_python(tmp_path: Path) -> str:
    return nested_venv(tmp_path / "venv")


def shared_module(python: str) -> str:
    done = subprocess.run([python, "-c", "import af_shared.core as m; print(m.OWNER)"],
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "import failed"


def pair(dist: Path) -> tuple[Path, Path]:
    """A ships af_shared/; B ships its own package and af_shared/core.py, which A installed."""
    a = write_wheel(dist, name="af-overlap-a", version="1.0", files={
        "af_shared/__init__.py": "", "af_shared/core.py": 'OWNER = "a"\n'})
    b = write_wheel(dist, name="af-overlap-b", version="2.0", files={
        "af_overlap_b/__init__.py": "", "af_shared/core.py": 'OWNER = "b"\n'})
    return a, b


def installed_dists(python: str) -> set[str]:
    code = "import importlib.metadata as m; print(sorted(d.metadata['Name'] for d in m.distributions()))"
    return set(eval(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout))  # noqa: S307


@pytest.mark.integration
def test_an_overlapping_wheel_is_refused_then_allowed(venv_python: str, tmp_path: Path) -> None:
    a, b = pair(tmp_path / "dist")
    runner = SubprocessRunner()
    first = pip_install(a, runner=runner, python=venv_python)
    assert first.overlaps == ()
    with pytest.raises(InstallError) as info:
        pip_install(b, runner=runner, python=venv_python)
    err = info.value
    assert err.message == "refusing to install af-overlap-b 2.0: it would overwrite files of af-overlap-a 1.0"
    assert "installing it replaces 1 of af-overlap-a's files (af_shared/core.py), and uninstalling either one " \
           "later deletes it for both" in (err.cause or "")
    assert "--allow-overlap" in (err.hint or "")
    assert shared_module(venv_python) == "a"
    assert "af-overlap-b" not in installed_dists(venv_python)

    allowed = pip_install(b, runner=runner, python=venv_python, allow_overlap=True)
    assert allowed.overlaps == (Overlap(distribution="af-overlap-a", version="1.0", files=("af_shared/core.py",)),)
    assert shared_module(venv_python) == "b"


@pytest.mark.integration
def test_a_package_of_the_base_interpreter_is_not_overwritten_by_a_venv_install(
    venv_python: str, tmp_path: Path
) -> None:
    """The venv sees the base interpreter's click; pip installs into the venv's own site-packages and overwrites
    none of click's files, but the venv's copy would shadow click there: said as a shadow, never as an overwrite
    (until 2026-12-03 nothing was said, and a wheel shipping torch's files broke such a venv's torch)."""
    wheel = write_wheel(tmp_path / "dist", name="af-shadow", version="1", files={"click/__init__.py": ""})
    found = installed_overlaps(wheel, name="af-shadow", python=venv_python, runner=SubprocessRunner())
    assert found, "the base interpreter's click is on the venv's sys.path"
    assert all(o.shadowed_in is not None and o.files == ("click/__init__.py",) for o in found)


@pytest.mark.integration
def test_the_install_flow_keeps_the_refused_wheel_cached_and_warns_when_allowed(
    venv_python: str, tmp_path: Path
) -> None:
    wheels = pair(tmp_path / "dist")
    store = Store(tmp_path / "home")
    snapshot = SystemSnapshot.load(FIXTURES / "snapshots" / "cpu_dev_torch2.13_cpu.json")
    planner = OrderedPlanner(find_links=tmp_path / "dist", published_sha256={w.name: sha256_file(w) for w in wheels})

    def run(backend: str, *, allow_overlap: bool = False):  # type: ignore[no-untyped-def]
        return install(Request(backend=backend), snapshot=snapshot, store=store, planner=planner,
                       builder=lambda spec, home: None,  # type: ignore[arg-type,return-value]
                       verifier=None, runner=SubprocessRunner(), python=venv_python, allow_overlap=allow_overlap)

    assert run("af-overlap-a").warnings == ()
    with pytest.raises(InstallError, match=r"would overwrite files of af-overlap-a 1\.0"):
        run("af-overlap-b")
    result = run("af-overlap-b", allow_overlap=True)
    assert result.action == "cache-hit"  # the refused wheel was stored on the first try
    [note] = result.warnings
    assert note.startswith("af-overlap-b 2.0 ships af_shared/core.py which af-overlap-a 1.0 installed: "
                           "installing it replaced 1 of af-overlap-a's files")
    assert note.endswith(f"reinstalling restores them: `{venv_python} -m pip install --force-reinstall --no-deps "
                         "af-overlap-a==1.0`")


def test_a_distribution_in_another_site_directory_on_sys_path_is_found_as_shadowed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A --system-site-packages venv sees its base interpreter's torch in another site directory: a wheel that ships
    ``torch/__init__.py`` installed into the venv shadows it, pip overwrites nothing, and the overlap check (absolute
    paths only) passed it; the install said "torch unchanged" and torch no longer imported (a CLI fuzz, 2026-12-03).
    Here the other site directory is a PYTHONPATH entry holding a distribution "victim", and the real script runs in
    this interpreter."""
    import sys

    other = tmp_path / "other-site"
    (other / "victim").mkdir(parents=True)
    (other / "victim" / "__init__.py").write_text("")
    info = other / "victim-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: victim\nVersion: 1.0\n")
    (info / "RECORD").write_text("victim/__init__.py,,\nvictim-1.0.dist-info/METADATA,,\n"
                                 "victim-1.0.dist-info/RECORD,,\n")
    monkeypatch.setenv("PYTHONPATH", str(other))
    wheel = write_wheel(tmp_path, name="w", version="1", files={"victim/__init__.py": "", "w/__init__.py": ""})
    found = installed_overlaps(wheel, name="w", python=sys.executable, runner=SubprocessRunner())
    [shadow] = [o for o in found if o.distribution == "victim"]
    assert shadow == Overlap(distribution="victim", version="1.0", files=("victim/__init__.py",),
                             shadowed_in=str(other.resolve()))
    err = refusal(found, name="w", version="1", installer=Installer(kind="pip", python=sys.executable),
                  protected=frozenset({"victim"}))
    assert err.message == "refusing to install w 1: it would shadow files of victim 1.0"
    assert f"victim 1.0 installed in {other.resolve()}: installing it puts copies of 1 of victim's files" in (
        err.cause or "")
    unguarded = refusal(found, name="w", version="1", installer=Installer(kind="pip", python=sys.executable))
    assert unguarded.message == "refusing to install w 1: it would shadow files of victim 1.0"
    assert "--allow-overlap" in (unguarded.hint or "") and "force-reinstall" not in (unguarded.hint or "")
