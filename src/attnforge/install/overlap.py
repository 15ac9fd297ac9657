"""Files a wheel would install over files that another installed distribution owns.

pip installs a wheel file by file and records what it wrote in the distribution's ``RECORD``; it never checks
whether another distribution's ``RECORD`` already lists the same path. Two distributions that ship the same
file therefore overwrite each other on install, and uninstalling either deletes the file for both. Seen on the
H200 (``docs/benchmarks.md`` section 7): flash-attn 2.8.3.post2 ships its own ``flash_attn/cute/``, the package
that flash-attn-4 installs; 20 of FA2's 21 ``cute`` files are also in the flash-attn-4 4.0.0b36 wheel, none of
them with the same bytes.

What counts: a regular file of the wheel, at the path it would be installed to (``purelib`` or ``platlib`` for
the wheel's root per its ``Root-Is-Purelib``, ``scripts`` and ``data`` for ``*.data/<scheme>/``), that the
``RECORD`` of a distribution with another name lists at the same absolute path. Directories never count: the
flash-attn-4 wheel has no ``flash_attn/__init__.py`` (``flash_attn`` is a PEP 420 namespace package to it), so
sharing the ``flash_attn/`` directory with flash-attn 2 is by design and not an overlap. A pkgutil-style
namespace ``__init__.py`` shipped by two distributions *is* one (pip overwrites it and an uninstall deletes it).
``*.dist-info/`` entries, ``__pycache__/`` and ``*.data/headers/`` (installed under a directory named after the
distribution) never count.
"""

from __future__ import annotations

import json
import os
import posixpath
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packaging.utils import canonicalize_name

from attnforge._system.runner import Runner
from attnforge.build.frontend import Installer
from attnforge.errors import InstallError
from attnforge.install.wheelfile import read_dist_info

#: Schemes of ``*.data/<scheme>/`` that install to a shared place (``headers`` goes under the distribution's name).
_DATA_SCHEMES = frozenset({"purelib", "platlib", "scripts", "data"})
#: How many example paths a message names.
EXAMPLES = 3

# Runs in the target interpreter (stdlib only). argv: a JSON object scheme -> first path parts of the wheel's
# files there. Prints the interpreter's install roots and, per installed distribution, the absolute paths in its
# RECORD that start with one of those (a coarse filter; the exact match is made by the caller). RECORD is read
# as text and only lines naming one of the parts are parsed: the whole check took 0.4 s against the dev machine's
# 148 distributions (torch's 14.6k-line RECORD included), interpreter start-up included. A distribution installed
# in another site directory on sys.path (a --system-site-packages venv's base interpreter, the user site) whose
# files sit at the same path under it as the wheel's under the install root is listed too, its paths mapped onto
# the root, with "shadowed_in": its directory. Python imports the first copy on sys.path, so the wheel's would hide
# (or be hidden by) that distribution's: a wheel shipping torch/__init__.py broke such a venv's torch, and the
# install said "torch unchanged" (a CLI fuzz, 2026-12-03).
_OWNERS_SCRIPT = """
import csv, importlib.metadata as m, json, os, sys, sysconfig
wanted = json.loads(sys.argv[1])
paths = sysconfig.get_paths()
roots = {s: os.path.realpath(paths[s]) for s in wanted if s in paths}
prefixes = tuple(os.path.join(roots[s], p) for s, parts in wanted.items() if s in roots for p in parts)
needles = {os.path.basename(p) for parts in wanted.values() for p in parts}
libs = {s: os.path.realpath(paths[s]) for s in ("purelib", "platlib") if s in paths}
lib_parts = {p for s in libs for p in wanted.get(s, ())}
site_dirs = {os.path.realpath(p) for p in sys.path if p}
owners = []
for dist in m.distributions():
    try:
        base = os.path.realpath(str(dist.locate_file("")))
        text = dist.read_text("RECORD")
        if text is None:
            rels = [str(p) for p in dist.files or ()]
        else:
            lines = [line for line in text.splitlines() if any(n in line for n in needles)]
            rels = [row[0] for row in csv.reader(lines) if row]
        hits = [f for f in (os.path.normpath(os.path.join(base, r)) for r in rels) if f.startswith(prefixes)]
        shadow = []
        if lib_parts and base in site_dirs and base not in libs.values():
            mine = [r for r in rels if r.replace(os.sep, "/").split("/", 1)[0] in lib_parts]
            shadow = [os.path.normpath(os.path.join(root, r)) for root in set(libs.values()) for r in mine]
    except Exception:
        continue
    name, version = dist.metadata["Name"] or "", dist.version or ""
    if hits:
        owners.append({"name": name, "version": version, "files": hits})
    if shadow:
        owners.append({"name": name, "version": version, "files": shadow, "shadowed_in": base})
print(json.dumps({"roots": roots, "owners": owners}))
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """Where one file of a wheel is installed: a ``sysconfig`` scheme and a ``/``-separated path under it."""

    scheme: str
    path: str

    @property
    def label(self) -> str:
        """How a message names it: the import path for site-packages files, ``scripts/NAME`` for the others."""
        return self.path if self.scheme in ("purelib", "platlib") else f"{self.scheme}/{self.path}"


@dataclass(frozen=True, slots=True, kw_only=True)
class InstalledOwner:
    """An installed distribution and the absolute paths its ``RECORD`` lists (those the query asked about)."""

    name: str
    version: str
    files: tuple[str, ...]
    #: the other site directory the distribution is installed in, its paths here mapped onto the install root
    #: (the wheel's copies would shadow them on sys.path); None for files in the install root itself
    shadowed_in: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Overlap:
    """Files of the wheel that another installed distribution owns.

    Attributes:
        distribution: the other distribution's name, as its metadata spells it.
        version: its installed version.
        files: the shared files, as :attr:`Target.label` names them (``flash_attn/cute/__init__.py``), sorted.
        shadowed_in: where the other distribution's copies are when they sit in another site directory on
            ``sys.path`` (the wheel's would shadow them rather than overwrite them); None in the install root.
    """

    distribution: str
    version: str
    files: tuple[str, ...]
    shadowed_in: str | None = None


def install_targets(names: Iterable[str], *, root_is_purelib: bool) -> tuple[Target, ...]:
    """Map a wheel's member names to where pip installs them (PEP 427's layout).

    Args:
        names: the wheel's members (``ZipFile.namelist()``), ``/``-separated.
        root_is_purelib: the ``Root-Is-Purelib`` field of the wheel's ``WHEEL`` file.

    Returns:
        One target per regular file, in the order given; ``*.dist-info/``, ``__pycache__/``, ``headers`` and
        directory entries are left out.
    """
    root = "purelib" if root_is_purelib else "platlib"
    targets: list[Target] = []
    for name in names:
        parts = PurePosixPath(name).parts
        if name.endswith("/") or not parts or "__pycache__" in parts or parts[0].endswith(".dist-info"):
            continue
        if parts[0].endswith(".data"):
            if len(parts) < 3 or parts[1] not in _DATA_SCHEMES:
                continue
            targets.append(Target(scheme=parts[1], path="/".join(parts[2:])))
        else:
            targets.append(Target(scheme=root, path="/".join(parts)))
    return tuple(targets)


def read_install_targets(wheel: Path) -> tuple[Target, ...]:
    """:func:`install_targets` of a wheel file.

    Raises:
        InstallError: not a readable wheel (no ``*.dist-info/WHEEL``).
    """
    names, fields = read_dist_info(wheel, "WHEEL")
    purelib = str(fields.get("Root-Is-Purelib", "true")).strip().lower() == "true"
    return install_targets(names, root_is_purelib=purelib)


def find_overlaps(
    targets: Sequence[Target],
    *,
    roots: dict[str, str],
    owners: Sequence[InstalledOwner],
    name: str,
) -> tuple[Overlap, ...]:
    """The files of ``targets`` that a distribution other than ``name`` already owns.

    Args:
        targets: where the wheel's files go (:func:`install_targets`).
        roots: scheme -> absolute install directory in the target interpreter.
        owners: installed distributions and the absolute paths their ``RECORD`` lists.
        name: the wheel's distribution (its own files are replaced on purpose: an upgrade or reinstall).

    Returns:
        One :class:`Overlap` per other distribution, most shared files first.
    """
    by_path = {
        os.path.normpath(os.path.join(roots[t.scheme], *t.path.split("/"))): t for t in targets if t.scheme in roots
    }
    own = canonicalize_name(name)
    found: list[Overlap] = []
    for owner in owners:
        if canonicalize_name(owner.name) == own:
            continue
        shared = sorted({by_path[f].label for f in map(os.path.normpath, owner.files) if f in by_path})
        if shared:
            found.append(Overlap(distribution=owner.name, version=owner.version, files=tuple(shared),
                                 shadowed_in=owner.shadowed_in))
    return tuple(sorted(found, key=lambda o: (-len(o.files), canonicalize_name(o.distribution))))


def installed_overlaps(wheel: Path, *, name: str, python: str, runner: Runner) -> tuple[Overlap, ...]:
    """The overlaps of ``wheel`` with what is installed in the interpreter ``python`` (one subprocess).

    Args:
        wheel: the wheel about to be installed.
        name: its distribution name.
        python: the interpreter pip will install into; its ``sysconfig`` paths and installed distributions
            are the ones that count.
        runner: the subprocess seam.

    Raises:
        InstallError: the wheel is unreadable, or the interpreter could not list its distributions.
    """
    targets = read_install_targets(wheel)
    wanted: dict[str, set[str]] = {}
    for t in targets:
        wanted.setdefault(t.scheme, set()).add(t.path.split("/", 1)[0])
    if not wanted:
        return ()
    query = json.dumps({scheme: sorted(parts) for scheme, parts in sorted(wanted.items())})
    done = runner.run([python, "-c", _OWNERS_SCRIPT, query], timeout_s=120)
    try:
        if not done.ok:
            raise ValueError(done.returncode)
        raw = json.loads(done.stdout.strip().splitlines()[-1])
        roots = {str(k): str(v) for k, v in raw["roots"].items()}
        owners = [
            InstalledOwner(name=str(o["name"]), version=str(o["version"]), files=tuple(map(str, o["files"])),
                           shadowed_in=None if o.get("shadowed_in") is None else str(o["shadowed_in"]))
            for o in raw["owners"]
        ]
    except (TypeError, ValueError, KeyError, IndexError, AttributeError):
        tail = "\n".join(done.output.strip().splitlines()[-15:]) or f"exit status {done.returncode}"
        raise InstallError(f"could not read the installed files of {python}", cause=tail) from None
    return find_overlaps(targets, roots=roots, owners=owners, name=name)


def describe(overlap: Overlap, *, name: str, version: str, installed: bool) -> str:
    """One sentence: what ``name`` ships that ``overlap.distribution`` owns, and what installing it does.

    ``installed`` says whether the install already happened (a warning) or is about to (a refusal).
    """
    files = overlap.files
    common = posixpath.commonpath(files) if len(files) > 1 else ""
    where = files[0] if len(files) == 1 else f"{common}/" if common else "files"
    examples = ", ".join(files[:EXAMPLES]) + (", ..." if len(files) > EXAMPLES else "")
    them = "it" if len(files) == 1 else "them"
    if overlap.shadowed_in is not None:
        verb = "installing it put" if installed else "installing it puts"
        return (
            f"{name} {version} ships {where} which {overlap.distribution} {overlap.version} installed in "
            f"{overlap.shadowed_in}: {verb} copies of {len(files)} of {overlap.distribution}'s files ({examples}) in "
            f"another site directory on sys.path, and Python imports whichever comes first"
        )
    verb = "installing it replaced" if installed else "installing it replaces"
    return (
        f"{name} {version} ships {where} which {overlap.distribution} {overlap.version} installed: {verb} "
        f"{len(files)} of {overlap.distribution}'s files ({examples}), and uninstalling either one later "
        f"deletes {them} for both"
    )


def restore_command(overlaps: Sequence[Overlap], *, installer: Installer) -> str:
    """The pip (or uv) command that puts the other distributions' own files back (after an overlapping install)."""
    return shlex.join(installer.argv("install", "--force-reinstall", "--no-deps",
                                     *(f"{o.distribution}=={o.version}" for o in overlaps)))


def warning(overlaps: Sequence[Overlap], *, name: str, version: str, installer: Installer) -> str:
    """What an install allowed to overlap (``--allow-overlap``) tells the user it did, and how to undo it."""
    done = "; ".join(describe(o, name=name, version=version, installed=True) for o in overlaps)
    return f"{done}; reinstalling restores them: `{restore_command(overlaps, installer=installer)}`"


def refusal(
    overlaps: Sequence[Overlap], *, name: str, version: str, installer: Installer,
    protected: frozenset[str] = frozenset(),
) -> InstallError:
    """The error that stops an install whose wheel overlaps another distribution's files.

    An overlap with a ``protected`` distribution (the torch stack) gets no ``--allow-overlap`` way out.
    """
    guarded = [o for o in overlaps if canonicalize_name(o.distribution) in protected]
    if guarded:
        torch = ", ".join(f"{o.distribution} {o.version}" for o in guarded)
        action = "shadow" if all(o.shadowed_in for o in guarded) else "overwrite"
        return InstallError(
            f"refusing to install {name} {version}: it would {action} files of {torch}",
            cause="; ".join(describe(o, name=name, version=version, installed=False) for o in guarded),
            hint="attnforge never changes the torch stack, not even with --allow-overlap; a wheel that ships "
            "torch's own files is broken or mislabelled: get another build of it",
        )
    others = ", ".join(f"{o.distribution} {o.version}" for o in overlaps)
    if all(o.shadowed_in for o in overlaps):  # nothing is overwritten: reinstalling the others would not undo it
        return InstallError(
            f"refusing to install {name} {version}: it would shadow files of {others}",
            cause="; ".join(describe(o, name=name, version=version, installed=False) for o in overlaps),
            hint="install into an environment that does not see them (a venv without --system-site-packages), or "
            "rerun with --allow-overlap to install it anyway",
        )
    restore = restore_command(overlaps, installer=installer)
    uninstall = shlex.join(installer.argv("uninstall", *(o.distribution for o in overlaps)))
    return InstallError(
        f"refusing to install {name} {version}: it would overwrite files of {others}",
        cause="; ".join(describe(o, name=name, version=version, installed=False) for o in overlaps),
        hint=f"rerun with --allow-overlap to install it anyway (it replaces those files; reinstalling "
        f"afterwards restores them: `{restore}`), or first "
        f"`{uninstall}` if you no longer need "
        f"{'it' if len(overlaps) == 1 else 'them'}",
    )
