"""Getting a source tree to build: an sdist from the package index, a local sdist or directory, a git
checkout.

Each source gets a sha256 that names exactly what was built: the archive's bytes, or for a directory or a git
checkout a deterministic tree hash (sorted relative POSIX paths, each file's sha256 and executable bit; VCS
and build-output folders left out), so the same tree hashes the same wherever it lives.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import stat
import tarfile
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from attnforge._system.runner import Runner
from attnforge.build.frontend import installer_for
from attnforge.errors import BuildError, InstallError, UsageError
from attnforge.fetch.deadline import current_deadline
from attnforge.fetch.download import stream
from attnforge.fetch.http import shown
from attnforge.resolve.types import SourceKind, SourceSpec

#: Never part of a tree hash or a copied tree, at any depth.
_SKIP_ANYWHERE = frozenset(
    {".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
)
# : Build outputs skipped at the top of a tree only (a package may have a ``build/`` folder of its own deeper
# down).
_SKIP_TOP = frozenset({"build", "dist", ".eggs"})
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar", ".zip")
_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchedSource:
    """A source ready to lay out under the build root.

    Attributes:
        sha256: hex digest of the archive, or the tree hash of a directory / checkout.
        archive: the downloaded or given sdist archive, when the source is one.
        tree: the directory holding the tree, when the source is one (a local dir or a fresh checkout).
        description: what it was, for logs (``flash-attn==2.8.3 (PyPI sdist)``).
    """

    sha256: str
    archive: Path | None
    tree: Path | None
    description: str


def is_archive(path: Path) -> bool:
    return path.name.lower().endswith(_ARCHIVE_SUFFIXES)


#: what makes a directory a project pip can build (pip: "Neither 'setup.py' nor 'pyproject.toml' found")
PROJECT_FILES = ("setup.py", "pyproject.toml")


def local_source_problem(source: SourceSpec) -> str | None:
    """Why a local ``source`` (a path) cannot be built, before anything is read or staged: a missing path, a file
    that is not an sdist archive, a directory (or its ``#subdirectory=``) holding neither ``setup.py`` nor
    ``pyproject.toml``; None when it can be tried, and for a git repository or a URL (fetched later)."""
    if source.kind is not SourceKind.PATH:
        return None
    path = Path(source.location)
    if not path.exists():
        return f"{path}: no such file or directory"
    if path.is_file():
        kinds = ", ".join(_ARCHIVE_SUFFIXES)
        return None if is_archive(path) else f"{path} is a file but not an sdist archive ({kinds})"
    if not path.is_dir():  # a device, a FIFO, a socket (/dev/zero: "has no subdirectory None", CLI fuzz 2026-12-03)
        return f"{path} is neither a folder nor an sdist archive"
    tree = path / source.subdirectory if source.subdirectory else path
    if not tree.is_dir():
        return f"{path} has no subdirectory {source.subdirectory}"
    if not any((tree / name).is_file() for name in PROJECT_FILES):
        return f"{tree} is not a Python project: it holds neither {' nor '.join(PROJECT_FILES)}"
    return None


def parse_source(text: str) -> SourceSpec:
    """``--source`` text of every verb (build, install, plan) -> :class:`SourceSpec`. The one parser.

    Forms (pip's syntax): ``PATH`` (a directory or an sdist archive), ``PATH#subdirectory=DIR``,
    ``https://.../name-1.0.tar.gz`` (an sdist URL), ``git+URL[@REF][#subdirectory=DIR]`` and ``URL.git[@REF]``.
    A fragment may also carry ``egg=NAME`` (ignored, as pip does); ``subdirectory`` is relative and stays inside
    the tree. The whole repository is staged and the build runs in the subdirectory.

    Raises:
        UsageError: an unknown fragment key, a subdirectory that leaves the tree, or a URL that is neither a git
            repository nor an sdist archive.
    """
    body, _, fragment = text.strip().partition("#")
    subdirectory = _subdirectory(text, fragment)
    if body.startswith("git+") or body.endswith(".git") or ".git@" in body:
        url = body.removeprefix("git+")
        scheme, sep, rest = url.partition("://")
        ref = None
        if "@" in rest.rsplit("/", 1)[-1]:
            rest, _, ref = rest.rpartition("@")
        return SourceSpec(kind=SourceKind.GIT, location=f"{scheme}{sep}{rest}", ref=ref or None,
                          subdirectory=subdirectory)
    if "://" in body:
        if not body.startswith(("http://", "https://")) or not is_archive(Path(body.split("?", 1)[0])):
            raise UsageError(f"{text} is neither a git repository nor an sdist archive",
                             hint="use git+URL@REF for a repository, or a URL ending in .tar.gz / .zip")
        return SourceSpec(kind=SourceKind.URL, location=body, subdirectory=subdirectory)
    if not body:
        raise UsageError(f"--source {text!r} names no path or URL", hint="write e.g. --source ./flash-attention")
    from attnforge._system.files import resolve_user_path

    location = resolve_user_path(Path(body), what="--source", hint="give a source tree or an sdist archive")
    return SourceSpec(kind=SourceKind.PATH, location=str(location), subdirectory=subdirectory)


def _subdirectory(text: str, fragment: str) -> str | None:
    subdirectory = None
    for part in filter(None, fragment.split("&")):
        key, eq, value = part.partition("=")
        if key == "subdirectory" and eq and value.rstrip("/"):
            subdirectory = value.rstrip("/")
        elif key != "egg":
            raise UsageError(f"--source {text!r}: unknown fragment {part!r}",
                             hint="the fragment may carry subdirectory=DIR (and egg=NAME), e.g. "
                                  "--source ./flash-attention#subdirectory=hopper")
    if subdirectory is not None and (Path(subdirectory).is_absolute() or ".." in Path(subdirectory).parts
                                     or "\\" in subdirectory):
        raise UsageError(f"--source {text!r}: subdirectory {subdirectory!r} leaves the source tree",
                         hint="give a path relative to the repository root, e.g. #subdirectory=hopper")
    return subdirectory


def check_submodules(tree: Path, submodules: tuple[str, ...], *, where: str) -> None:
    """Refuse a tree whose git submodules (``csrc/cutlass`` for FlashAttention-3) are missing or empty.

    Raises:
        UsageError: one is missing; the hint is the ``git submodule update --init`` command that fixes it.
    """
    missing = [m for m in submodules if not (tree / m).is_dir() or not any((tree / m).iterdir())]
    if missing:
        raise UsageError(
            f"{where} lacks its git submodule(s) {', '.join(missing)} (missing or empty)",
            cause="the build includes headers from them; a clone without --recurse-submodules leaves them empty",
            hint=f"git -C {tree} submodule update --init {' '.join(missing)}  "
                 "(or clone with git clone --recurse-submodules)",
        )


def fetch(
    source: SourceSpec, *, scratch: Path, python: str, env: Mapping[str, str], runner: Runner
) -> FetchedSource:
    """Get the source into ``scratch`` (or point at it in place) and hash it.

    Args:
        source: what to fetch.
        scratch: an empty private directory for downloads and clones.
        python: the interpreter whose pip downloads sdists.
        env: the build environment (pip and git read their settings, proxies and indexes from it).
        runner: the subprocess seam.

    Raises:
        UsageError: a local path that does not exist or is neither a directory nor an sdist archive.
        BuildError: the download or clone failed (pip's or git's own words in ``cause``).
    """
    if source.kind is SourceKind.PATH:
        path = Path(source.location).expanduser().resolve()
        if path.is_dir():
            check_submodules(path, source.submodules, where=f"the source tree {path}")
            return FetchedSource(sha256=tree_sha256(path), archive=None, tree=path,
                                 description=f"{path} (directory)")
        if path.is_file() and is_archive(path):
            return FetchedSource(sha256=file_sha256(path), archive=path, tree=None,
                                 description=f"{path} (sdist)")
        raise UsageError(f"source {source.location!r} is neither a directory nor an sdist archive",
                         hint="give a source tree with setup.py or pyproject.toml, or a .tar.gz / .zip sdist")
    if source.kind is SourceKind.PYPI_SDIST:
        return _pip_download(source, scratch=scratch, python=python, env=env, runner=runner)
    if source.kind is SourceKind.GIT:
        return _git_checkout(source, scratch=scratch, env=env, runner=runner)
    return _url_download(source, scratch=scratch)


def local_sha256(source: SourceSpec) -> str | None:
    """The sha256 :func:`fetch` gives a local source (a directory's tree hash, an sdist's bytes), computed without
    fetching, so a plan can find the build of these exact bytes in the cache; None for a remote source (its bytes
    are known only once fetched) or a path that is neither a directory nor an sdist archive."""
    if source.kind is not SourceKind.PATH:
        return None
    path = Path(source.location).expanduser().resolve()
    if path.is_dir():
        return tree_sha256(path)
    return file_sha256(path) if path.is_file() and is_archive(path) else None


def _pip_download(
    source: SourceSpec, *, scratch: Path, python: str, env: Mapping[str, str], runner: Runner
) -> FetchedSource:
    requirement = source.requirement()  # a range: pip takes its newest sdist, or lists the versions it saw
    index = env.get("PIP_INDEX_URL") or "https://pypi.org/simple/"
    dead = current_deadline().dead_for(index)  # pip would wait its own minutes for the same dead proxy
    if dead is not None:
        raise BuildError(f"could not download the sdist of {requirement}: its index is unreachable",
                         cause=dead, hint="fix the proxy (HTTPS_PROXY/NO_PROXY) or the network, or download the "
                                          "sdist elsewhere and pass --source PATH")
    dest = scratch / "download"
    dest.mkdir()
    installer = installer_for(python, runner=runner)
    argv = installer.download_argv("--no-deps", "--no-binary", ":all:", "--disable-pip-version-check", "--dest",
                                   str(dest), requirement)
    done = runner.run(argv, env=env, timeout_s=1800)
    archives = sorted(p for p in dest.iterdir() if is_archive(p))
    if not done.ok or len(archives) != 1:
        raise BuildError(f"could not download the sdist of {requirement}",
                         cause=_last_lines(done.output) or f"pip left {len(archives)} archives in {dest}",
                         hint="check the name and version: " + shlex.join(
                             installer.download_argv("--no-deps", "--no-binary", ":all:", requirement)))
    return FetchedSource(sha256=file_sha256(archives[0]), archive=archives[0], tree=None,
                         description=f"{requirement} (sdist from the package index)")


def _git_checkout(
    source: SourceSpec, *, scratch: Path, env: Mapping[str, str], runner: Runner
) -> FetchedSource:
    tree = scratch / "checkout"
    ref = source.ref or "HEAD"
    git_env = {**env, "GIT_TERMINAL_PROMPT": "0"}
    steps = [
        ["git", "init", "--quiet", str(tree)],
        ["git", "-C", str(tree), "remote", "add", "origin", source.location],
        ["git", "-C", str(tree), "fetch", "--quiet", "--depth", "1", "origin", ref],
        ["git", "-C", str(tree), "checkout", "--quiet", "FETCH_HEAD"],
        ["git", "-C", str(tree), "submodule", "update", "--quiet", "--init", "--recursive", "--depth", "1"],
    ]
    for argv in steps:
        done = runner.run(argv, env=git_env, timeout_s=3600)
        if not done.ok:
            raise BuildError(f"git could not check out {source.location}@{ref}",
                             cause=_last_lines(done.output) or f"{' '.join(argv)} exited {done.returncode}",
                             hint=f"check the URL and ref: git ls-remote {source.location} {ref}")
    check_submodules(tree, source.submodules, where=f"the checkout of {source.location}@{ref}")
    return FetchedSource(sha256=tree_sha256(tree), archive=None, tree=tree,
                         description=f"{source.location}@{ref} (git)")


def _url_download(source: SourceSpec, *, scratch: Path) -> FetchedSource:
    name = source.location.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0] or "source.tar.gz"
    if not is_archive(Path(name)):
        raise UsageError(f"{source.location} does not name an sdist archive",
                         hint="give a URL ending in .tar.gz or .zip, or a git URL with --source git+URL@REF")
    target = scratch / name
    try:  # the one HTTP client: proxies, the command's network deadline, credentials kept out of messages
        sha256 = stream(source.location, target, progress=False)  # the build shows its own progress
    except InstallError as exc:
        raise BuildError(f"could not download the source {shown(source.location)}", cause=exc.cause,
                         hint="check the network or proxy (https_proxy), or download the sdist and pass "
                              "--source PATH") from None
    return FetchedSource(sha256=sha256, archive=target, tree=None, description=shown(source.location))


def lay_out(fetched: FetchedSource, dest: Path, scratch: Path) -> None:
    """Put the source tree at ``dest`` (which must not exist): unpack the archive or copy the tree.

    The tree is assembled in ``scratch`` and moved into place with one rename, so ``dest`` is either absent or
    complete. An sdist's single top-level folder (``name-1.0/``) becomes ``dest`` itself.

    Raises:
        BuildError: the archive is corrupt or holds unsafe paths (absolute, ``..``, links out of the tree).
    """
    staged = scratch / "tree"
    if fetched.archive is not None:
        unpacked = scratch / "unpacked"
        unpacked.mkdir()
        _unpack(fetched.archive, unpacked)
        entries = list(unpacked.iterdir())
        root = entries[0] if len(entries) == 1 and entries[0].is_dir() else unpacked
        os.replace(root, staged)
    elif fetched.tree is not None:
        if fetched.tree.is_relative_to(scratch):  # a fresh checkout: move, do not copy
            os.replace(fetched.tree, staged)
        else:
            shutil.copytree(fetched.tree, staged, symlinks=True, ignore=_copy_ignore(fetched.tree))
    os.replace(staged, dest)


def _unpack(archive: Path, dest: Path) -> None:
    try:
        if archive.name.lower().endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                for member in zf.namelist():
                    _check_member(member)
                zf.extractall(dest)  # noqa: S202 - every member checked above
        else:
            with tarfile.open(archive) as tf:
                if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4 refuses unsafe members
                    tf.extractall(dest, filter="data")
                else:  # pragma: no cover - older patch releases
                    for info in tf.getmembers():
                        _check_member(info.name)
                        if info.issym() or info.islnk():
                            _check_member(info.linkname)
                    tf.extractall(dest)  # noqa: S202 - every member checked above
    except (tarfile.TarError, zipfile.BadZipFile, OSError, ValueError) as exc:
        raise BuildError(f"cannot unpack {archive.name}", cause=str(exc),
                         hint="download it again; the archive is corrupt or holds unsafe paths") from None


def _check_member(name: str) -> None:
    parts = Path(name).parts
    if name.startswith(("/", "\\")) or ".." in parts:
        raise ValueError(f"unsafe path in archive: {name}")


def _copy_ignore(top: Path) -> Callable[[str, list[str]], set[str]]:
    def ignore(directory: str, names: list[str]) -> set[str]:
        at_top = Path(directory) == top
        return {n for n in names if _skipped(n, at_top=at_top)}

    return ignore


def _skipped(name: str, *, at_top: bool) -> bool:
    if name in _SKIP_ANYWHERE or name.endswith(".pyc"):
        return True
    return at_top and (name in _SKIP_TOP or name.endswith(".egg-info"))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def tree_sha256(top: Path) -> str:
    """A deterministic hash of a source tree.

    Each file contributes ``relative/posix/path``, ``x`` or ``-`` for its executable bit, and its content's
    sha256; symlinks contribute their target text. VCS folders, caches and top-level build outputs are
    skipped.
    """
    digest = hashlib.sha256()
    for rel, path in _walk(top):
        if path.is_symlink():
            digest.update(f"L {rel} {os.readlink(path)}\n".encode())
            continue
        mode = path.stat().st_mode
        flag = "x" if mode & stat.S_IXUSR else "-"
        digest.update(f"F {rel} {flag} {file_sha256(path)}\n".encode())
    return digest.hexdigest()


def _walk(top: Path) -> Iterator[tuple[str, Path]]:
    entries: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(top):
        at_top = Path(dirpath) == top
        dirnames[:] = [d for d in dirnames if not _skipped(d, at_top=at_top)]
        for name in filenames:
            if _skipped(name, at_top=at_top):
                continue
            path = Path(dirpath, name)
            entries.append((path.relative_to(top).as_posix(), path))
    yield from sorted(entries)


def _last_lines(text: str, count: int = 6) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-count:])
