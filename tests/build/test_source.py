"""Source fetching, hashing and layout: local trees and archives, pip download at the seam, real git."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from attnforge._system.runner import Completed, SubprocessRunner
from attnforge.build.source import fetch, file_sha256, lay_out, tree_sha256
from attnforge.errors import BuildError, UsageError
from attnforge.fetch.deadline import NetDeadline, command_deadline
from attnforge.resolve.types import SourceKind, SourceSpec
from tests.build._helpers import copy_fixture


def _tree(tmp_path: Path) -> Path:
    return copy_fixture(tmp_path / "tree")


def test_tree_hash_depends_on_content_not_location_or_build_outputs(tmp_path: Path) -> None:
    a = _tree(tmp_path)
    b = tmp_path / "elsewhere" / "copy"
    shutil.copytree(a, b)
    base = tree_sha256(a)
    assert tree_sha256(b) == base
    for junk in (
        "build/temp/x.o",
        "dist/x.whl",
        "af_ext_fixture.egg-info/PKG-INFO",
        ".git/HEAD",
        "af_ext_fixture/__pycache__/x.pyc",
    ):
        (b / junk).parent.mkdir(parents=True, exist_ok=True)
        (b / junk).write_text("noise", encoding="utf-8")
    assert tree_sha256(b) == base, "VCS, caches and top-level build outputs are not the source"
    (b / "af_ext_fixture" / "add.cpp").write_text("// edited\n", encoding="utf-8")
    assert tree_sha256(b) != base
    (b / "af_ext_fixture" / "add.cpp").write_text(
        (a / "af_ext_fixture" / "add.cpp").read_text("utf-8"), "utf-8"
    )
    (b / "setup.py").chmod(0o755)
    assert tree_sha256(b) != base, "the executable bit is part of the tree"


def test_local_directory_is_copied_without_build_outputs(tmp_path: Path) -> None:
    src = _tree(tmp_path)
    (src / "build").mkdir()
    (src / "build" / "stale.o").write_bytes(b"x")
    fetched = fetch(
        SourceSpec(kind=SourceKind.PATH, location=str(src)),
        scratch=tmp_path,
        python="python",
        env={},
        runner=SubprocessRunner(),
    )
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    lay_out(fetched, tmp_path / "out", scratch)
    assert (tmp_path / "out" / "setup.py").is_file()
    assert not (tmp_path / "out" / "build").exists()
    assert fetched.sha256 == tree_sha256(tmp_path / "out")


def _sdist(tmp_path: Path) -> Path:
    archive = tmp_path / "af_ext_fixture-0.1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(_tree(tmp_path), arcname="af_ext_fixture-0.1.0")
    return archive


def test_sdist_unpacks_its_single_top_folder_as_the_tree(tmp_path: Path) -> None:
    archive = _sdist(tmp_path)
    fetched = fetch(
        SourceSpec(kind=SourceKind.PATH, location=str(archive)),
        scratch=tmp_path,
        python="python",
        env={},
        runner=SubprocessRunner(),
    )
    assert fetched.sha256 == file_sha256(archive)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    lay_out(fetched, tmp_path / "out", scratch)
    assert (tmp_path / "out" / "af_ext_fixture" / "add.cpp").is_file()


def test_archive_with_a_path_out_of_the_tree_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "evil-1.0.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("../escaped.txt", "x")
    fetched = fetch(
        SourceSpec(kind=SourceKind.PATH, location=str(archive)),
        scratch=tmp_path,
        python="python",
        env={},
        runner=SubprocessRunner(),
    )
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with pytest.raises(BuildError, match="cannot unpack"):
        lay_out(fetched, tmp_path / "out", scratch)
    assert not (tmp_path / "escaped.txt").exists()
    assert not (tmp_path / "out").exists()


def test_tar_with_a_link_out_of_the_tree_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "evil-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        info = tarfile.TarInfo("evil-1.0/link")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(info, io.BytesIO())
    fetched = fetch(
        SourceSpec(kind=SourceKind.PATH, location=str(archive)),
        scratch=tmp_path,
        python="python",
        env={},
        runner=SubprocessRunner(),
    )
    (tmp_path / "scratch").mkdir()
    with pytest.raises(BuildError):
        lay_out(fetched, tmp_path / "out", tmp_path / "scratch")


@pytest.mark.parametrize(
    "location",
    [pytest.param("does/not/exist", id="missing"), pytest.param("setup.py", id="a-file-not-an-archive")],
)
def test_bad_local_source_is_a_usage_error(location: str, tmp_path: Path) -> None:
    path = tmp_path / location
    if location == "setup.py":
        path.write_text("x", encoding="utf-8")
    with pytest.raises(UsageError):
        fetch(
            SourceSpec(kind=SourceKind.PATH, location=str(path)),
            scratch=tmp_path,
            python="python",
            env={},
            runner=SubprocessRunner(),
        )


class _PipDownload:
    """The runner seam for ``pip download``: writes the sdist where ``--dest`` says, like pip does."""

    def __init__(self, archive: Path | None, returncode: int = 0, stderr: str = "") -> None:
        self.archive, self.returncode, self.stderr = archive, returncode, stderr
        self.argv: list[str] = []

    def run(self, argv: Sequence[str], **_: object) -> Completed:
        if list(argv[1:]) == ["-c", "import pip"]:  # the frontend question: this interpreter has pip
            return Completed(argv=tuple(argv), returncode=0)
        self.argv = list(argv)
        if self.archive is not None:
            dest = Path(argv[argv.index("--dest") + 1])
            shutil.copy(self.archive, dest / self.archive.name)
        return Completed(argv=tuple(argv), returncode=self.returncode, stderr=self.stderr)


def test_pypi_sdist_is_downloaded_without_binaries_or_deps(tmp_path: Path) -> None:
    archive = _sdist(tmp_path)
    runner = _PipDownload(archive)
    (tmp_path / "scratch").mkdir()
    fetched = fetch(
        SourceSpec(kind=SourceKind.PYPI_SDIST, location="af_ext_fixture", version="0.1.0"),
        scratch=tmp_path / "scratch",
        python="/py",
        env={},
        runner=runner,
    )
    assert runner.argv[:3] == ["/py", "-m", "pip"]
    assert {"--no-deps", "--no-binary", ":all:"} <= set(runner.argv)
    assert runner.argv[-1] == "af_ext_fixture==0.1.0"
    assert fetched.sha256 == file_sha256(archive)


def test_pypi_download_failure_carries_pips_words(tmp_path: Path) -> None:
    runner = _PipDownload(
        None, returncode=1, stderr="ERROR: No matching distribution found for af_ext_fixture==9.9"
    )
    (tmp_path / "scratch").mkdir()
    with pytest.raises(BuildError) as info:
        fetch(
            SourceSpec(kind=SourceKind.PYPI_SDIST, location="af_ext_fixture", version="9.9"),
            scratch=tmp_path / "scratch",
            python="py",
            env={},
            runner=runner,
        )
    assert info.value.cause is not None
    assert "No matching distribution" in info.value.cause


def test_pip_is_not_started_for_an_index_behind_a_proxy_that_is_dead_in_this_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A black-holed proxy found dead by the listings of the same command: pip would wait for it again (its
    own 15 s x 5 retries), so the build says why at once."""
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    deadline = NetDeadline()
    deadline.mark_dead("127.0.0.1:9", "no answer from https://api.github.com/... within 10 s")
    runner = _PipDownload(None)
    (tmp_path / "scratch").mkdir()
    with command_deadline(deadline), pytest.raises(BuildError) as info:
        fetch(SourceSpec(kind=SourceKind.PYPI_SDIST, location="flash-attn", version="2.8.3"),
              scratch=tmp_path / "scratch", python="py", env={}, runner=runner)
    assert runner.argv == []
    assert "its index is unreachable" in info.value.message
    assert info.value.cause is not None and "no answer from https://api.github.com" in info.value.cause


@pytest.mark.integration
def test_git_checkout_of_a_tag_hashes_like_the_plain_tree(tmp_path: Path) -> None:
    repo = _tree(tmp_path)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "v1"], check=True)
    subprocess.run([*git, "tag", "v1"], check=True)
    (repo / "later.txt").write_text("after the tag", encoding="utf-8")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "later"], check=True)

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    fetched = fetch(
        SourceSpec(kind=SourceKind.GIT, location=f"file://{repo}", ref="v1"),
        scratch=scratch,
        python="python",
        env=dict(__import__("os").environ),
        runner=SubprocessRunner(),
    )
    lay_out(fetched, tmp_path / "out", scratch)
    assert (tmp_path / "out" / "setup.py").is_file()
    assert not (tmp_path / "out" / "later.txt").exists(), "the tag, not the branch head"
    plain = tmp_path / "plain"
    shutil.copytree(tmp_path / "out", plain, ignore=shutil.ignore_patterns(".git", "later.txt"))
    assert fetched.sha256 == tree_sha256(plain)


@pytest.mark.integration
def test_git_unknown_ref_is_a_build_error_with_gits_words(tmp_path: Path) -> None:
    repo = _tree(tmp_path)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "x",
        ],
        check=True,
    )
    (tmp_path / "scratch").mkdir()
    with pytest.raises(BuildError, match="git could not check out") as info:
        fetch(
            SourceSpec(kind=SourceKind.GIT, location=f"file://{repo}", ref="no-such-ref"),
            scratch=tmp_path / "scratch",
            python="python",
            env=dict(__import__("os").environ),
            runner=SubprocessRunner(),
        )
    assert info.value.cause
