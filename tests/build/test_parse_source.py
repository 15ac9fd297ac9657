"""One ``--source`` parser for every verb: each form, its errors, and that build and install take the same strings."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnforge.build import source as source_mod
from attnforge.build.source import check_submodules, parse_source
from attnforge.catalog import load_catalog
from attnforge.cli import main
from attnforge.errors import UsageError
from attnforge.resolve.buildspec import default_source
from attnforge.resolve.types import Request, SourceKind, SourceSpec

GIT = SourceKind.GIT
FA = "https://github.com/Dao-AILab/flash-attention"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("/src/fa", SourceSpec(kind=SourceKind.PATH, location="/src/fa"), id="path"),
        pytest.param("/src/fa#subdirectory=hopper",
                     SourceSpec(kind=SourceKind.PATH, location="/src/fa", subdirectory="hopper"), id="path-subdir"),
        pytest.param("/src/fa/#subdirectory=hopper/",
                     SourceSpec(kind=SourceKind.PATH, location="/src/fa", subdirectory="hopper"), id="slashes"),
        pytest.param("/w/flash_attn-2.8.3.tar.gz",
                     SourceSpec(kind=SourceKind.PATH, location="/w/flash_attn-2.8.3.tar.gz"), id="sdist"),
        pytest.param("https://example.org/mamba_ssm-2.2.4.tar.gz",
                     SourceSpec(kind=SourceKind.URL, location="https://example.org/mamba_ssm-2.2.4.tar.gz"), id="url"),
        pytest.param(f"git+{FA}@v2.8.3", SourceSpec(kind=GIT, location=FA, ref="v2.8.3"), id="git-ref"),
        pytest.param(f"git+{FA}.git", SourceSpec(kind=GIT, location=f"{FA}.git"), id="git-no-ref"),
        pytest.param(f"git+{FA}@main#subdirectory=hopper",
                     SourceSpec(kind=GIT, location=FA, ref="main", subdirectory="hopper"), id="git-ref-subdir"),
        pytest.param(f"git+{FA}#egg=flash_attn_3&subdirectory=hopper",
                     SourceSpec(kind=GIT, location=FA, subdirectory="hopper"), id="git-egg-subdir"),
        pytest.param("https://github.com/NVIDIA/apex.git", SourceSpec(kind=GIT, location="https://github.com/NVIDIA/apex.git"),
                     id="dot-git"),
        pytest.param("git+file:///srv/fa@abc123#subdirectory=hopper",
                     SourceSpec(kind=GIT, location="file:///srv/fa", ref="abc123", subdirectory="hopper"),
                     id="git-file"),
    ],
)
def test_every_source_form(text: str, expected: SourceSpec) -> None:
    assert parse_source(text) == expected


def test_a_relative_path_becomes_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_source("fa#subdirectory=hopper").location == str(tmp_path / "fa")


@pytest.mark.parametrize(
    "text",
    ["https://example.org/page.html", "/src/fa#subdirectory=../etc", "/src/fa#subdirectory=/abs",
     "/src/fa#branch=main", "ftp://example.org/x.tar.gz", "#subdirectory=hopper"],
)
def test_bad_sources_are_bad_usage(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_source(text)
    assert info.value.hint


@pytest.mark.parametrize("text", ["REPO#subdirectory=hopper", f"git+{FA}@main#subdirectory=hopper", "REPO"])
def test_build_and_install_accept_the_same_strings(
    text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    attnforge_home: Path,
) -> None:
    text = text.replace("REPO", str(tmp_path))
    seen: list[SourceSpec] = []

    def spy(value: str) -> SourceSpec:
        seen.append(parse_source(value))
        raise UsageError("stopped after parsing", hint="test")

    monkeypatch.setattr(source_mod, "parse_source", spy)
    assert main(["build", "flash-attn-3", "--source", text]) == 2
    assert main(["install", "flash-attn-3", "--source", text]) == 2
    assert capsys.readouterr().err.count("stopped after parsing") == 2
    assert len(seen) == 2 and seen[0] == seen[1] == parse_source(text)


def test_both_verbs_refuse_a_bad_source_the_same_way(
    capsys: pytest.CaptureFixture[str], attnforge_home: Path
) -> None:
    assert main(["build", "x", "--source", "/src/fa#subdirectory=../up"]) == 2
    assert main(["install", "x", "--source", "/src/fa#subdirectory=../up"]) == 2
    err = capsys.readouterr().err
    assert err.count("leaves the source tree") == 2 and "Traceback" not in err


def test_the_hopper_directory_itself_becomes_its_repository_with_a_subdirectory() -> None:
    recipe = load_catalog().recipes["flash-attn-3"]
    got = default_source(recipe, Request(backend="flash-attn-3", source=parse_source("/src/fa/hopper")))
    assert (got.location, got.subdirectory, got.submodules) == ("/src/fa", "hopper", ("csrc/cutlass",))


def test_a_missing_submodule_is_refused_with_the_command_that_fixes_it(tmp_path: Path) -> None:
    (tmp_path / "hopper").mkdir()
    (tmp_path / "csrc" / "cutlass").mkdir(parents=True)  # present but empty, as after a plain clone
    with pytest.raises(UsageError) as info:
        check_submodules(tmp_path, ("csrc/cutlass",), where="the source tree")
    assert "csrc/cutlass" in info.value.message
    assert info.value.hint == f"git -C {tmp_path} submodule update --init csrc/cutlass  " \
        "(or clone with git clone --recurse-submodules)"
    (tmp_path / "csrc" / "cutlass" / "include").mkdir()
    check_submodules(tmp_path, ("csrc/cutlass",), where="the source tree")  # filled: accepted


def test_fetch_refuses_a_local_tree_without_its_submodule(tmp_path: Path) -> None:
    from attnforge._system.runner import SubprocessRunner

    (tmp_path / "hopper").mkdir()
    spec = SourceSpec(kind=SourceKind.PATH, location=str(tmp_path), subdirectory="hopper",
                      submodules=("csrc/cutlass",))
    with pytest.raises(UsageError, match="submodule"):
        source_mod.fetch(spec, scratch=tmp_path / "s", python="python", env={}, runner=SubprocessRunner())


def test_a_local_source_that_pip_could_not_build_is_named_before_anything_runs(tmp_path: Path) -> None:
    """pip's "Neither 'setup.py' nor 'pyproject.toml' found", said before the preflight (which spoke of CUDA for an
    empty directory): a missing path, a file that is not an sdist, a directory or #subdirectory= with no project
    file. A project directory, an sdist and a git source pass (a git tree is read once fetched)."""
    from attnforge.build.source import local_source_problem

    (tmp_path / "empty").mkdir()
    (tmp_path / "repo" / "hopper").mkdir(parents=True)
    (tmp_path / "repo" / "hopper" / "setup.py").write_text("")
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "x-1.0.tar.gz").write_bytes(b"")
    problems = {text: local_source_problem(parse_source(str(tmp_path / text))) for text in
                ("missing", "empty", "notes.txt", "repo", "repo#subdirectory=csrc", "repo#subdirectory=hopper",
                 "x-1.0.tar.gz")}
    assert "no such file or directory" in str(problems["missing"])
    assert "neither setup.py nor pyproject.toml" in str(problems["empty"])
    assert "not an sdist archive" in str(problems["notes.txt"])
    assert "neither setup.py" in str(problems["repo"])  # the project is in its subdirectory
    assert "no subdirectory csrc" in str(problems["repo#subdirectory=csrc"])
    assert problems["repo#subdirectory=hopper"] is None and problems["x-1.0.tar.gz"] is None
    assert local_source_problem(parse_source("git+https://github.com/Dao-AILab/flash-attention@v2.8.3")) is None
